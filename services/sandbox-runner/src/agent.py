# The agent: the command of every one-shot docker run's container, warm (started ahead of
# time) or made for the run (backend/docker_pool.rs). It reads ONE job (a JSON line) from
# stdin, stages /input, runs the program as the sandbox user with stdin closed, streams
# stdout/stderr (the first cap bytes of each, the rest counted), enforces the timeout (SIGTERM,
# grace, SIGKILL), kills every sandbox-user process, then sends the result and /output (a tmpfs
# of max_total_output_bytes the engine mounts) as a tar stream.
# Frames on stdout: kind (1 byte) + length (4 bytes, big endian) + payload;
# 1 stdout, 2 stderr, 3 tar bytes, 4 result JSON, 5 end. The runner trusts none of it beyond
# what it checks itself. Runs as root with only SETUID, SETGID and KILL capabilities.
# After the job line, stdin stays open while the runner lives: at its end of file (the runner
# gone) the agent kills every process and exits, so the container stops.
# A cold run pays for this interpreter's start beside the program's, so the agent imports no
# module beyond the few builtin ones below: the job comes in a form read with bytes methods
# (read_job), the result is JSON written by hand, and tarfile (the largest import by far) is
# loaded only when /output holds something to send.
# The agent makes no thread or process after the fork: the program shares the container's pids
# limit and may have filled it (a fork bomb), so the runner's end of stdin is watched in the
# same select loop as the program's output.
import os, resource, select, signal, struct, sys, time

OUT = sys.stdout.buffer


def frame(kind, data):
    OUT.write(struct.pack(">BI", kind, len(data)))
    OUT.write(data)
    OUT.flush()


def kill(target, sig):
    # The agent holds CAP_KILL: it reaches every sandbox process, even setsid'd ones.
    try:
        os.kill(target, sig)
    except OSError:
        pass


def oom_kills():
    for path, key in (("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"), ("/sys/fs/cgroup/memory.events", "oom_kill")):
        try:
            with open(path) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == key:
                        return int(v)
        except OSError:
            pass
    return 0


class TarFrames:
    def write(self, data):
        for i in range(0, len(data), 1 << 20):
            frame(3, bytes(data[i:i + (1 << 20)]))
        return len(data)


# An empty tar archive: its two zero end blocks.
EMPTY_TAR = bytes(1024)


def send_outputs(unreadable):
    try:
        empty = not os.listdir("/output")
    except OSError:
        empty = False
    if empty:
        frame(3, EMPTY_TAR)
        return
    import tarfile

    tar = tarfile.open(fileobj=TarFrames(), mode="w|", format=tarfile.GNU_FORMAT)
    stack = ["/output"]
    while stack:
        d = stack.pop()
        try:
            names = sorted(os.listdir(d))
        except OSError:
            unreadable.append(d[len("/output/"):])
            continue
        for name in names:
            path = os.path.join(d, name)
            arc = "output" + path[len("/output"):]
            try:
                info = tar.gettarinfo(path, arc)
                if info is None:
                    continue
                if info.isreg():
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                    with os.fdopen(fd, "rb") as fh:
                        tar.addfile(info, fh)
                else:
                    tar.addfile(info)
                    if info.isdir():
                        stack.append(path)
            except OSError:
                unreadable.append(path[len("/output/"):])
    tar.close()


def runner_gone():
    # The job line was read whole (nothing follows it): a read now ends at end of file.
    try:
        return not os.read(0, 4096)
    except OSError:
        return True


class Job:
    pass


def read_job(stream):
    # The runner's encoding (docker_pool.rs, encode_job): `<length>\n`, then a line of ten
    # numbers, then length-prefixed fields `<n>:<bytes>,`.
    size = int(stream.readline())
    data = stream.read(size)
    if len(data) != size:
        raise ValueError("the job ended early")
    head, _, rest = data.partition(b"\n")
    job = Job()
    (job.uid, job.gid, job.timeout_ms, job.grace_ms, job.max_stdout, job.max_stderr, job.fsize,
     n_argv, n_env, n_inputs) = (int(x) for x in head.split())
    items, at = [], 0
    while at < len(rest):
        colon = rest.index(b":", at)
        end = colon + 1 + int(rest[at:colon])
        if rest[end:end + 1] != b",":
            raise ValueError("a job field is not closed")
        items.append(rest[colon + 1:end])
        at = end + 1
    if len(items) != n_argv + 2 * n_env + 2 * n_inputs:
        raise ValueError("the job has %d fields" % len(items))
    job.argv = items[:n_argv]
    pairs = items[n_argv:n_argv + 2 * n_env]
    job.env = dict(zip(pairs[::2], pairs[1::2]))
    files = items[n_argv + 2 * n_env:]
    job.inputs = list(zip(files[::2], files[1::2]))
    return job


def json_str(s):
    # A JSON string of a path (a name that is not UTF-8 gets U+FFFD for each bad byte).
    out = []
    for ch in s:
        o = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif o < 0x20:
            out.append("\\u%04x" % o)
        elif 0xD800 <= o < 0xE000:
            out.append("\ufffd")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def main():
    job = read_job(sys.stdin.buffer)
    uid, gid = job.uid, job.gid
    for path, content in job.inputs:
        p = os.path.join(b"/input", path)
        os.makedirs(os.path.dirname(p), mode=0o755, exist_ok=True)
        with open(p, "wb") as fh:
            fh.write(content)
        os.chmod(p, 0o444)
    oom_before = oom_kills()
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(w_out, 1)
            os.dup2(w_err, 2)
            os.closerange(3, 65536)
            # Python ignores these; the program gets the defaults (SIGXFSZ stops a writer at
            # the file size limit, one byte over the output byte limit).
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            resource.setrlimit(resource.RLIMIT_FSIZE, (job.fsize, job.fsize))
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.chdir("/tmp")
            os.execvpe(job.argv[0], job.argv, job.env)
        except BaseException as e:
            try:
                os.write(2, b"cairn: cannot start %s: %s\n" % (job.argv[0], str(e).encode()))
            except BaseException:
                pass
        os._exit(127)
    os.close(w_out)
    os.close(w_err)

    caps = {r_out: job.max_stdout + 1, r_err: job.max_stderr + 1}
    kinds = {r_out: 1, r_err: 2}
    # Bytes the program wrote to each stream, kept or not (the result counts them all).
    seen = {r_out: 0, r_err: 0}
    open_fds = [r_out, r_err]
    step, timed_out, status = 0, False, None
    next_at = time.monotonic() + job.timeout_ms / 1000.0
    while open_fds:
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                # The program is done: whatever it left running dies now (as in a container
                # whose init exits), so its pipes close.
                kill(-1, signal.SIGKILL)
        wait = max(0.0, next_at - time.monotonic())
        ready, _, _ = select.select(open_fds + [0], [], [], min(wait, 0.05))
        for fd in ready:
            if fd == 0:
                if runner_gone():
                    kill(-1, signal.SIGKILL)
                    os._exit(137)
                continue
            data = os.read(fd, 65536)
            if not data:
                open_fds.remove(fd)
                continue
            seen[fd] += len(data)
            keep = data[: max(0, caps[fd])]
            caps[fd] -= len(data)
            if keep:
                frame(kinds[fd], keep)
        if time.monotonic() >= next_at:
            if step == 0:
                timed_out = True
                kill(-pid, signal.SIGTERM)
                next_at = time.monotonic() + job.grace_ms / 1000.0
            elif step == 1:
                kill(-1, signal.SIGKILL)
                next_at = time.monotonic() + 5.0
            else:
                break
            step += 1
    kill(-1, signal.SIGKILL)
    if status is None:
        _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        code = 128 - code
    unreadable = []
    st = os.statvfs("/output")
    full = st.f_bavail * st.f_frsize < 65536
    flag = {True: "true", False: "false"}
    frame(4, ('{"exit_code": %d, "timed_out": %s, "oom": %s, "full": %s, "stdout_bytes": %d, "stderr_bytes": %d}' % (
        code, flag[timed_out], flag[oom_kills() > oom_before], flag[full], seen[r_out], seen[r_err])).encode())
    send_outputs(unreadable)
    frame(5, ('{"unreadable": [%s]}' % ", ".join(json_str(p) for p in unreadable)).encode())


if __name__ == "__main__":
    main()
