# The first process of a one-shot docker run (under the engine's init), as root with only the
# SETUID, SETGID and KILL capabilities (backend/docker.rs). It starts the program as the sandbox
# user with stdin on /dev/null and exits with its status. Its own stdin is the runner's attach
# stream, held open by the runner for the whole run: end of file means the runner is gone (its
# connection to the engine closed), and then it kills every process and exits, so the container
# stops and a retry elsewhere never runs alongside this one. The program (another uid, no
# capabilities) can neither signal, stop nor trace it. SIGTERM (the runner's timeout) is passed on.
import os, select, signal, sys


def kill_all(sig):
    try:
        os.kill(-1, sig)
    except OSError:
        pass


def main():
    uid, gid, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    pid = os.fork()
    if pid == 0:
        try:
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.closerange(3, 1024)
            # Python ignores these; the program gets the defaults (SIGXFSZ stops a writer at
            # the file size limit).
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.execvp(argv[0], argv)
        except BaseException as e:
            os.write(2, b"cairn: cannot start %s: %s\n" % (argv[0].encode(), str(e).encode()))
        os._exit(127)
    signal.signal(signal.SIGTERM, lambda s, f: kill_all(signal.SIGTERM))
    try:
        exited = os.pidfd_open(pid)
        wait = [0, exited]
    except (AttributeError, OSError):
        exited, wait = None, [0]
    while True:
        ready, _, _ = select.select(wait, [], [], None if exited is not None else 0.05)
        if 0 in ready:
            try:
                data = os.read(0, 4096)
            except OSError:
                data = b""
            if not data:
                kill_all(signal.SIGKILL)
                os._exit(137)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


main()
