"""`import regroup.distributed` registers torch.distributed's "regroup" backend:

    import regroup.distributed
    torch.distributed.init_process_group("regroup")   # rank and world size from the launcher

Collectives (all_reduce with SUM, AVG, PRODUCT, MIN, MAX; broadcast, all_gather,
reduce_scatter, barrier, send/recv) run on libregroup's UCX group of the worker's round, CPU
tensors of float32, float64, float16, bfloat16, int32, int64 or uint8. A dead peer makes the
call raise within the group's detection time (about 0.1 s on one host), a silent one at the
call's timeout (the group's default, $REGROUP_COMM_TIMEOUT_MS or 30 s): never a hang. Each
call completes before it returns (async_op=True gives a completed work). For recovery in
place with no code of your own, use regroup.train (TorchTrainer, prepare_model)."""

from ._c10d import register as _register

_register()

__all__ = []
