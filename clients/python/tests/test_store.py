"""The artifact-store through `client.store`, in each client flavour."""

from __future__ import annotations

import hashlib
import io
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn_client import (
    ConflictError,
    EntryKind,
    InvalidArgumentError,
    NotFoundError,
    TaskState,
    WriteOutcome,
)

BODY = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4 bytes: several chunks


def test_put_every_source_and_get_back(client: Any, tmp_path: Path) -> None:
    digest = hashlib.sha256(BODY).hexdigest()
    put = client.store.put("docs/py/data.bin", BODY)
    assert (put.path, put.sha256, put.size, put.outcome) == (
        "docs/py/data.bin",
        digest,
        len(BODY),
        WriteOutcome.CREATED,
    )
    assert client.store.put("docs/py/data.bin", BODY).outcome == WriteOutcome.UNCHANGED
    local = tmp_path / "local.bin"
    local.write_bytes(BODY)
    assert client.store.put("docs/py/from-path.bin", local).sha256 == digest
    with open(local, "rb") as f:
        assert client.store.put("docs/py/from-file.bin", f).sha256 == digest

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(BODY), 100_000):
            yield BODY[i : i + 100_000]

    assert client.store.put("docs/py/from-iter.bin", pieces()).sha256 == digest
    if client.flavour.startswith("async"):

        async def async_pieces() -> AsyncIterator[bytes]:
            for piece in pieces():
                yield piece

        assert client.store.put("docs/py/from-aiter.bin", async_pieces()).sha256 == digest
        assert client.store.get("docs/py/from-aiter.bin") == BODY
    assert (
        client.store.put("docs/py/from-iter.bin", b"new", overwrite=True).outcome
        == WriteOutcome.OVERWRITTEN
    )
    for name in ("data", "from-path", "from-file"):
        assert client.store.get(f"docs/py/{name}.bin") == BODY
    assert client.store.get("docs/py/data.bin", offset=10, length=5) == BODY[10:15]
    target = tmp_path / "out.bin"
    info = client.store.get("docs/py/data.bin", to=target)
    assert target.read_bytes() == BODY and info.sha256 == digest and info.size == len(BODY)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []
    sink = io.BytesIO()
    client.store.get("docs/py/data.bin", to=sink)
    assert sink.getvalue() == BODY


def test_stat_ls_delete_and_projects(client: Any) -> None:
    for name in ("a.txt", "b.txt", "sub/c.txt"):
        client.store.put(f"docs/ls/{name}", name.encode())
    st = client.store.stat("docs/ls/a.txt", sha256=True)
    assert (st.kind, st.size, st.sha256) == (
        EntryKind.FILE,
        5,
        hashlib.sha256(b"a.txt").hexdigest(),
    )
    assert client.store.stat("docs/ls/a.txt").sha256 == ""
    flat = [e.path for e in client.store.ls("docs/ls")]
    assert flat == ["docs/ls/a.txt", "docs/ls/b.txt", "docs/ls/sub"]
    deep = [e.path for e in client.store.ls("docs/ls", recursive=True, page_size=1)]
    assert deep == ["docs/ls/a.txt", "docs/ls/b.txt", "docs/ls/sub/c.txt"]
    assert client.store.delete("docs/ls/b.txt") is True
    with pytest.raises(NotFoundError) as e:
        client.store.stat("docs/ls/b.txt")
    assert e.value.reason == "not_found"
    project = client.settings.project
    assert project in [p.project_id for p in client.store.projects()]
    made = client.store.create_project(project + "-2")
    assert made.project_id == project + "-2" and made.created_at


def test_refusals_carry_reason_metadata_and_hint(client: Any) -> None:
    client.store.put("docs/py/keep.txt", b"one")
    with pytest.raises(ConflictError) as e:
        client.store.put("docs/py/keep.txt", b"two")
    assert e.value.reason == "exists" and e.value.code.name == "ALREADY_EXISTS"
    assert e.value.metadata == {"path": "docs/py/keep.txt", "project": client.settings.project}
    assert "overwrite" in e.value.hint, e.value.hint
    with pytest.raises(InvalidArgumentError) as bad:
        client.store.put("../escape.txt", b"x")
    assert bad.value.reason == "traversal" and "relative" in bad.value.hint
    assert "hint:" in str(bad.value)


def test_events_of_a_run(client: Any) -> None:
    run = client.runs.submit(
        {
            "nodes": [
                {"id": "a", "type": "write_file", "path": "docs/{{run_id}}/a.txt", "content": "a"}
            ]
        }
    )
    assert client.runs.wait(run, timeout=30).state == TaskState.COMPLETED
    stored = list(client.store.events(run))
    watched = list(client.runs.watch(run))
    assert [e.line for e in stored] == [e.line for e in watched]
    assert [e.seq for e in client.store.events(run, from_seq=2, limit=2)] == [2, 3]
