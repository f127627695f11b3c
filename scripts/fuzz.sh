#!/usr/bin/env bash
# Builds the fuzz targets with clang's libFuzzer (+ ASan/UBSan) and runs each for a bounded
# time, starting from the golden inputs in tests/data/:
#   fuzz_ckpt_parse   the checkpoint shard, record and MANIFEST parsers
#   fuzz_data_idx     the IDX dataset reader
#   fuzz_rdzv_records the decoders of a job's etcd records
#   fuzz_cloud_meta   the decoders of the clouds' metadata answers (preemption notices)
#   scripts/fuzz.sh [SECONDS]      seconds per target, default 60
# Exits non-zero if a fuzzer finds a crash; the crashing input is left in build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
[[ $secs =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2; }
out=build-fuzz
mkdir -p "$out/corpus-ckpt" "$out/corpus-idx" "$out/corpus-rdzv" "$out/corpus-meta"
cp -f tests/data/ckpt/* "$out/corpus-ckpt/" 2>/dev/null || true
cp -f tests/data/rdzv/* "$out/corpus-rdzv/"
cp -f tests/data/meta/* "$out/corpus-meta/"
find tests/data -maxdepth 1 -type f -name '*idx*' -exec cp -f {} "$out/corpus-idx/" \;
flags=(-std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Werror
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -Iinclude -Icommon)
common=(common/rg_error.c common/rg_log.c common/rg_util.c common/rg_proc.c)
clang "${flags[@]}" -Ickpt tests/fuzz/fuzz_ckpt_parse.c ckpt/ckpt_format.c ckpt/ckpt_crc.c \
    "${common[@]}" -lpthread -o "$out/fuzz_ckpt_parse"
clang "${flags[@]}" -DRG_TEST_DATA_DIR="\"$PWD/tests/data\"" tests/fuzz/fuzz_data_idx.c \
    train/data_dataset.c "${common[@]}" -lz -lpthread -o "$out/fuzz_data_idx"
clang "${flags[@]}" -Irendezvous tests/fuzz/fuzz_rdzv_records.c rendezvous/rdzv_records.c \
    rendezvous/rdzv_keys.c "${common[@]}" $(pkg-config --cflags --libs jansson) -lm -lpthread \
    -o "$out/fuzz_rdzv_records"
clang "${flags[@]}" -Ilauncher tests/fuzz/fuzz_cloud_meta.c launcher/cloud_meta.c \
    "${common[@]}" $(pkg-config --cflags --libs jansson libcurl) -lm -lpthread \
    -o "$out/fuzz_cloud_meta"
cd "$out"
for t in ckpt_parse:corpus-ckpt data_idx:corpus-idx rdzv_records:corpus-rdzv \
         cloud_meta:corpus-meta; do
    echo "== fuzz_${t%%:*} for ${secs} s =="
    "./fuzz_${t%%:*}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 "${t##*:}" 2>&1 | tail -n 12
    [[ ${PIPESTATUS[0]} -eq 0 ]] || exit 1
done
