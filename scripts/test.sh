#!/usr/bin/env bash
# Installs what is needed, builds regroup in Release (-O3: gcc finds warnings there that -O2
# hides) and with ASan+UBSan, runs every test through ctest (the fuzz targets too, for a
# bounded time), then the quick chaos suite in both recovery modes. Exits non-zero if
# anything fails. ctest runs two tests at a time: the suites that fill both cores hold a lock
# (tests/CMakeLists.txt), so that a light suite runs beside a heavy one, never two heavy
# ones. Each test runs once, where it finds the most:
#   sanitized build  the C suites (label "c": every Check suite, each job test in them) and
#                    the Python package's API and torch.distributed backend tests
#   Release build    the tests of the whole system (label "system": the Python package's
#                    training programs, Slurm, the installed library, the chaos runner, the
#                    fuzz targets: the parsers of outside input, fuzzed for a bounded time),
#                    then the chaos suite: the optimized code under faults
#   REGROUP_JOBS=N            parallel build jobs (default: number of cores)
#   REGROUP_FUZZ_SECONDS=N    seconds per fuzz target (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
phase() {
    echo "== $1 (at $((SECONDS - start)) s) =="
}
phase setup
bash scripts/setup.sh

jobs=${REGROUP_JOBS:-$(nproc)}
status=0

build() {   # build DIR CMAKE-ARGS...
    local dir=$1
    shift
    cmake -S . -B "$dir" "$@" >/dev/null
    if ! cmake --build "$dir" -j "$jobs" >/dev/null; then
        echo "build in $dir failed" >&2
        exit 1
    fi
}
run_ctest() {   # run_ctest DIR CTEST-ARGS...
    local dir=$1
    shift
    if ! (cd "$dir" && ctest --output-on-failure -j 2 "$@"); then
        status=1
    fi
}

phase "release build"
build build-test-release -DCMAKE_BUILD_TYPE=Release -DREGROUP_C10D=ON
phase "sanitize build"
build build-test-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREGROUP_C10D=ON \
    -DREGROUP_SANITIZE=ON
phase "sanitize tests (C suites, Python API)"
run_ctest build-test-sanitize -L '^c$'
phase "release tests (system, fuzzers)"
run_ctest build-test-release -L '^system$'


# The chaos suite, quick: >= 12 faults of every kind this machine allows, fixed seed, in
# both recovery modes. Recovery bounds five times the real ones (chaos/chaos.h): they hold on
# this loaded 2-core machine, each kind judged on one or two faults, and still fail a
# recovery that hangs.
phase "chaos (quick)"
if ! REGROUP_BUILD=build-test-release chaos/run --quick --seed 1 --bound-scale 5 \
        --report build-test-release/chaos-report.json; then
    status=1
fi
phase "chaos (quick, in place)"
if ! REGROUP_BUILD=build-test-release chaos/run --quick --recovery=in-place --seed 1 \
        --bound-scale 5 --report build-test-release/chaos-report-in-place.json; then
    status=1
fi
# What failed, last: a failing suite's output can be long (its logs), and the lines that say
# which check failed and why are easy to lose in the middle of it.
if [ "$status" -ne 0 ]; then
    phase "what failed"
    for dir in build-test-sanitize build-test-release; do
        log=$dir/Testing/Temporary/LastTest.log
        if [ -f "$log" ]; then
            grep -E ':[FE]:|^[0-9]+%: Checks|FAILED|Error:|Timeout' "$log" | head -n 40 || true
        fi
    done
fi
phase "done: status $status"
exit $status
