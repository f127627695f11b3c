/*
 * The `regroup` backend of torch.distributed (torch 1.13's c10d::ProcessGroup): a thin shim
 * over the worker context's UCX group (rg_train_comm), so that init_process_group("regroup")
 * and DDP run on libregroup's collectives, whose dead-peer detection and deadlines turn a
 * failure into an error, never a hang.
 *
 * Design:
 * - A group object is made for one round of one context (rank and size are fixed in c10d's
 *   ProcessGroup); every operation fetches the context's current UCX group and refuses to run
 *   once the context has moved to another round (the job regrouped: the Python layer makes a
 *   new default group then). A group made with no context is a group of one rank, whose
 *   collectives copy locally: DDP is built over one so that building it makes no collective
 *   (a replacement builds its model while the others train).
 * - Operations run synchronously on the calling thread (a context belongs to one thread:
 *   the library's groups are not thread-safe) and return a completed Work; a failure throws
 *   at the call, with the library's status name and message.
 * - CPU tensors only: this torch has no CUDA, and libregroup's device path needs a UCX that
 *   moves device memory; a tensor on another device is refused with a message naming it.
 *
 * This is the only folder that includes torch's headers.
 */
#include <regroup/comm.h>
#include <regroup/status.h>
#include <regroup/train.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/python.h>
#include <pybind11/chrono.h>

#include <cstring>
#include <string>

namespace {

/* The Work of an operation that has finished by the time it is returned. */
class DoneWork : public c10d::Work {
  public:
    DoneWork(int rank, c10d::OpType op, std::vector<at::Tensor> out)
        : c10d::Work(rank, op), out_(std::move(out)),
          fut_(c10::make_intrusive<c10::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get())))
    {
        fut_->markCompleted(c10::IValue(out_));
        finish();
    }
    bool isCompleted() override { return true; }
    bool isSuccess() const override { return true; }
    bool wait(std::chrono::milliseconds) override { return true; }
    std::vector<at::Tensor> result() override { return out_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return fut_; }

  private:
    std::vector<at::Tensor> out_;
    c10::intrusive_ptr<c10::ivalue::Future> fut_;
};

rg_dtype_t to_rg_dtype(const at::Tensor &t, const char *what)
{
    switch (t.scalar_type()) {
    case at::kFloat: return RG_DTYPE_F32;
    case at::kDouble: return RG_DTYPE_F64;
    case at::kHalf: return RG_DTYPE_F16;
    case at::kBFloat16: return RG_DTYPE_BF16;
    case at::kInt: return RG_DTYPE_I32;
    case at::kLong: return RG_DTYPE_I64;
    case at::kByte: return RG_DTYPE_U8;
    default:
        TORCH_CHECK(false, "regroup backend: ", what, ": dtype ", t.scalar_type(),
                    " is not supported (float32, float64, float16, bfloat16, int32, int64, "
                    "uint8)");
    }
    return RG_DTYPE_U8; /* not reached */
}

rg_redop_t to_rg_op(const c10d::ReduceOp &op, const at::Tensor &t)
{
    switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM: return RG_OP_SUM;
    case c10d::ReduceOp::AVG:
        TORCH_CHECK(at::isFloatingType(t.scalar_type()),
                    "regroup backend: ReduceOp.AVG on a ", t.scalar_type(),
                    " tensor: floating types only");
        return RG_OP_AVG;
    case c10d::ReduceOp::PRODUCT: return RG_OP_PROD;
    case c10d::ReduceOp::MIN: return RG_OP_MIN;
    case c10d::ReduceOp::MAX: return RG_OP_MAX;
    default:
        TORCH_CHECK(false, "regroup backend: reduce op ", static_cast<int>(op),
                    " is not supported (SUM, AVG, PRODUCT, MIN, MAX)");
    }
    return RG_OP_SUM; /* not reached */
}

void check_tensor(const at::Tensor &t, const char *what)
{
    TORCH_CHECK(t.device().is_cpu(), "regroup backend: ", what, " is on ", t.device(),
                ": this build serves CPU tensors only");
    TORCH_CHECK(t.is_contiguous(), "regroup backend: ", what, " is not contiguous");
    TORCH_CHECK(!t.is_sparse(), "regroup backend: ", what, " is sparse");
}

class ProcessGroupRegroup : public c10d::ProcessGroup {
  public:
    /* ctx: the worker's rg_train_ctx_t (an address from Python), or 0 for a group of one
     * rank that needs no peer. round: the context's round this group is for. */
    ProcessGroupRegroup(uintptr_t ctx, int rank, int size, int round)
        : c10d::ProcessGroup(rank, size), ctx_(reinterpret_cast<rg_train_ctx_t *>(ctx)),
          round_(round)
    {
        TORCH_CHECK(ctx_ != nullptr || (rank == 0 && size == 1),
                    "regroup backend: a group without a context has one rank");
        if (ctx_ != nullptr) {
            TORCH_CHECK(rg_train_round(ctx_) == round && rg_train_rank(ctx_) == rank &&
                            rg_train_world_size(ctx_) == size,
                        "regroup backend: rank ", rank, " of ", size, " in round ", round,
                        ", but this worker is rank ", rg_train_rank(ctx_), " of ",
                        rg_train_world_size(ctx_), " in round ", rg_train_round(ctx_),
                        " (the regroup backend takes its rank and world size from the "
                        "launcher)");
        }
    }

    const std::string getBackendName() const override { return "regroup"; }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override
    {
        TORCH_CHECK(opts.rootTensor == 0, "regroup backend: one tensor per rank");
        TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(),
                    "regroup backend: broadcast root ", opts.rootRank, " of ", getSize());
        for (auto &t : tensors) {
            check_tensor(t, "broadcast's tensor");
            if (rg_comm_t *c = comm()) {
                rg_comm_opts_t o = comm_opts(opts.timeout);
                check(rg_comm_broadcast(c, t.data_ptr(), t.numel(),
                                        to_rg_dtype(t, "broadcast"), (int)opts.rootRank, &o),
                      "broadcast");
            }
        }
        return done(c10d::OpType::BROADCAST, tensors);
    }

    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override
    {
        for (auto &t : tensors) {
            check_tensor(t, "allreduce's tensor");
            rg_redop_t op = to_rg_op(opts.reduceOp, t);
            if (rg_comm_t *c = comm()) {
                rg_comm_opts_t o = comm_opts(opts.timeout);
                check(rg_comm_allreduce(c, RG_COMM_IN_PLACE, t.data_ptr(), t.numel(),
                                        to_rg_dtype(t, "allreduce"), op, &o),
                      "allreduce");
            }
        }
        return done(c10d::OpType::ALLREDUCE, tensors);
    }

    c10::intrusive_ptr<c10d::Work>
    allreduce_coalesced(std::vector<at::Tensor> &tensors,
                        const c10d::AllreduceCoalescedOptions &opts) override
    {
        c10d::AllreduceOptions o;
        o.reduceOp = opts.reduceOp;
        o.timeout = opts.timeout;
        return allreduce(tensors, o);
    }

    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions &opts) override
    {
        TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1,
                    "regroup backend: allgather takes one input tensor per rank");
        at::Tensor &in = inputs[0];
        check_tensor(in, "allgather's input");
        TORCH_CHECK((int)outputs[0].size() == getSize(), "regroup backend: allgather: ",
                    outputs[0].size(), " output tensors for a world of ", getSize());
        for (auto &o : outputs[0]) {
            TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                        "regroup backend: allgather: an output tensor differs from the "
                        "input in size or dtype");
            TORCH_CHECK(o.device().is_cpu(), "regroup backend: allgather's output is on ",
                        o.device(), ": this build serves CPU tensors only");
        }
        at::Tensor flat = at::empty({(int64_t)getSize() * in.numel()}, in.options());
        gather_into(flat, in, opts.timeout);
        for (int r = 0; r < getSize(); r++) {
            outputs[0][r].view({-1}).copy_(flat.narrow(0, r * in.numel(), in.numel()));
        }
        return done(c10d::OpType::ALLGATHER, outputs[0]);
    }

    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions &opts) override
    {
        check_tensor(input, "allgather's input");
        check_tensor(output, "allgather's output");
        TORCH_CHECK(output.numel() == input.numel() * getSize() &&
                        output.scalar_type() == input.scalar_type(),
                    "regroup backend: allgather: the output is not world size x the input");
        gather_into(output, input, opts.timeout);
        return done(c10d::OpType::_ALLGATHER_BASE, {output});
    }

    c10::intrusive_ptr<c10d::Work>
    reduce_scatter(std::vector<at::Tensor> &outputs,
                   std::vector<std::vector<at::Tensor>> &inputs,
                   const c10d::ReduceScatterOptions &opts) override
    {
        TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1,
                    "regroup backend: reduce_scatter takes one output tensor per rank");
        at::Tensor &out = outputs[0];
        check_tensor(out, "reduce_scatter's output");
        TORCH_CHECK((int)inputs[0].size() == getSize(), "regroup backend: reduce_scatter: ",
                    inputs[0].size(), " input tensors for a world of ", getSize());
        std::vector<at::Tensor> flat_in;
        for (auto &t : inputs[0]) {
            TORCH_CHECK(t.numel() == out.numel() && t.scalar_type() == out.scalar_type(),
                        "regroup backend: reduce_scatter: an input differs from the output "
                        "in size or dtype");
            flat_in.push_back(t.reshape({-1}));
        }
        at::Tensor in = at::cat(flat_in);
        scatter_into(out, in, opts);
        return done(c10d::OpType::REDUCE_SCATTER, outputs);
    }

    c10::intrusive_ptr<c10d::Work>
    _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                         const c10d::ReduceScatterOptions &opts) override
    {
        check_tensor(input, "reduce_scatter's input");
        check_tensor(output, "reduce_scatter's output");
        TORCH_CHECK(input.numel() == output.numel() * getSize() &&
                        output.scalar_type() == input.scalar_type(),
                    "regroup backend: reduce_scatter: the input is not world size x the "
                    "output");
        scatter_into(output, input, opts);
        return done(c10d::OpType::_REDUCE_SCATTER_BASE, {output});
    }

    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override
    {
        if (rg_comm_t *c = comm()) {
            rg_comm_opts_t o = comm_opts(opts.timeout);
            check(rg_comm_barrier(c, &o), "barrier");
        }
        return done(c10d::OpType::BARRIER, {});
    }

    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst,
                                        int tag) override
    {
        return p2p(tensors, dst, tag, true);
    }

    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src,
                                        int tag) override
    {
        return p2p(tensors, src, tag, false);
    }

  private:
    /* The context's group, or NULL for a group of one rank (nothing to exchange). */
    rg_comm_t *comm()
    {
        if (ctx_ == nullptr) {
            return nullptr;
        }
        TORCH_CHECK(rg_train_round(ctx_) == round_, "regroup backend: this process group is "
                    "of round ", round_, ", and the job has regrouped into round ",
                    rg_train_round(ctx_), ": use the new default group");
        rg_comm_t *c = rg_train_comm(ctx_);
        TORCH_CHECK(c != nullptr, "regroup backend: this worker has no group (a replacement "
                    "that has not joined yet)");
        return getSize() > 1 ? c : nullptr;
    }

    c10::intrusive_ptr<c10d::Work> p2p(std::vector<at::Tensor> &tensors, int peer, int tag,
                                       bool send)
    {
        const char *what = send ? "send" : "recv";
        TORCH_CHECK(tensors.size() == 1, "regroup backend: ", what, " takes one tensor");
        at::Tensor &t = tensors[0];
        check_tensor(t, send ? "send's tensor" : "recv's tensor");
        check_peer(peer, what);
        rg_comm_opts_t o = comm_opts(c10d::kUnsetTimeout);
        rg_comm_t *c = peer_comm();
        rg_dtype_t dt = to_rg_dtype(t, what);
        check(send ? rg_comm_send(c, t.data_ptr(), t.numel(), dt, peer, p2p_tag(tag), &o)
                   : rg_comm_recv(c, t.data_ptr(), t.numel(), dt, peer, p2p_tag(tag), &o),
              what);
        return done(send ? c10d::OpType::SEND : c10d::OpType::RECV, tensors);
    }

    rg_comm_t *peer_comm()
    {
        rg_comm_t *c = comm();
        TORCH_CHECK(c != nullptr, "regroup backend: send/recv in a group of one rank");
        return c;
    }

    void check_peer(int peer, const char *what)
    {
        TORCH_CHECK(peer >= 0 && peer < getSize() && peer != getRank(), "regroup backend: ",
                    what, " with rank ", peer, " (this is rank ", getRank(), " of ",
                    getSize(), ")");
    }

    /* User tags share the 32 bits the library matches on; they stay below 2^31. */
    static uint32_t p2p_tag(int tag)
    {
        TORCH_CHECK(tag >= 0, "regroup backend: a negative tag");
        return (uint32_t)tag;
    }

    static rg_comm_opts_t comm_opts(std::chrono::milliseconds timeout)
    {
        rg_comm_opts_t o;
        std::memset(&o, 0, sizeof(o));
        o.deadline = timeout.count() > 0 ? rg_deadline_in_ms(timeout.count())
                                         : RG_DEADLINE_DEFAULT;
        o.mem_type = RG_MEM_HOST;
        return o;
    }

    static void check(rg_status_t st, const char *what)
    {
        TORCH_CHECK(st == RG_OK, "regroup backend: ", what, " failed: ", rg_status_name(st),
                    " (", rg_status_str(st), "): ", rg_last_error());
    }

    void gather_into(at::Tensor &flat, at::Tensor &in, std::chrono::milliseconds timeout)
    {
        rg_comm_t *c = comm();
        if (c == nullptr) {
            flat.view({-1}).copy_(in.view({-1}));
            return;
        }
        rg_comm_opts_t o = comm_opts(timeout);
        check(rg_comm_allgather(c, in.data_ptr(), flat.data_ptr(), in.numel(),
                                to_rg_dtype(in, "allgather"), &o),
              "allgather");
    }

    void scatter_into(at::Tensor &out, at::Tensor &in, const c10d::ReduceScatterOptions &opts)
    {
        rg_redop_t op = to_rg_op(opts.reduceOp, out);
        rg_comm_t *c = comm();
        if (c == nullptr) {
            out.view({-1}).copy_(in.view({-1}));
            return;
        }
        rg_comm_opts_t o = comm_opts(opts.timeout);
        check(rg_comm_reduce_scatter(c, in.data_ptr(), out.data_ptr(), out.numel(),
                                     to_rg_dtype(out, "reduce_scatter"), op, &o),
              "reduce_scatter");
    }

    c10::intrusive_ptr<c10d::Work> done(c10d::OpType op, std::vector<at::Tensor> out)
    {
        return c10::make_intrusive<DoneWork>(getRank(), op, std::move(out));
    }

    rg_train_ctx_t *ctx_;
    int round_;
};

} // namespace

PYBIND11_MODULE(_regroup_c10d, m)
{
    m.doc() = "torch.distributed's regroup backend over libregroup's UCX group";
    py::module::import("torch.distributed");
    py::class_<ProcessGroupRegroup, c10d::ProcessGroup,
               c10::intrusive_ptr<ProcessGroupRegroup>>(m, "ProcessGroupRegroup")
        .def(py::init([](uintptr_t ctx, int rank, int size, int round) {
                 return c10::make_intrusive<ProcessGroupRegroup>(ctx, rank, size, round);
             }),
             py::arg("ctx"), py::arg("rank"), py::arg("size"), py::arg("round"),
             "ctx: the address of the worker's rg_train_ctx_t (0: a group of one rank)");
}
