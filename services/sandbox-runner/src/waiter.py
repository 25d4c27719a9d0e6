# The waiting process of a pooled local or gvisor sandbox (backend/local_pool.rs,
# gvisor_pool.rs), and the first process of every cold gvisor sandbox, started as the sandbox
# user inside a complete sandbox. It says it is ready, then reads ONE job line
# (JSON: argv, env, cwd, rlimits) from stdin and execs the program in its place: stdin becomes
# /dev/null, every other descriptor is closed, the signal dispositions Python changed are reset,
# the rlimits are set (soft = hard, as prlimit does). On EOF (the runner dropped the sandbox) it
# exits. Nothing of it outlives the exec.
# With "relay": true (the gvisor backend, whose host pipes take short writes the program may
# not retry) it does not exec: it forks the program with stdout and stderr on pipes of its own,
# copies them to its fd 1 and 2 whole, kills whatever the program left running once it has
# exited, and exits with its status.
import json, os, resource, select, signal, sys, time

LIMITS = {
    "nproc": resource.RLIMIT_NPROC,
    "as": resource.RLIMIT_AS,
    "fsize": resource.RLIMIT_FSIZE,
    "cpu": resource.RLIMIT_CPU,
    "core": resource.RLIMIT_CORE,
}


def close_above_2():
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass


def start(job, argv, env):
    """Becomes the program (never returns)."""
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for name, value in job["rlimits"].items():
        resource.setrlimit(LIMITS[name], (value, value))
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        os.write(2, b"cairn: cannot start %s: %s\n" % (argv[0], e.strerror.encode()))
        os._exit(127)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            time.sleep(0.001)


def relay(job, argv, env):
    # A timeout's SIGTERM reaches every process of the sandbox: the relay stays for the
    # program's grace period (the SIGKILL after it ends everything).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        close_above_2()
        start(job, argv, env)
    os.close(out_w)
    os.close(err_w)
    targets = {out_r: 1, err_r: 2}
    status = None
    while targets:
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                # As the end of its sandbox would: nothing the program started runs on.
                for _ in range(2):
                    for name in os.listdir("/proc"):
                        if name.isdigit() and int(name) != os.getpid():
                            try:
                                os.kill(int(name), signal.SIGKILL)
                            except OSError:
                                pass
        ready, _, _ = select.select(list(targets), [], [], 0.05 if status is None else None)
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                write_all(targets[fd], data)
            else:
                del targets[fd]
    if status is None:
        _, status = os.waitpid(pid, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def main():
    # `--now` (a cold gvisor sandbox): the job line follows at once, nobody waits for "ready".
    if "--now" not in sys.argv[1:]:
        os.write(1, b"cairn-waiting\n")
    line = sys.stdin.buffer.readline()
    if not line.endswith(b"\n"):
        os._exit(0)
    job = json.loads(line)
    argv = [a.encode() for a in job["argv"]]
    env = {k.encode(): v.encode() for k, v in job["env"]}
    os.chdir(job["cwd"])
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    close_above_2()
    if job.get("relay"):
        relay(job, argv, env)
    start(job, argv, env)


main()
