# A Python worker for the launcher's --preload tests (test_launcher.c). It records its start
# in $RG_TEST_DIR/events-py:
#   start RESTART RANK PID PPID PRELOADED ARGV1 FDS_OK PATH0_OK
# (PRELOADED: whether json was imported before this script ran; FDS_OK: whether each
# descriptor the agent's variables name is open), then waits until the test creates
# $RG_TEST_DIR/stop (at most 120 s) and exits 0. RG_TEST_FAIL_RANK=N makes rank N raise at
# its first start (restart 0).
import os
import sys
import time

preloaded = "json" in sys.modules
d = os.environ["RG_TEST_DIR"]
rank = os.environ["RANK"]
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
fds_ok = True
for var in ("REGROUP_NOTICE_FD", "REGROUP_BEAT_FD"):
    if var in os.environ:
        try:
            os.fstat(int(os.environ[var]))
        except OSError:
            fds_ok = False
path0_ok = sys.path[0] == os.path.dirname(os.path.realpath(__file__))
with open(os.path.join(d, "events-py"), "a") as f:
    f.write("start %s %s %d %d %d %s %d %d\n" % (restart, rank, os.getpid(), os.getppid(),
                                               preloaded, sys.argv[1] if len(sys.argv) > 1
                                               else "-", fds_ok, path0_ok))


def fail():
    raise RuntimeError("rank %s fails on purpose" % rank)


if os.environ.get("RG_TEST_FAIL_RANK") == rank and restart == "0":
    fail()
for _ in range(2400):
    if os.path.exists(os.path.join(d, "stop")):
        break
    time.sleep(0.05)
print("rank %s done" % rank)
