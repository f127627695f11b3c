#!/usr/bin/env bash
# The installed library as a user sees it: installs the build into a temporary prefix, checks
# the file list, the SONAME and that libregroup.so exports the public API only, compiles each
# installed header alone in C11 and C++ and links every declared function from C++, builds
# examples/starter out of tree with pkg-config (libregroup.so, then libregroup.a with
# regroup.pc's private dependencies) and with find_package (regroup::regroup, then
# regroup::regroup_static), and runs each build under the installed regroup --standalone
# --nproc-per-node=2, each run resuming from the previous one's checkpoints; then the Python
# package: installed beside the library and pip-installed into a virtual environment, each
# importing and running a tiny job under the installed regroup. Every step has a deadline;
# the temporary tree is removed on any exit.
#   test_install.sh BUILD_DIR SOURCE_DIR VERSION C_COMPILER [EXTRA_FLAGS]
# EXTRA_FLAGS go to every compile and link of the starter (the sanitizer build's flags, which
# a program loading a sanitized libregroup.so needs too).
set -euo pipefail

build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
version=$3
cc=$4
extra=${5:-}
cxx=${CXX:-c++}
read -r -a extra_flags <<<"$extra"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/regroup-install.XXXXXX")
cleanup() {
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
    echo "test_install: FAIL: $*" >&2
    exit 1
}
step() {
    echo "== $*"
}
# needs FILE NAME: whether FILE's dynamic section has a NEEDED entry starting with NAME.
needs() {
    local dyn
    dyn=$(readelf -d "$1")
    grep -q "(NEEDED).*\[$2" <<<"$dyn"
}

# The SONAME carries major.minor while the version is 0.x (a minor release may change the
# ABI), the major alone from 1.0.
IFS=. read -r major minor _ <<<"$version"
if [[ $major == 0 ]]; then
    soname=libregroup.so.$major.$minor
else
    soname=libregroup.so.$major
fi

prefix=$tmp/prefix
mkdir -p "$tmp/tmp"

step "install into $prefix"
timeout 300 cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; fail "cmake --install"; }
(cd "$prefix" && find . -type f -o -type l | sort)

libdir=$(dirname "$(find "$prefix" -name libregroup.a | head -n 1)")
[[ -f $libdir/libregroup.a ]] || fail "no libregroup.a"
for f in "$prefix/bin/regroup" "$libdir/libregroup.so" "$libdir/$soname" \
         "$libdir/pkgconfig/regroup.pc" "$libdir/cmake/regroup/regroupConfig.cmake" \
         "$libdir/cmake/regroup/regroupConfigVersion.cmake" \
         "$libdir/cmake/regroup/regroupTargets.cmake"; do
    [[ -e $f ]] || fail "not installed: ${f#"$prefix"/}"
done
for h in "$src"/include/regroup/*.h; do
    cmp -s "$h" "$prefix/include/regroup/${h##*/}" || fail "header not installed: ${h##*/}"
done

step "SONAME $soname"
got=$(readelf -d "$libdir/libregroup.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $got == "$soname" ]] || fail "SONAME is '$got', not '$soname'"

step "libregroup.so exports the functions of include/regroup/*.h, nothing else"
# Declared: gcc's own list of the prototypes it read (-aux-info, which only gcc has, whatever
# the build's compiler), static inline ones left out.
for h in "$prefix"/include/regroup/*.h; do
    echo "#include <regroup/${h##*/}>"
done >"$tmp/all.c"
gcc -std=c11 -I"$prefix/include" -fsyntax-only -aux-info "$tmp/aux.txt" "$tmp/all.c"
grep "/include/regroup/" "$tmp/aux.txt" | grep -v '\*/ static ' |
    sed -n 's/^\/\* [^*]* \*\/ extern [^(]*[ *]\(rg_[A-Za-z0-9_]*\) (.*/\1/p' |
    sort -u >"$tmp/declared"
nm -D --defined-only "$libdir/libregroup.so" | awk '{print $3}' | sed 's/@.*//' |
    sort -u >"$tmp/exported"
[[ -s $tmp/declared ]] || fail "no function found in the headers"
if ! diff "$tmp/declared" "$tmp/exported" >"$tmp/exports.diff"; then
    sed 's/^</declared, not exported:/; s/^>/exported, not declared:/' "$tmp/exports.diff" \
        | grep ':' >&2
    fail "the exported symbols differ from the public API"
fi
echo "$(wc -l <"$tmp/exported") functions exported"

step "each header compiles alone, first, in C11 and C++"
for h in "$prefix"/include/regroup/*.h; do
    name=${h##*/}
    printf '#include <regroup/%s>\nint rg_header_test_dummy;\n' "$name" >"$tmp/h.c"
    cp "$tmp/h.c" "$tmp/h.cc"
    timeout 60 "$cc" -std=c11 -Wall -Wextra -Werror -Wpedantic -I"$prefix/include" \
        -fsyntax-only "$tmp/h.c" || fail "$name does not compile alone in C11"
    for std in c++11 c++17; do
        timeout 60 "$cxx" -std=$std -Wall -Wextra -Werror -Wpedantic -I"$prefix/include" \
            -fsyntax-only "$tmp/h.cc" || fail "$name does not compile alone as $std"
    done
    echo "$name: ok"
done

step "every declared function links from C++ (the headers' extern \"C\")"
# A header without the guard would make these references C++-mangled names, undefined here.
{
    cat "$tmp/all.c"
    echo 'typedef void (*rg_any_fn_t)();'
    echo 'static rg_any_fn_t const fns[] = {'
    sed 's/.*/    reinterpret_cast<rg_any_fn_t>(\&&),/' "$tmp/declared"
    echo '};'
    echo 'int main() { return fns[0] == nullptr; }'
} >"$tmp/link.cc"
timeout 120 "$cxx" -std=c++11 -Wall -Wextra -Werror "${extra_flags[@]}" -I"$prefix/include" \
    -o "$tmp/link-cxx" "$tmp/link.cc" -L"$libdir" -lregroup -Wl,-rpath,"$libdir" ||
    fail "the public API does not link from C++"
timeout 60 "$tmp/link-cxx" || fail "a C++ program cannot load libregroup.so"

# The starter, copied out of the source tree: only the installed files can be used.
cp -r "$src/examples/starter" "$tmp/starter"
export PKG_CONFIG_PATH=$libdir/pkgconfig
[[ $(pkg-config --modversion regroup) == "$(sed -n 's/^Version: //p' "$PKG_CONFIG_PATH/regroup.pc")" ]] ||
    fail "pkg-config does not find regroup.pc"
pc_libdir=$(pkg-config --variable=libdir regroup)
[[ $pc_libdir -ef $libdir ]] || fail "regroup.pc's libdir is $pc_libdir, not $libdir"

step "starter with pkg-config (shared)"
# shellcheck disable=SC2046
timeout 120 "$cc" -std=c11 -Wall -Wextra -Werror "${extra_flags[@]}" -o "$tmp/starter-pc" \
    "$tmp/starter/starter.c" $(pkg-config --cflags --libs regroup) -Wl,-rpath,"$pc_libdir" ||
    fail "cannot build the starter with pkg-config"
needs "$tmp/starter-pc" "$soname]" || fail "starter-pc does not load $soname"

step "starter with libregroup.a and regroup.pc's private dependencies"
# What `pkg-config --static` adds: Requires.private and Libs.private. The link takes the
# Requires.private modules' shared libraries (--libs, not --static: libcurl's own static
# closure needs -dev packages this machine need not have), so that it checks that regroup.pc
# lists every dependency of libregroup.a.
pkg-config --static --libs regroup >/dev/null || fail "pkg-config --static cannot resolve regroup"
mods=$(pkg-config --print-requires-private regroup)
libs_private=$(sed -n 's/^Libs.private: //p' "$PKG_CONFIG_PATH/regroup.pc")
# shellcheck disable=SC2046,SC2086
timeout 120 "$cc" -std=c11 -Wall -Wextra -Werror "${extra_flags[@]}" -o "$tmp/starter-static" \
    "$tmp/starter/starter.c" $(pkg-config --cflags regroup) -L"$pc_libdir" -l:libregroup.a \
    $libs_private $(pkg-config --libs $mods) ||
    fail "cannot link the starter with libregroup.a and regroup.pc's private dependencies"
if needs "$tmp/starter-static" libregroup; then
    fail "starter-static loads libregroup.so"
fi

# cmake_starter NAME [CMAKE ARGS...]: the starter built with find_package(regroup).
cmake_starter() {
    local name=$1
    shift
    timeout 300 cmake -S "$tmp/starter" -B "$tmp/$name" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="-Werror $extra" \
        -DCMAKE_EXE_LINKER_FLAGS="$extra" "$@" >"$tmp/$name.cmake.log" 2>&1 ||
        { cat "$tmp/$name.cmake.log"; fail "cmake cannot configure the starter ($name)"; }
    timeout 300 cmake --build "$tmp/$name" >"$tmp/$name.build.log" 2>&1 ||
        { cat "$tmp/$name.build.log"; fail "cmake cannot build the starter ($name)"; }
    [[ -x $tmp/$name/starter ]] || fail "no starter in the CMake build $name"
}

step "starter with find_package(regroup): regroup::regroup"
cmake_starter cmake-shared
needs "$tmp/cmake-shared/starter" "$soname]" ||
    fail "the CMake-built starter does not load $soname"

step "starter with find_package(regroup COMPONENTS static): regroup::regroup_static"
cmake_starter cmake-static -DSTARTER_STATIC=ON
if needs "$tmp/cmake-static/starter" libregroup; then
    fail "the starter built with regroup::regroup_static loads libregroup.so"
fi

# Runs the installed regroup on 2 local workers: run NAME BINARY STEPS EXPECTED-LINE...
run() {
    local name=$1 bin=$2 steps=$3
    shift 3
    step "run $name: regroup --standalone --nproc-per-node=2 ${bin##*/} --steps $steps"
    local rc=0
    env PATH="$prefix/bin:$PATH" TMPDIR="$tmp/tmp" UCX_NET_DEVICES=lo \
        REGROUP_CKPT_DIR="$tmp/ckpt" \
        timeout -k 10 180 regroup --standalone --nproc-per-node=2 --max-restarts=0 \
        "$bin" --steps "$steps" --ckpt-every 10 >"$tmp/$name.out" 2>&1 || rc=$?
    cat "$tmp/$name.out"
    [[ $rc -eq 0 ]] || fail "run $name exited with $rc"
    for want in "$@"; do
        grep -q -- "$want" "$tmp/$name.out" || fail "run $name did not print '$want'"
    done
}
run pkg-config "$tmp/starter-pc" 30 "no checkpoint: starting from scratch" \
    "done steps=30 .* world=2"
run find_package "$tmp/cmake-shared/starter" 60 "resumed from step 30" \
    "done steps=60 .* world=2"
run static "$tmp/starter-static" 70 "resumed from step 60" "done steps=70 .* world=2"
run find_package-static "$tmp/cmake-static/starter" 80 "resumed from step 70" \
    "done steps=80 .* world=2"

# ---- the Python package ------------------------------------------------------------------
# Installed beside the library, it finds that library; a tiny job runs under the installed
# regroup and runs again resuming from its checkpoint; then the same with the package pip
# installed (python/pyproject.toml) into a virtual environment, the library found through
# the loader's path. The sanitized build's runtimes are preloaded into the interpreter.
python=${PYTHON:-/usr/bin/python3}
py_env=()
if [[ -n $extra ]]; then
    py_env=(LD_PRELOAD="$("$cc" -print-file-name=libasan.so):$("$cc" -print-file-name=libubsan.so)"
            ASAN_OPTIONS=detect_leaks=0)
fi
pydir=$libdir/python3/dist-packages
step "Python package installed in ${pydir#"$prefix"/}"
[[ -f $pydir/regroup/__init__.py && -f $pydir/regroup/_libdir.py ]] ||
    fail "the Python package is not installed in ${pydir#"$prefix"/}"
cat >"$tmp/tiny.py" <<'PY'
import sys
import numpy as np
import regroup

steps = int(sys.argv[1])
with regroup.init() as ctx:
    w = np.zeros(5, np.float32)
    start = ctx.latest_checkpoint()
    if start is None:
        start = 0
    else:
        ctx.restore(start, {"w": w})
    if ctx.rank == 0:
        print("start=%d lib=%s version=%s" % (start, regroup.library_path(),
                                              regroup.__version__), flush=True)
    for step in range(start + 1, steps + 1):
        g = np.full(5, ctx.rank + 1, np.float32)
        ctx.allreduce(g)
        w += g
        ctx.report(step, metrics={"w0": float(w[0])}, state={"w": w} if step % 5 == 0 else None)
    if ctx.rank == 0:
        print("tiny done w0=%g world=%d" % (w[0], ctx.world_size), flush=True)
PY
# pyrun NAME PYTHON STEPS ENV... -- EXPECTED-LINE...: the tiny job on 2 workers.
pyrun() {
    local name=$1 py=$2 steps=$3
    shift 3
    local envs=()
    while [[ $1 != -- ]]; do
        envs+=("$1")
        shift
    done
    shift
    step "python $name: regroup --standalone --nproc-per-node=2 ${py} tiny.py $steps"
    local rc=0
    (cd "$tmp/tmp" && env PATH="$prefix/bin:$PATH" TMPDIR="$tmp/tmp" UCX_NET_DEVICES=lo \
        REGROUP_CKPT_DIR="$tmp/pyckpt" "${py_env[@]}" "${envs[@]}" \
        timeout -k 10 180 regroup --standalone --nproc-per-node=2 --max-restarts=0 \
        "$py" "$tmp/tiny.py" "$steps") >"$tmp/py-$name.out" 2>&1 || rc=$?
    cat "$tmp/py-$name.out"
    [[ $rc -eq 0 ]] || fail "python $name exited with $rc"
    for want in "$@"; do
        grep -q -- "$want" "$tmp/py-$name.out" || fail "python $name did not print '$want'"
    done
}
# Each step adds 1 + 2 to w: w0 = 3 * steps at any history of restarts.
pyrun installed "$python" 10 PYTHONPATH="$pydir" -- \
    "start=0 lib=$libdir/$soname version=$version" "tiny done w0=30 world=2"
pyrun installed-again "$python" 20 PYTHONPATH="$pydir" -- "start=10 " "tiny done w0=60 world=2"

# torch.distributed's regroup backend (c10d/), where the build made it: installed in the
# package's directory, found there, its group over the installed libregroup.so.
if [[ -e $build/_regroup_c10d.so ]]; then
    [[ -e $pydir/regroup/_regroup_c10d.so ]] || fail "the c10d backend is not installed"
    step "torch.distributed's regroup backend from the installed package"
    cat >"$tmp/pg.py" <<'PY'
import torch, torch.distributed as dist
import regroup.distributed
dist.init_process_group("regroup")
t = torch.full((3,), float(dist.get_rank() + 1))
dist.all_reduce(t)
print("pg rank=%d sum=%g backend=%s" % (dist.get_rank(), t[0].item(), dist.get_backend()))
PY
    rc=0
    (cd "$tmp/tmp" && env PATH="$prefix/bin:$PATH" TMPDIR="$tmp/tmp" UCX_NET_DEVICES=lo \
        PYTHONPATH="$pydir" "${py_env[@]}" timeout -k 10 180 regroup --standalone \
        --nproc-per-node=2 --max-restarts=0 "$python" "$tmp/pg.py") >"$tmp/pg.out" 2>&1 || rc=$?
    [[ $rc -eq 0 ]] || { cat "$tmp/pg.out"; fail "the installed backend's job exited $rc"; }
    for r in 0 1; do
        grep -q "pg rank=$r sum=3 backend=regroup" "$tmp/pg.out" ||
            { cat "$tmp/pg.out"; fail "the installed backend's rank $r did not sum"; }
    done
fi

step "Python package pip-installed into a virtual environment"
cp -r "$src/python" "$tmp/python-src"
timeout 120 "$python" -m venv --system-site-packages "$tmp/venv" >"$tmp/venv.log" 2>&1 ||
    { cat "$tmp/venv.log"; fail "python3 -m venv"; }
timeout 300 "$tmp/venv/bin/python" -m pip install --no-build-isolation --no-index --no-deps \
    "$tmp/python-src" >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; fail "pip install ./python"; }
pip_version=$("$tmp/venv/bin/python" -m pip show regroup 2>/dev/null | sed -n 's/^Version: //p')
[[ $pip_version == "$version" ]] ||
    fail "python/pyproject.toml's version is '$pip_version', not the project's $version"
pyrun venv "$tmp/venv/bin/python" 25 LD_LIBRARY_PATH="$libdir" -- \
    "start=20 lib=$soname version=$version" "tiny done w0=75 world=2"

echo "test_install: ok"
