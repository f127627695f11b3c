#!/usr/bin/env bash
# The main job: installs what is needed, builds regroup, and trains the Fashion-MNIST MLP on
# 4 workers under `regroup --standalone --recovery=in-place` (a private etcd, started and
# removed by regroup), with checkpoints in a temporary directory and the data set's
# decompressed copies beside them (--data-cache: a replacement reads those, not the .gz).
#   scripts/main-job.sh               3 epochs; ends with test_accuracy=<fraction>
#   scripts/main-job.sh --kill-demo   also SIGKILLs rank 1 at step 1000 to show the job
#                                     recovering in place: the survivors carry on at world 3
#                                     ("regrouped in place ... world 3"), the replacement
#                                     joins with the state received from a survivor ("received
#                                     from rank ... (not from disk)"), and nobody resumes from
#                                     a checkpoint
#   REGROUP_RECOVERY=restart scripts/main-job.sh --kill-demo   the same in restart mode
# Further arguments go to rg-fmnist (e.g. --epochs 1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null

ckpt=$(mktemp -d /tmp/regroup-fmnist-XXXXXX)
trap 'rm -rf "$ckpt"' EXIT

args=(--epochs 3 --data-cache "$ckpt/data")
if [[ "${1:-}" == "--kill-demo" ]]; then
    args+=(--kill-at 1000 --kill-rank 1)
    shift
fi
export REGROUP_CKPT_DIR="$ckpt" OPENBLAS_NUM_THREADS=1 UCX_NET_DEVICES=lo
build/regroup --standalone --nproc-per-node=4 --max-restarts=3 \
    --recovery="${REGROUP_RECOVERY:-in-place}" \
    build/examples/rg-fmnist "${args[@]}" "$@"
