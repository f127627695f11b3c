/*
 * What every bench's JSON line says about the binary that produced it: the commit it was
 * built from (with "-dirty" when the tree had uncommitted changes) and the build type.
 * RG_BENCH_META is a JSON fragment to splice in: "commit":"..","build":"..".
 */
#ifndef RG_BENCH_META_H
#define RG_BENCH_META_H

#include "rg_bench_build.h"

#ifndef RG_BENCH_BUILD_TYPE
#define RG_BENCH_BUILD_TYPE "unknown"
#endif

#define RG_BENCH_META "\"commit\":\"" RG_BENCH_COMMIT "\",\"build\":\"" RG_BENCH_BUILD_TYPE "\""

#endif
