"""The sandbox-runner (one-shot runs and sessions) and ingest, in each client flavour. The
runner of `cairn up` uses the local backend (bubblewrap) when it is installed, else Docker."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import pytest

from cairn_client import (
    BlockStatus,
    CairnError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)


def runner_or_skip(client: Any) -> None:
    try:
        client.sandbox.info()
    except CairnError as e:
        if e.reason in ("no_isolation", "unavailable"):
            print(f"SKIP: no sandbox backend on this machine ({e.message})")
            pytest.skip("no sandbox backend")
        raise


def test_one_shot_run_with_inputs_and_outputs(client: Any, tmp_path: Path) -> None:
    runner_or_skip(client)
    info = client.sandbox.info()
    assert "python" in info.languages and info.runner_id
    code = (
        "import sys\n"
        "data = open('/input/in/data.txt').read()\n"
        "open('/output/upper.txt', 'w').write(data.upper())\n"
        "print('stdout line'); print('stderr line', file=sys.stderr)\n"
    )
    result = client.sandbox.run(
        code, "python", inputs={"in/data.txt": b"hello"}, outputs=tmp_path / "out"
    )
    assert result.ok and result.exit_code == 0, result
    assert (result.stdout, result.stderr) == (b"stdout line\n", b"stderr line\n")
    assert result.outputs == {"upper.txt": b"HELLO"}
    assert (tmp_path / "out" / "upper.txt").read_bytes() == b"HELLO"
    failed = client.sandbox.run("exit 7", "bash")
    assert failed.exit_code == 7 and not failed.ok
    with pytest.raises(InvalidArgumentError):
        client.sandbox.run("print(1)", "cobol")


def test_session_as_context_manager(client: Any, tmp_path: Path) -> None:
    runner_or_skip(client)
    with client.sandbox.session() as s:
        assert s.id
        assert s.write("src/hello.txt", "hello world\n") == 12
        assert s.write("src/hello.txt", "again\n", append=True) == 18
        assert s.read("src/hello.txt") == b"hello world\nagain\n"
        ran = s.exec("cat src/hello.txt | wc -l && echo oops >&2 && exit 3")
        assert (ran.exit_code, ran.stdout.strip(), ran.stderr) == (3, b"2", b"oops\n")
        assert s.exec("pwd", workdir="src").stdout.strip().endswith(b"/src")
        assert s.glob("**/*.txt") == ["src/hello.txt"]
        matches = s.grep("again")
        assert [(m.path, m.line, m.text) for m in matches] == [("src/hello.txt", 2, "again")]
        assert s.touch() >= 0
        summary = s.pack(tmp_path / "ws.zip")
        assert summary.entries == 1 and summary.size == (tmp_path / "ws.zip").stat().st_size
        with zipfile.ZipFile(tmp_path / "ws.zip") as z:
            assert z.read("src/hello.txt") == b"hello world\nagain\n"
        buffer = io.BytesIO()
        s.pack(buffer, format="tar.gz")
        assert buffer.getvalue()[:2] == b"\x1f\x8b"
    # Closed on leaving the block: the session is gone.
    with pytest.raises(NotFoundError):
        s.read("src/hello.txt")


def test_ingest_writes_blocks_and_returns_manifest(client: Any, tmp_path: Path) -> None:
    doc = (
        "Plan:\n\n```python file=pkg/hello.py\nprint('hi')\n```\n\n"
        "```python file=../escape.py\nx = 1\n```\n"
    )
    client.store.create_project(client.settings.project)
    dry = client.ingest(doc, run="ing-run", dry_run=True)
    assert dry.path == "" and dry.total_blocks == 2
    with pytest.raises(NotFoundError):  # a dry run writes nothing
        client.store.stat("workspace/pkg/hello.py")
    manifest = client.ingest(doc, run="ing-run", node="writer")
    assert manifest.version == 1 and manifest.run_id == "ing-run" and manifest.node_id == "writer"
    assert (manifest.total_blocks, manifest.written, manifest.rejected) == (2, 1, 1)
    written, refused = manifest.artifacts
    assert (
        written.status == BlockStatus.WRITTEN and written.workspace_path == "workspace/pkg/hello.py"
    )
    assert refused.status == BlockStatus.REJECTED and refused.reason == "traversal"
    assert manifest.path == ".cairn/runs/ing-run/ingest/writer.json"
    assert client.store.get("workspace/pkg/hello.py") == b"print('hi')\n"
    path_doc = tmp_path / "doc.md"
    path_doc.write_text("```text file=notes.txt\nfrom a file\n```\n")
    assert client.ingest(path_doc, run="ing-run", node="file").written == 1
    assert client.store.get("workspace/notes.txt") == b"from a file\n"
    assert client.ingest.enabled(run="ing-run") is True
    if client.flavour.endswith("mtls"):
        # The flag is stored by ingest itself, which over mutual TLS writes only under a claim
        # that SetEnabled cannot carry: the service refuses it there.
        with pytest.raises(PermissionDeniedError) as e:
            client.ingest.set_enabled(False, run="ing-run")
        assert e.value.reason == "identity"
        return
    assert client.ingest.set_enabled(False, run="ing-run") is False
    off = client.ingest(doc, run="ing-run", node="off")
    assert off.enabled is False and off.written == 0
    assert client.ingest.set_enabled(True, run="ing-run") is True
