# The waiting process of a pooled local sandbox (backend/local_pool.rs), started by bwrap as
# the sandbox user inside a complete sandbox. It says it is ready, then reads ONE job line
# (JSON: argv, env, cwd, rlimits) from stdin and execs the program in its place: stdin becomes
# /dev/null, every other descriptor is closed, the signal dispositions Python changed are reset,
# the rlimits are set (soft = hard, as prlimit does). On EOF (the runner dropped the sandbox) it
# exits. Nothing of it outlives the exec.
import json, os, resource, signal, sys

LIMITS = {
    "nproc": resource.RLIMIT_NPROC,
    "as": resource.RLIMIT_AS,
    "fsize": resource.RLIMIT_FSIZE,
    "cpu": resource.RLIMIT_CPU,
    "core": resource.RLIMIT_CORE,
}


def main():
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
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for name, value in job["rlimits"].items():
        resource.setrlimit(LIMITS[name], (value, value))
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        os.write(2, b"cairn: cannot start %s: %s\n" % (argv[0], e.strerror.encode()))
        os._exit(127)


main()
