#!/bin/sh
# A trivial worker for the launcher tests. It records its start in $RG_TEST_DIR/events
# ("start ROUND RANK WORLD RESTART PID LOCAL_RANK GROUP_RANK"), then waits until the test
# creates $RG_TEST_DIR/stop (at most 120 s) and exits 0.
# RG_TEST_FAIL_RANK=N makes rank N exit 3 at once, with an error file and a stderr line.
# RG_TEST_IGNORE_TERM=1 makes it ignore SIGTERM (a program still finishing its work).
set -u
if [ "${RG_TEST_IGNORE_TERM:-0}" = 1 ]; then
    trap '' TERM
fi
d=${RG_TEST_DIR:?}
echo "start ${REGROUP_ROUND:--1} $RANK $WORLD_SIZE $TORCHELASTIC_RESTART_COUNT $$ $LOCAL_RANK ${GROUP_RANK:--1} $(date +%s.%N)" >> "$d/events"
if [ "${RG_TEST_FAIL_RANK:-x}" = "$RANK" ]; then
    echo "rank $RANK fails on purpose" >&2
    printf '{"message": {"message": "RuntimeError: rank %s failed on purpose"}}' "$RANK" \
        > "$TORCHELASTIC_ERROR_FILE"
    exit 3
fi
i=0
while [ ! -e "$d/stop" ] && [ $i -lt 2400 ]; do
    sleep 0.05
    i=$((i + 1))
done
echo "rank $RANK done"
exit 0
