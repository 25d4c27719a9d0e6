# The waiting process of a pooled local or gvisor sandbox (backend/local_pool.rs,
# gvisor_pool.rs), the first process of every cold gvisor sandbox and of a gvisor session, and
# the relay of each command of a gvisor session; started as the sandbox user (a session's first
# process as a capability-less root) inside a complete sandbox. It says it is ready, then reads
# ONE job line (JSON: argv, env, cwd, rlimits) from stdin and execs the program in its place:
# stdin becomes /dev/null, every other descriptor is closed, the signal dispositions Python
# changed are reset, the rlimits are set (soft = hard, as prlimit does). On EOF (the runner
# dropped the sandbox) it exits. Nothing of it outlives the exec.
# With "relay": true (the gvisor backend, whose host pipes take short writes the program may
# not retry) it does not exec: it forks the program with stdout and stderr on pipes of its own
# and copies them to its fd 1 as frames (a kind byte, b"1" stdout or b"2" stderr, a 4-byte
# big-endian length, the bytes), then a b"x" frame with the exit status (4 bytes, signed;
# 128 + signal when killed), so the runner has the result before the sandbox is torn down.
# With "reap" (one-shot runs) it kills whatever the program left running once it has exited, as
# the end of its sandbox would; without (session commands) background processes stay, and
# their output after the command's end is not relayed.
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


def relay(job, argv, env, line, ahead):
    if ahead is not None and warm_program(job) is not None:
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
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
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
        ready, _, _ = select.select(list(kinds), [], [], wait)
        if not ready and until is not None:
            break
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                frame(kinds[fd], data)
            else:
                del kinds[fd]
    if status is None:
        _, status = os.waitpid(pid, 0)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    frame(b"x", code.to_bytes(4, "big", signed=True))
    os._exit(code)


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
