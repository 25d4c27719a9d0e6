#!/usr/bin/env python3
"""Where a cold gVisor run's time goes, without the runner: runsc driven directly on bundles
written as the gvisor backend writes them (the image's root read-only, /input and /output
binds, cgroups with memory and cpu, rlimits, uid 10001, no network), each step timed from the
host, rounds interleaved with `docker run --rm` and `runsc do` so all see the same load.

Usage: sudo python3 bench/gvisor_steps.py ROOTFS [RUNS] [IMAGE]
ROOTFS is the image's exported root (the runner's <gvisor_rootfs_cache>/<image id>/rootfs).
Prints p50/p95 per step and the ratio of each to `docker run --rm` in the same rounds.
CAIRN_STEPS_WAITER_BEFORE=FILE adds the two cold steps with that waiter.py (e.g. `git show
main:services/sandbox-runner/src/waiter.py`), interleaved with this tree's.
"""
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
WAITER = open(os.path.join(HERE, "../services/sandbox-runner/src/waiter.py")).read()
CODE = "print(1)"
PLATFORM = os.environ.get("CAIRN_BENCH_GVISOR_PLATFORM", "ptrace")
BASE_ENV = [
    ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    ("HOME", "/tmp"),
    ("LANG", "C.UTF-8"),
    ("PYTHONUNBUFFERED", "1"),
    ("PYTHONDONTWRITEBYTECODE", "1"),
]
WAITER_ENV = [BASE_ENV[0], BASE_ENV[2]]
MEM = 512 << 20
RLIMITS = {"nproc": 256, "as": MEM, "fsize": (10 << 20) + 1, "cpu": 31, "core": 0}


def spec(rootfs, task, argv, env):
    rl = [{"type": "RLIMIT_" + k.upper(), "hard": v, "soft": v} for k, v in RLIMITS.items()]
    rl.append({"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024})
    return {
        "ociVersion": "1.0.0",
        "process": {
            "user": {"uid": 10001, "gid": 10001},
            "args": argv,
            "env": ["%s=%s" % kv for kv in env],
            "cwd": "/tmp" if argv[0] != "python3" or "-I" not in argv else "/",
            "noNewPrivileges": True,
            "capabilities": {k: [] for k in ("bounding", "effective", "inheritable", "permitted")},
            "rlimits": rl,
        },
        "root": {"path": rootfs, "readonly": True},
        "hostname": "sandbox",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
             "options": ["size=%d" % MEM, "mode=1777"]},
            {"destination": "/input", "type": "bind", "source": task + "/input",
             "options": ["rbind", "ro"]},
            {"destination": "/output", "type": "bind", "source": task + "/output",
             "options": ["rbind", "rw"]},
        ],
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
            "cgroupsPath": "/cairn-gvisor-steps/" + os.path.basename(task),
            "resources": {"memory": {"limit": MEM, "swap": MEM},
                          "cpu": {"quota": 100000, "period": 100000}},
        },
    }


class Box:
    """A task directory and a bundle, as the runner makes them; removed by `close`."""

    def __init__(self, work, rootfs, argv, env):
        self.id = "steps-" + uuid.uuid4().hex[:12]
        t = time.monotonic()
        self.task = os.path.join(work, "tasks", self.id)
        os.makedirs(self.task + "/input", mode=0o755)
        os.makedirs(self.task + "/output", mode=0o700)
        os.chown(self.task + "/output", 10001, 10001)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=10m,uid=10001,gid=10001,mode=0700",
                        "tmpfs", self.task + "/output"], check=True)
        self.bundle = os.path.join(work, "bundles", self.id)
        os.makedirs(self.bundle, mode=0o700)
        with open(self.bundle + "/config.json", "w") as f:
            json.dump(spec(rootfs, self.task, argv, env), f)
        self.prep = time.monotonic() - t
        self.root = os.path.join(work, "state")

    def runsc(self, *args, **kw):
        return ["runsc", "--root=" + self.root, "--platform=" + PLATFORM, "--network=none", *args]

    def close(self):
        subprocess.run(self.runsc("delete", "--force", self.id), stderr=subprocess.DEVNULL)
        subprocess.run(["umount", self.task + "/output"])
        shutil.rmtree(self.task)
        shutil.rmtree(self.bundle)


def go_line(argv, env):
    return (json.dumps({"relay": True, "reap": True, "argv": argv, "env": env, "cwd": "/tmp",
                        "rlimits": RLIMITS}) + "\n").encode()


def read_exit_frame(fd):
    """Reads frames until the exit frame; returns (stdout bytes, exit code)."""
    buf, out = b"", b""
    while True:
        while len(buf) >= 5:
            n = int.from_bytes(buf[1:5], "big")
            if len(buf) < 5 + n:
                break
            kind, body, buf = buf[:1], buf[5:5 + n], buf[5 + n:]
            if kind == b"x":
                return out, int.from_bytes(body, "big", signed=True)
            if kind == b"1":
                out += body
        data = os.read(fd, 65536)
        if not data:
            raise RuntimeError("relay ended without an exit frame: %r" % buf)
        buf += data


def timed(cmd):
    t = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ms = (time.monotonic() - t) * 1000
    if r.returncode != 0:
        raise RuntimeError("%s: %s" % (cmd, r.stderr.decode()))
    return ms


def runsc_run(work, rootfs, argv, env, go=None):
    """`runsc run` of a bundle; returns (prep ms, ms to the answer, ms to runsc's exit). The
    answer is the exit frame when `go` is sent to a waiter, else the first output."""
    box = Box(work, rootfs, argv, env)
    try:
        t = time.monotonic()
        p = subprocess.Popen(box.runsc("run", "--bundle", box.bundle, box.id),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        if go is not None:
            p.stdin.write(go)
            p.stdin.flush()
            out, code = read_exit_frame(p.stdout.fileno())
            assert (out, code) == (b"1\n", 0), (out, code)
        else:
            os.read(p.stdout.fileno(), 65536)
        answer = (time.monotonic() - t) * 1000
        p.stdin.close()
        p.wait()
        return box.prep * 1000, answer, (time.monotonic() - t) * 1000
    finally:
        box.close()


def create_start(work, rootfs, argv, env, go):
    """`runsc create` then `runsc start`: (create ms, start to the exit frame ms)."""
    box = Box(work, rootfs, argv, env)
    try:
        r, w = os.pipe()
        ir, iw = os.pipe()
        er, ew = os.pipe()
        t = time.monotonic()
        # The sandbox keeps these three as its first process's stdio.
        subprocess.run(box.runsc("create", "--bundle", box.bundle, box.id), stdin=ir, stdout=w,
                       stderr=ew, check=True)
        created = (time.monotonic() - t) * 1000
        for fd in (w, ir, ew):
            os.close(fd)
        t = time.monotonic()
        subprocess.run(box.runsc("start", box.id), check=True)
        os.write(iw, go)
        out, code = read_exit_frame(r)
        assert (out, code) == (b"1\n", 0), (out, code)
        started = (time.monotonic() - t) * 1000
        for fd in (iw, r, er):
            os.close(fd)
        return created, started
    finally:
        box.close()


def sweep(work):
    """Deletes every sandbox in the state directory and unmounts the task directories'
    tmpfs (what a failed or interrupted round left); returns the ids it found."""
    state = ["runsc", "--root=" + work + "/state"]
    left = subprocess.run(state + ["list", "--quiet"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL).stdout.decode().split()
    for id in left:
        subprocess.run(state + ["delete", "--force", id], stderr=subprocess.DEVNULL)
    tasks = os.path.join(work, "tasks")
    for name in os.listdir(tasks) if os.path.isdir(tasks) else []:
        subprocess.run(["umount", os.path.join(tasks, name, "output")],
                       stderr=subprocess.DEVNULL)
    return left


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    rootfs = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    image = sys.argv[3] if len(sys.argv) > 3 else "cairn-sandbox:latest"
    work = tempfile.mkdtemp(prefix="cairn-gvisor-steps.")
    cold_waiter = ["python3", "-I", "-S", "-c", WAITER, "--now"]
    warm_waiter = ["python3", "-c", WAITER, "--warm", "--now"]
    job = ["python3", "-c", CODE]
    before = os.environ.get("CAIRN_STEPS_WAITER_BEFORE")
    steps = {
        "docker run --rm (baseline)": lambda: timed(
            ["docker", "run", "--rm", "--network", "none", image, "python3", "-c", CODE]),
        "runsc do python3 -c": lambda: timed(
            ["runsc", "--platform=" + PLATFORM, "--network=none", "do", "/usr/bin/python3",
             "-c", CODE]),
        "runsc run /bin/true (to exit)": lambda: runsc_run(work, rootfs, ["/bin/true"],
                                                           WAITER_ENV)[2],
        "runsc run python3 -c, no waiter (first output)": lambda: runsc_run(
            work, rootfs, job, BASE_ENV)[1],
        "cold: waiter -I -S, exec python3 (exit frame)": lambda: runsc_run(
            work, rootfs, cold_waiter, WAITER_ENV, go_line(job, BASE_ENV))[1],
        "cold: waiter as the job's interpreter, fork (exit frame)": lambda: runsc_run(
            work, rootfs, warm_waiter, BASE_ENV, go_line(job, BASE_ENV))[1],
    }
    if before:
        # The same cold step with another waiter.py (e.g. the one before a change).
        old = open(before).read()
        steps["cold: waiter -I -S, exec python3; %s" % before] = lambda: runsc_run(
            work, rootfs, ["python3", "-I", "-S", "-c", old, "--now"], WAITER_ENV,
            go_line(job, BASE_ENV))[1]
        steps["cold: waiter as the job's interpreter; %s" % before] = lambda: runsc_run(
            work, rootfs, ["python3", "-c", old, "--warm", "--now"], BASE_ENV,
            go_line(job, BASE_ENV))[1]
    times = {k: [] for k in steps}
    extra = {"bundle + task dir prep": [], "runsc create": [], "runsc start to exit frame": [],
             "runsc run exit after the exit frame": []}
    # A SIGTERM (e.g. `timeout`) ends through the `finally` below, which sweeps.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for name, f in steps.items():  # warm-up
            f()
        for i in range(runs):
            for name, f in steps.items():
                times[name].append(f())
            prep, answer, end = runsc_run(work, rootfs, cold_waiter, WAITER_ENV,
                                          go_line(job, BASE_ENV))
            extra["bundle + task dir prep"].append(prep)
            extra["runsc run exit after the exit frame"].append(end - answer)
            c, s = create_start(work, rootfs, warm_waiter, BASE_ENV, go_line(job, BASE_ENV))
            extra["runsc create"].append(c)
            extra["runsc start to exit frame"].append(s)
            print("round %d/%d done" % (i + 1, runs), file=sys.stderr)
    finally:
        left = sweep(work)
        shutil.rmtree(work, ignore_errors=True)
        for h in os.listdir("/sys/fs/cgroup"):
            try:
                os.rmdir(os.path.join("/sys/fs/cgroup", h, "cairn-gvisor-steps"))
            except OSError:
                pass
    print("sandboxes the rounds left in runsc's state (deleted): %d" % len(left))
    base = statistics.median(times["docker run --rm (baseline)"])
    print("| step | runs | p50 ms | p95 ms | p50 / docker run |")
    print("|---|---:|---:|---:|---:|")
    for name, xs in list(times.items()) + list(extra.items()):
        print("| %s | %d | %.1f | %.1f | %.2fx |" % (name, len(xs), statistics.median(xs),
                                                    pct(xs, 0.95), statistics.median(xs) / base))


if __name__ == "__main__":
    main()
