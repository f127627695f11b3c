#!/usr/bin/env bash
# Builds the checkpoint-parser fuzz target with clang's libFuzzer (+ ASan/UBSan) and runs it
# for a bounded time, starting from the golden inputs in tests/data/.
#   scripts/fuzz.sh [SECONDS]      default 60
# Exits non-zero if the fuzzer finds a crash; the crashing input is left in build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
[[ $secs =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2; }
out=build-fuzz
mkdir -p "$out/corpus"
cp -f tests/data/ckpt/* "$out/corpus/" 2>/dev/null || true
clang -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Werror \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Iinclude -Icommon -Ickpt \
    tests/fuzz/fuzz_ckpt_parse.c ckpt/ckpt_format.c ckpt/ckpt_crc.c \
    common/rg_error.c common/rg_log.c common/rg_util.c \
    -lpthread -o "$out/fuzz_ckpt_parse"
cd "$out"
./fuzz_ckpt_parse -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 corpus
