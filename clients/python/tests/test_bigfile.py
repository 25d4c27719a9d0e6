"""A 200 MiB put and get with flat memory: the client streams in chunks both ways, so the peak
resident memory of the process grows by far less than the file (measured in a process of its
own, where nothing else has raised the peak)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Server

SIZE = 200 * 1024 * 1024
BOUND_KIB = 64 * 1024  # the file is 200 MiB; buffers of a few MiB are what streaming needs


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_200_mib_put_and_get_in_flat_memory(
    plain_server: Server, flavour: str, tmp_path: Path
) -> None:
    target = tmp_path / "big.bin"
    worker = Path(__file__).with_name("bigfile_worker.py")
    try:
        out = subprocess.run(
            [sys.executable, str(worker), plain_server.addr, flavour, str(SIZE), str(target)],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ),
        )
    finally:
        target.unlink(missing_ok=True)  # pytest keeps the temporary directories of 3 sessions
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["file_size"] == SIZE, report
    assert report["put_sha256"] == report["expected"] == report["file_sha256"]
    assert report["growth_kib"] < BOUND_KIB, report
    print(f"{flavour}: peak RSS grew {report['growth_kib'] // 1024} MiB for a 200 MiB put+get")
