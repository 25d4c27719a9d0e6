"""Runs through the orchestrator of a real `cairn up`: every method of `client.runs`, in each
client flavour (sync, async; plaintext and mutual TLS with a token)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from cairn_client import (
    FINAL_STATES,
    ConflictError,
    FailedPreconditionError,
    GateState,
    InvalidArgumentError,
    NotFoundError,
    TaskState,
)

WRITE = {
    "vars": {"who": "world"},
    "nodes": [
        {
            "id": "a",
            "type": "write_file",
            "path": "docs/{{run_id}}/a.txt",
            "content": "hello {{vars.who}}",
        }
    ],
}
GATED = {
    "nodes": [
        {"id": "a", "type": "write_file", "path": "docs/{{run_id}}/a.txt", "content": "a"},
        {"id": "check", "type": "gate", "reason": "look at a", "needs": ["a"]},
        {
            "id": "b",
            "type": "write_file",
            "path": "docs/{{run_id}}/b.txt",
            "content": "b",
            "needs": ["check"],
        },
    ]
}
BLOCKED = {TaskState.INPUT_REQUIRED, *FINAL_STATES}


def by_of(client: Any) -> str:
    """The `by` the service records: the token's name over TLS with tokens."""
    return "ada" if client.flavour.endswith("mtls") else "tester"


def test_submit_get_wait_and_watch(client: Any, tmp_path: Path) -> None:
    run = client.runs.submit(WRITE, vars={"who": "py"}, title="first")
    assert run.project == client.settings.project and run.run_id
    done = client.runs.wait(run, timeout=30)
    assert done.state == TaskState.COMPLETED, done
    assert client.runs.get(run.run_id).node("a").state.name == "SUCCEEDED"
    assert client.store.get(f"docs/{run.run_id}/a.txt") == b"hello py"
    events = list(client.runs.watch(run))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].type == "task.created" and events[0].data["vars"] == {"who": "py"}
    assert events[-1].type == "task.completed"
    later = list(client.runs.watch(run, from_seq=3))
    assert [e.seq for e in later] == [e.seq for e in events[2:]]
    # A graph file's path works as well as a dict (JSON is YAML).
    graph = tmp_path / "graph.yaml"
    graph.write_text(
        "nodes:\n  - {id: a, type: write_file, path: 'docs/{{run_id}}/y.txt', content: yaml}\n"
    )
    from_file = client.runs.wait(client.runs.submit(graph), timeout=30)
    assert from_file.state == TaskState.COMPLETED
    assert client.store.get(f"docs/{from_file.run_id}/y.txt") == b"yaml"


def test_submit_is_idempotent_and_ids_conflict(client: Any) -> None:
    first = client.runs.submit(WRITE, vars={"who": "x"}, request_id="same-request")
    again = client.runs.submit(WRITE, vars={"who": "x"}, request_id="same-request")
    assert first.run_id == again.run_id
    with pytest.raises(ConflictError) as e:
        client.runs.submit(WRITE, vars={"who": "x"}, run_id=first.run_id)
    assert e.value.reason == "exists" and e.value.metadata["run_id"] == first.run_id
    with pytest.raises(InvalidArgumentError) as bad:
        client.runs.submit(
            {"nodes": [{"id": "a", "type": "write_file", "path": "../x", "content": "x"}]}
        )
    assert bad.value.reason == "invalid_graph" and "relative" in bad.value.hint


def test_list_pages_search_and_time_bounds(client: Any) -> None:
    before = datetime.now(timezone.utc) - timedelta(seconds=5)
    ids = [
        client.runs.submit(WRITE, vars={"who": str(i)}, title=f"listed {i}").run_id
        for i in range(3)
    ]
    client.runs.submit(WRITE, title="other")
    for rid in ids:
        client.runs.wait(rid, timeout=30)
    found = [r.run_id for r in client.runs.list(search="listed", page_size=1)]
    assert sorted(found) == sorted(ids) and len(found) == 3  # three pages of one
    assert len(list(client.runs.list(page_size=2))) == 4
    assert len(list(client.runs.list(since=before))) == 4
    assert list(client.runs.list(until=before)) == []
    assert len(list(client.runs.list(states=[TaskState.COMPLETED]))) >= 3
    assert list(client.runs.list(states=[TaskState.CANCELED])) == []


def test_gates_notes_approve_and_reject(client: Any) -> None:
    run = client.runs.submit(GATED)
    blocked = client.runs.wait(run, until=BLOCKED, timeout=30)
    assert blocked.state == TaskState.INPUT_REQUIRED
    assert [g.id for g in blocked.blocked_gates] == ["check"]
    with pytest.raises(TimeoutError):  # it waits for a human: no end within half a second
        client.runs.wait(run, timeout=0.5)
    note = client.runs.note(run, "a is fine", by="tester")
    assert note.ref.startswith("shared/human-notes.md#") and note.seq > 0
    approved = client.runs.approve(run, note="ship it", by="tester")
    gate = next(g for g in approved.gates if g.id == "check")
    assert gate.state == GateState.APPROVED and gate.decided_by == by_of(client)
    assert client.runs.wait(run, timeout=30).state == TaskState.COMPLETED
    types = [e.type for e in client.runs.watch(run)]
    assert "human.note" in types and "gate.approved" in types

    other = client.runs.submit(GATED)
    client.runs.wait(other, until=BLOCKED, timeout=30)
    rejected = client.runs.reject(other, "check", note="no", by="tester")
    assert next(g for g in rejected.gates if g.id == "check").state == GateState.REJECTED
    assert client.runs.wait(other, timeout=30).state == TaskState.FAILED
    with pytest.raises(ValueError, match="no gate is blocked"):
        client.runs.approve(other)


def test_cancel_resume_rework_rerun_and_context(client: Any) -> None:
    run = client.runs.submit(GATED)
    client.runs.wait(run, until=BLOCKED, timeout=30)
    assert client.runs.edit_context(run, "attachments: []\n") > 0
    canceled = client.runs.cancel(run, reason="not needed")
    assert client.runs.wait(run, timeout=30).state == TaskState.CANCELED, canceled
    with pytest.raises(FailedPreconditionError) as e:
        client.runs.resume(run)
    assert e.value.reason == "wrong_state" and e.value.hint

    done = client.runs.wait(client.runs.submit(WRITE, vars={"who": "r"}), timeout=30)
    reworked = client.runs.rework(done, "a", note="again")
    assert reworked.run_id == done.run_id
    deadline = time.monotonic() + 30
    while client.runs.get(done).node("a").attempts < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.runs.wait(done, timeout=30).state == TaskState.COMPLETED
    assert client.runs.get(done).node("a").attempts == 2
    # WatchRun without follow ends at the run's first end; the stored events go on.
    assert any(e.type == "artifact.rework-requested" for e in client.store.events(done))

    again = client.runs.rerun(done, vars={"who": "second"})
    assert again.run_id != done.run_id and again.rerun_of == done.run_id
    assert client.runs.wait(again, timeout=30).state == TaskState.COMPLETED
    assert client.store.get(f"docs/{again.run_id}/a.txt") == b"hello second"


def test_resume_of_a_failed_run(client: Any) -> None:
    # A sandbox_run node that fails the first time and succeeds once a marker is in place.
    graph = {
        "nodes": [
            {
                "id": "flaky",
                "type": "sandbox_run",
                "language": "python",
                "input_files": ["docs/gate/"],
                "code": "import os, sys\nsys.exit(0 if os.path.exists("
                "'/input/docs/gate/open') else 3)\n",
            }
        ]
    }
    client.store.put("docs/gate/placeholder", b"x")
    run = client.runs.submit(graph)
    assert client.runs.wait(run, timeout=60).state == TaskState.FAILED
    client.store.put("docs/gate/open", b"1")
    client.runs.resume(run, reason="marker written")
    assert client.runs.wait(run, timeout=60).state == TaskState.COMPLETED


def test_logs_follow_a_sandbox_node(client: Any) -> None:
    graph = {
        "nodes": [
            {
                "id": "talk",
                "type": "sandbox_run",
                "language": "python",
                "code": "for i in range(3):\n    print('line', i, flush=True)\n",
            }
        ]
    }
    run = client.runs.submit(graph)
    chunks = list(client.runs.logs(run, follow=True, timeout=60))
    out = b"".join(c.data for c in chunks if c.node_id == "talk" and c.stream.name == "STDOUT")
    assert out == b"line 0\nline 1\nline 2\n", chunks
    assert any(c.end and c.outcome == "succeeded" for c in chunks)
    assert client.runs.wait(run, timeout=30).state == TaskState.COMPLETED
    # Logs of one node, after its end, without follow.
    assert b"line 2" in b"".join(c.data for c in client.runs.logs(run, node="talk", follow=False))


def test_whoami_and_unknown_run(client: Any) -> None:
    me = client.runs.whoami()
    if client.flavour.endswith("mtls"):
        assert (me.name, me.role, me.tokens_required) == ("ada", "admin", True)
    else:
        assert (me.name, me.role) == ("local", "admin")
    with pytest.raises(NotFoundError) as e:
        client.runs.get("no-such-run")
    assert e.value.reason == "not_found" and e.value.metadata["run_id"] == "no-such-run"
    assert "cairn runs list" in e.value.hint
