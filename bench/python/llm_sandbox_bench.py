"""llm-sandbox (PyPI) on the same local image as cairn's runner: python `print(1)`, p50/p95.

Run by bench/sandbox.sh in bench/.venv. The image has `python3` but no `python`, and
llm-sandbox runs `python FILE` when its environment setup (a venv + pip, which needs network)
is skipped; so the container's command links python3 as /tmp/bin/python on PATH and then
sleeps (init reaps), which also keeps the container alive between executions.
"""
import statistics
import sys
import time

from llm_sandbox import SandboxSession

IMAGE = sys.argv[1] if len(sys.argv) > 1 else "cairn-sandbox:latest"
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
RUNTIME = {
    "init": True,
    "network_mode": "none",
    "command": ["sh", "-c", "mkdir -p /tmp/bin && ln -sf /usr/bin/python3 /tmp/bin/python && exec sleep infinity"],
    "environment": {"PATH": "/tmp/bin:/usr/local/bin:/usr/bin:/bin"},
}


def session():
    return SandboxSession(
        lang="python",
        image=IMAGE,
        keep_template=True,
        skip_environment_setup=True,
        runtime_configs=dict(RUNTIME),
        workdir="/tmp/sandbox",
        verbose=False,
    )


def pct(values, q):
    values = sorted(values)
    k = max(1, min(len(values), int(-(-q * len(values) // 1))))
    return values[k - 1]


def report(label, ms):
    print(f"| {label} | {len(ms)} | {pct(ms, 0.5):.1f} | {pct(ms, 0.95):.1f} |")


def main():
    # One session per run: container created, started, code run, container removed.
    per_run = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        with session() as s:
            out = s.run("print(1)")
        per_run.append((time.perf_counter() - t0) * 1000)
        assert out.stdout.strip() == "1", (out.exit_code, out.stdout, out.stderr)
    # One open session, runs inside it (copy the file in, docker exec).
    reused = []
    with session() as s:
        s.run("print(1)")
        for _ in range(RUNS):
            t0 = time.perf_counter()
            out = s.run("print(1)")
            reused.append((time.perf_counter() - t0) * 1000)
            assert out.stdout.strip() == "1", (out.exit_code, out.stdout, out.stderr)
    report("llm-sandbox, new session per run", per_run)
    report("llm-sandbox, runs in one open session", reused)


if __name__ == "__main__":
    main()
