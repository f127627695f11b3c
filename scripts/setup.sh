#!/usr/bin/env bash
# Installs the Debian packages regroup needs to build, test and run its examples.
# Idempotent: installs only what is missing, and runs `apt-get update` only then.
#   scripts/setup.sh           build, test and example dependencies
#   scripts/setup.sh --bench   also the reference implementations the benchmarks compare with,
#                              and matplotlib for the plots in docs/ (bench/plot_rdzv.py)
set -euo pipefail

pkgs=(build-essential cmake pkg-config clang
      etcd-server etcd-client libcurl4-openssl-dev libjansson-dev
      libucx-dev ucx-utils libzstd-dev zlib1g-dev check
      libopenblas-dev dataset-fashion-mnist
      iproute2 openssl procps
      python3-numpy python3-pytest python3-torch python3-venv python3-pip python3-setuptools
      libtorch-dev python3-dev pybind11-dev
      slurmctld slurmd slurm-client munge)
if [[ "${1:-}" == "--bench" ]]; then
    pkgs+=(openmpi-bin libopenmpi-dev python3-matplotlib)
fi

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if ((${#missing[@]} == 0)); then
    exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
    sudo="sudo"
fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
