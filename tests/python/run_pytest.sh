#!/usr/bin/env bash
# ctest's test_python: runs the Python package's tests with PYTHON's pytest.
#   run_pytest.sh PYTHON TEST_DIR [PYTEST ARGS...]
# Exits 77 (skipped), saying why, when PYTHON lacks pytest or NumPy. RG_TEST_PRELOAD (the
# sanitized build's runtimes) is preloaded into every Python process the tests start.
# The 15 slowest tests are listed at the end (what CI time goes to).
set -euo pipefail
python=$1
dir=$2
shift 2
if ! "$python" -c "import pytest, numpy" 2>/dev/null; then
    echo "test_python: SKIP: $python cannot import pytest and numpy" \
         "(Debian: python3-pytest python3-numpy; scripts/setup.sh installs them)"
    exit 77
fi
if [[ -n ${RG_TEST_PRELOAD:-} ]]; then
    export LD_PRELOAD=${RG_TEST_PRELOAD}${LD_PRELOAD:+:$LD_PRELOAD}
fi
cd "$dir"
exec "$python" -m pytest -q -p no:cacheprovider -o addopts="" --durations=15 "$@" .
