#!/usr/bin/env bash
# Installs what is needed, builds regroup in Release (build only: gcc's -O3 finds warnings the
# other builds miss), then plain and with ASan+UBSan, and runs every test through ctest in
# both, then the fuzz targets for a bounded time and the quick chaos suite. Exits non-zero if
# anything fails.
#   REGROUP_JOBS=N            parallel build jobs (default: number of cores)
#   REGROUP_FUZZ_SECONDS=N    seconds per fuzz target (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

jobs=${REGROUP_JOBS:-$(nproc)}
status=0

# Release (-O3) is built, not tested: gcc's -O3 finds warnings (maybe-uninitialized) that
# the tested builds' -O2 hides, and users build it for the benchmarks.
echo "== release build =="
cmake -S . -B build-test-release -DCMAKE_BUILD_TYPE=Release -DREGROUP_C10D=ON >/dev/null
if ! cmake --build build-test-release -j "$jobs" >/dev/null; then
    echo "release build failed" >&2
    exit 1
fi
for variant in plain sanitize; do
    dir=build-test-$variant
    flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DREGROUP_C10D=ON)
    [[ $variant == sanitize ]] && flags+=(-DREGROUP_SANITIZE=ON)
    echo "== $variant build =="
    cmake -S . -B "$dir" "${flags[@]}" >/dev/null
    cmake --build "$dir" -j "$jobs" >/dev/null
    echo "== $variant tests =="
    if ! (cd "$dir" && ctest --output-on-failure -j 1); then
        status=1
    fi
done

# The parsers of outside input, fuzzed for a bounded time (seconds per target).
echo "== fuzz =="
if ! bash scripts/fuzz.sh "${REGROUP_FUZZ_SECONDS:-30}"; then
    status=1
fi

# The chaos suite, quick: >= 12 faults of every kind this machine allows, fixed seed, in
# both recovery modes.
echo "== chaos (quick) =="
if ! REGROUP_BUILD=build-test-plain chaos/run --quick --seed 1 --report build-test-plain/chaos-report.json; then
    status=1
fi
# The same faults on a job that recovers in place (about a minute more).
echo "== chaos (quick, in place) =="
if ! REGROUP_BUILD=build-test-plain chaos/run --quick --recovery=in-place --seed 1 \
        --report build-test-plain/chaos-report-in-place.json; then
    status=1
fi
exit $status
