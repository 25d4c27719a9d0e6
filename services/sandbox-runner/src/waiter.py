# The waiting process of a pooled local or gvisor sandbox (backend/local_pool.rs,
# gvisor_pool.rs), the first process of every cold gvisor sandbox and of a gvisor session, and
# the relay of each command of a gvisor session; started as the sandbox user (a session's first
# process as root with only CAP_SETUID and CAP_SETGID) inside a complete sandbox. It says it
# is ready, then reads ONE job line (JSON: argv, env, cwd, rlimits) from stdin and execs the
# program in its place: stdin becomes /dev/null, every other descriptor is closed, the signal
# dispositions Python changed are reset, the rlimits are set (soft = hard, as prlimit does).
# On EOF (the runner dropped the sandbox) it exits. Nothing of it outlives the exec.
# With "relay": true (the gvisor backend, whose host pipes take short writes the program may
# not retry) it does not exec: it forks the program with stdout and stderr on pipes of its own
# and copies them to its fd 1 as frames (a kind byte, b"1" stdout or b"2" stderr, a 4-byte
# big-endian length, the bytes), then a b"x" frame with the exit status (4 bytes, signed;
# 128 + signal when killed), so the runner has the result before the sandbox is torn down.
# With "reap" (one-shot runs) it kills whatever the program left running once it has exited, as
# the end of its sandbox would; without (session commands) background processes stay, and
# their output after the command's end is not relayed.
# `--spawn UID:GID` (the first process of a gvisor session): it starts the session's commands.
# A session command's relay (a `runsc exec`) does not fork the command itself: it connects to
# SPAWN_ADDR and sends the job line with the command's stdin, stdout and stderr (SCM_RIGHTS);
# the first process forks the command as UID:GID and answers its exit code (4 bytes, signed)
# when it ends. So a session's commands and what they leave running descend from the first
# process, not from a `runsc exec`, and live through a checkpoint and restore (gVisor ends
# every process started through `runsc exec` at a restore). A relay that finds no spawner (a
# session restored from a snapshot made before) forks the command itself.
# `--warm` (a pooled gvisor sandbox started as a plain `python3 -c`, in the default
# environment of a job; or, with `--now`, a cold one started in its Python job's own
# environment): a Python job whose start would be the same as this interpreter's
# (argv `python3 -c CODE` or `python3 FILE`, the same environment) runs in a fork of it as a
# fresh interpreter's __main__, without starting another interpreter; the fork is made ahead,
# while the sandbox waits, and gets the job line through a pipe.
FRESH_MAIN = dict(globals())
import sys

FRESH_MODULES = set(sys.modules)
# Only what an interpreter has loaded already or builds in, and resource: `json` and `signal`
# would import re and enum, tens of ms of trapped system calls in a cold gVisor sandbox.
import os, resource, select, time
import _signal as signal

LIMITS = {
    "nproc": resource.RLIMIT_NPROC,
    "as": resource.RLIMIT_AS,
    "fsize": resource.RLIMIT_FSIZE,
    "cpu": resource.RLIMIT_CPU,
    "core": resource.RLIMIT_CORE,
}
# Output of a session command still arriving this long after it ended is relayed.
DRAIN_S = 0.05
# Where a gvisor session's first process takes its commands (an abstract unix socket).
SPAWN_ADDR = b"\0cairn-session-spawner"
# Longest a connected relay may take to send its job line, and the longest line.
SPAWN_READ_S = 5.0
SPAWN_MAX_LINE = 1 << 20


class Decoding:
    """What _json's scanner reads of a json.JSONDecoder: the defaults of json.loads."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float


def loads(line):
    """json.loads of a job line, through the C scanner json.loads itself uses."""
    text = line.decode()
    try:
        from _json import make_scanner
    except ImportError:
        import json

        return json.loads(text)
    try:
        value, end = make_scanner(Decoding)(text, 0)
    except StopIteration as e:
        raise ValueError("the job line is not JSON (at character %d)" % e.value) from None
    if text[end:].strip():
        raise ValueError("the job line has more than one JSON value")
    return value


def close_above_2(keep=()):
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def set_rlimits(job):
    for name, value in job["rlimits"].items():
        resource.setrlimit(LIMITS[name], (value, value))


def start(job, argv, env):
    """Becomes the program (never returns)."""
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    set_rlimits(job)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        os.write(2, b"cairn: cannot start %s: %s\n" % (argv[0], e.strerror.encode()))
        os._exit(127)


def warm_program(job):
    """(filename, source, sys.argv, sys.path[0]) when a fork of this interpreter can run the
    job as `python3` would, else None."""
    argv = job["argv"]
    if "--warm" not in sys.argv[1:] or not argv or argv[0] != "python3":
        return None
    if sorted(map(tuple, job["env"])) != sorted(os.environ.items()):
        return None
    if len(argv) == 3 and argv[1] == "-c":
        return "<string>", argv[2], ["-c"], ""
    if len(argv) == 2 and argv[1].startswith("/") and os.path.isfile(argv[1]):
        path = argv[1]
        try:
            with open(path, "rb") as f:
                source = f.read()
        except OSError:
            return None
        return path, source, [path], os.path.dirname(os.path.realpath(path))
    return None


def become(job, program):
    """Runs the program as this interpreter's __main__ (in the forked child; never returns)."""
    filename, source, argv, path0 = program
    set_rlimits(job)
    for name in list(sys.modules):
        if name not in FRESH_MODULES:
            del sys.modules[name]
    main = type(sys)("__main__")
    main.__dict__.update(FRESH_MAIN)
    if filename != "<string>":
        loader = sys.modules["_frozen_importlib_external"].SourceFileLoader
        main.__dict__.update(__file__=filename, __cached__=None, __loader__=loader("__main__", filename))
    sys.modules["__main__"] = main
    sys.argv = argv
    sys.orig_argv = list(job["argv"])
    sys.path[0] = path0
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        # As the interpreter reports an uncaught exception, without this file's frames.
        if e.__traceback__ is not None:
            e.__traceback__ = e.__traceback__.tb_next
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(1)
    sys.exit(0)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            time.sleep(0.001)


def frame(kind, data):
    write_all(1, kind + len(data).to_bytes(4, "big") + data)


def fork_ahead():
    """A child forked before the job arrives (`--warm`): it reads the job line from a pipe and
    runs it as __main__, or exits at end of file. Returns (pid, that pipe, stdout, stderr)."""
    ctl_r, ctl_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ctl_w)
        line = b""
        data = os.read(ctl_r, 65536)
        while data:
            line += data
            data = os.read(ctl_r, 65536)
        if not line:
            os._exit(0)
        job = loads(line)
        os.chdir(job["cwd"])
        os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        close_above_2()
        become(job, warm_program(job))
    for fd in (ctl_r, out_w, err_w):
        os.close(fd)
    return pid, ctl_w, out_r, err_r


def exit_code(status):
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def fd_bytes(fds):
    return b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)


def ask_spawner(line):
    """Has the session's first process start the command: (its socket, stdout, stderr), or None
    when nothing listens at SPAWN_ADDR."""
    import _socket

    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.connect(SPAWN_ADDR)
    except OSError:
        conn.close()
        return None
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    passed = [0, out_w, err_w]
    sent = conn.sendmsg([line], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fd_bytes(passed))])
    if sent < len(line):
        conn.sendall(line[sent:])
    os.close(out_w)
    os.close(err_w)
    return conn, out_r, err_r


def answered(conn):
    """The exit code the spawner sent on `conn` (-1 when it sent none: it is gone, and so is
    the sandbox)."""
    answer = conn.recv(4)
    conn.close()
    return int.from_bytes(answer, "big", signed=True) if len(answer) == 4 else -1


def relay(job, argv, env, line, ahead):
    spawned = None
    if ahead is None and not job.get("reap"):
        spawned = ask_spawner(line)
    if spawned is not None:
        conn, out_r, err_r = spawned
        pid = None
    elif ahead is not None and warm_program(job) is not None:
        pid, ctl_w, out_r, err_r = ahead
        write_all(ctl_w, line)
        os.close(ctl_w)
    else:
        if ahead is not None:
            os.close(ahead[1])
            os.waitpid(ahead[0], 0)
            os.close(ahead[2])
            os.close(ahead[3])
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            close_above_2()
            if not job.get("reap"):
                # A session command: its processes are a session of their own (exec_kill.py).
                os.setsid()
            start(job, argv, env)
        os.close(out_w)
        os.close(err_w)
    # A timeout's SIGTERM reaches every process of the sandbox: the relay stays for the
    # program's grace period (the SIGKILL after it ends everything).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    kinds = {out_r: b"1", err_r: b"2"}
    status = None
    until = None
    while kinds:
        if status is None and pid is None:
            if conn.fileno() in select.select([conn.fileno()], [], [], 0)[0]:
                status = answered(conn)
                until = time.monotonic() + DRAIN_S
        elif status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = exit_code(st)
                if job.get("reap"):
                    # As the end of its sandbox would: nothing the program started runs on.
                    try:
                        os.kill(-1, signal.SIGKILL)
                    except OSError:
                        pass
                else:
                    until = time.monotonic() + DRAIN_S
        if until is None:
            wait = 0.05 if status is None else None
        else:
            wait = max(0.0, until - time.monotonic())
        watched = list(kinds)
        if status is None and pid is None:
            watched.append(conn.fileno())
        ready, _, _ = select.select(watched, [], [], wait)
        if not ready and until is not None:
            break
        for fd in ready:
            if fd not in kinds:
                continue
            data = os.read(fd, 65536)
            if data:
                frame(kinds[fd], data)
            else:
                del kinds[fd]
    if status is None and pid is None:
        status = answered(conn)
    elif status is None:
        status = exit_code(os.waitpid(pid, 0)[1])
    frame(b"x", status.to_bytes(4, "big", signed=True))
    os._exit(status & 0xFF)


class Asking:
    """A relay's connection whose job line is still arriving: read only when select says it
    is readable, so a connection that sends nothing holds nobody up."""

    def __init__(self, conn):
        self.conn = conn
        self.line = b""
        self.fds = []
        self.until = time.monotonic() + SPAWN_READ_S

    def drop(self):
        for fd in self.fds:
            os.close(fd)
        self.conn.close()

    def read(self):
        """The job when its whole line is in, None while more is to come; ValueError (and
        nothing left open) when the relay sent less, or too much."""
        import _socket

        data, ancillary, _, _ = self.conn.recvmsg(65536, _socket.CMSG_SPACE(3 * 4))
        for level, kind, payload in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                whole = len(payload) - len(payload) % 4
                self.fds += [int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, whole, 4)]
        self.line += data
        if not self.line.endswith(b"\n"):
            if not data or len(self.line) > SPAWN_MAX_LINE:
                raise ValueError("a relay sent no whole job")
            return None
        if len(self.fds) != 3:
            raise ValueError("a relay sent its job without the command's stdin, stdout and stderr")
        return loads(self.line)


def spawn(asking, job, ids, waiting):
    """Starts the job a relay sent as the sandbox user, in a session of its own."""
    conn, fds = asking.conn, asking.fds
    pid = os.fork()
    if pid == 0:
        # Never back into the loop above: whatever fails here ends this child.
        try:
            signal.set_wakeup_fd(-1)
            os.setsid()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            close_above_2()
            os.setgroups([])
            os.setgid(ids[1])
            os.setuid(ids[0])
            os.chdir(job["cwd"])
            argv = [a.encode() for a in job["argv"]]
            start(job, argv, {k.encode(): v.encode() for k, v in job["env"]})
        except BaseException as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else repr(e)
            os.write(2, b"cairn: cannot start the command: %s\n" % why.encode())
        finally:
            os._exit(127)
    for fd in fds:
        os.close(fd)
    waiting[pid] = conn


def answer_ended(waiting):
    """Reaps every ended child; a command's relay gets its exit code."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(exit_code(status).to_bytes(4, "big", signed=True))
            except OSError:
                pass
            conn.close()


def serve(ids):
    """The first process of a gvisor session (`--spawn UID:GID`): starts the session's
    commands for their relays until its stdin ends (never returns)."""
    import _socket

    ids = [int(x) for x in ids.split(":")]
    listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    listener.bind(SPAWN_ADDR)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    os.write(1, b"cairn-waiting\n")
    waiting = {}
    asking = {}
    while True:
        wait = None
        if asking:
            wait = max(0.0, min(a.until for a in asking.values()) - time.monotonic())
        ready, _, _ = select.select([0, listener.fileno(), wake_r, *asking], [], [], wait)
        if 0 in ready and not os.read(0, 65536):
            os._exit(0)
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        answer_ended(waiting)
        for fd in ready:
            if fd not in asking:
                continue
            try:
                job = asking[fd].read()
            except Exception:
                # Whatever a process of the session sent: its connection goes, nothing else.
                asking.pop(fd).drop()
                continue
            if job is not None:
                spawn(asking.pop(fd), job, ids, waiting)
        now = time.monotonic()
        for fd in [fd for fd, a in asking.items() if a.until <= now]:
            asking.pop(fd).drop()
        if listener.fileno() in ready:
            try:
                fd, _ = listener._accept()
            except OSError:
                continue
            asking[fd] = Asking(_socket.socket(fileno=fd))


def read_line():
    """The job line, read without buffering (the program inherits nothing of it); b"" at EOF."""
    line = b""
    while not line.endswith(b"\n"):
        data = os.read(0, 65536)
        if not data:
            return b""
        line += data
    return line


def reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def main():
    if "--spawn" in sys.argv[1:]:
        serve(sys.argv[sys.argv.index("--spawn") + 1])
    # The fork of a warm job, made while nobody waits (its cost is off the run's path).
    ahead = fork_ahead() if "--warm" in sys.argv[1:] else None
    # `--now` (a cold gvisor sandbox): the job line follows at once, nobody waits for "ready".
    if "--now" not in sys.argv[1:]:
        os.write(1, b"cairn-waiting\n")
    if os.getpid() == 1 and ahead is None:
        # The init of a gVisor sandbox (a session's waits here for its life): orphans of the
        # session's commands become its children, and it reaps them.
        signal.signal(signal.SIGCHLD, reap)
    line = read_line()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if not line:
        os._exit(0)
    job = loads(line)
    argv = [a.encode() for a in job["argv"]]
    env = {k.encode(): v.encode() for k, v in job["env"]}
    os.chdir(job["cwd"])
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    close_above_2(ahead[1:] if ahead is not None else ())
    if job.get("relay"):
        relay(job, argv, env, line, ahead)
    start(job, argv, env)


main()
