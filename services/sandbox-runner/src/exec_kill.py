# Signals one session Exec's processes (backend/docker.rs, gvisor_session.rs), run in the
# session's container or gVisor sandbox as the sandbox user: every process whose environment
# carries the Exec's CAIRN_EXEC_ID, and every process in the sessions they lead (each Exec's
# command starts in a session of its own; background children stay in it). Other Execs of the
# session are left alone.
import os, sys

sig, mark = int(sys.argv[1]), ("CAIRN_EXEC_ID=" + sys.argv[2]).encode()
me = os.getpid()


def pids():
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and int(n) != me]


def session(p):
    with open("/proc/%d/stat" % p, "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[3])


sessions = set()
for p in pids():
    try:
        with open("/proc/%d/environ" % p, "rb") as f:
            if mark in f.read().split(b"\0"):
                sessions.add(session(p))
                os.kill(p, sig)
    except OSError:
        pass
sessions.discard(0)
for p in pids():
    try:
        if session(p) in sessions:
            os.kill(p, sig)
    except OSError:
        pass
