"""The README's quick start and the examples run as written against `cairn up`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

from conftest import Server

HERE = Path(__file__).resolve().parents[1]


def run_python(code: str, server: Server, tmp_path: Path) -> str:
    script = tmp_path / "snippet.py"
    script.write_text(code)
    env = dict(os.environ, CAIRN_ADDR=server.addr, CAIRN_PROJECT=f"doc-{uuid.uuid4().hex[:8]}")
    for name in ("CAIRN_TOKEN", "CAIRN_TLS_DIR", "CAIRN_TOKEN_FILE"):
        env.pop(name, None)
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_quick_start_runs(plain_server: Server, tmp_path: Path) -> None:
    readme = (HERE / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code, "no python block under Quick start"
    # The same text is examples/quickstart.py, which mypy --strict checks.
    assert code.group(1) == (HERE / "examples" / "quickstart.py").read_text()
    out = run_python(code.group(1), plain_server, tmp_path)
    lines = out.splitlines()
    assert lines[0] == "1 task.created " and "gate.blocked review" in out, out
    assert lines[-1] == "COMPLETED hello Python", out
    seqs = [int(line.split()[0]) for line in lines[:-1]]
    assert seqs == list(range(1, len(seqs) + 1)), out


def test_the_async_example_runs(plain_server: Server, tmp_path: Path) -> None:
    out = run_python((HERE / "examples" / "async_tour.py").read_text(), plain_server, tmp_path)
    assert "read back b'a,b\\n1,2\\n'" in out and "sandbox printed 2" in out, out
    assert "hello from a session" in out and "ingest wrote 1 of 1 blocks" in out, out
    assert "refused: traversal" in out, out
