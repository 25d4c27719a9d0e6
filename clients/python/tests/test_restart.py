"""`watch` across a restart of the service: `cairn up` is killed while a run waits at a gate and
started again on the same data root and port; the watcher reconnects by itself and delivers
every event exactly once."""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Server, make_client, open_dir

from cairn_client import RetryPolicy, TaskState

GATED = {
    "nodes": [
        {"id": "a", "type": "write_file", "path": "docs/{{run_id}}/a.txt", "content": "a"},
        {"id": "check", "type": "gate", "reason": "restart first", "needs": ["a"]},
        {
            "id": "b",
            "type": "write_file",
            "path": "docs/{{run_id}}/b.txt",
            "content": "b",
            "needs": ["check"],
        },
    ]
}


@pytest.fixture
def own_server() -> Iterator[Server]:
    root = open_dir("cairn-py-restart-")
    server = Server(root)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("api", ["runs.watch", "store.events"])
def test_watch_resumes_after_a_restart(own_server: Server, flavour: str, api: str) -> None:
    retry = RetryPolicy(attempts=30, initial_backoff=0.05, max_backoff=0.5, reconnect_for=60)
    c, close = make_client(flavour, addr=own_server.addr, project="restart", retry=retry)
    try:
        run = c.runs.submit(GATED)
        assert (
            c.runs.wait(run, until={TaskState.INPUT_REQUIRED}, timeout=30).state
            == TaskState.INPUT_REQUIRED
        )
        seen: list[Any] = []
        failure: list[BaseException] = []
        before_kill = threading.Event()

        def watch() -> None:
            try:
                stream = (
                    c.runs.watch(run, follow=True)
                    if api == "runs.watch"
                    else c.store.events(run, follow=True)
                )
                for event in stream:
                    seen.append(event)
                    if event.type == "gate.blocked":
                        before_kill.set()
                    if event.type == "task.completed":
                        return
            except BaseException as e:  # reported by the test below
                failure.append(e)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        assert before_kill.wait(30), "the watcher saw no event before the restart"
        count_before = len(seen)
        own_server.stop(signal.SIGKILL)
        time.sleep(1.0)  # the watcher now reconnects against a closed port
        own_server.start()
        c.runs.approve(run, note="after the restart")
        watcher.join(60)
        assert not watcher.is_alive(), f"the watcher did not finish: {[e.type for e in seen]}"
        assert not failure, failure
        seqs = [e.seq for e in seen]
        assert seqs == list(range(1, len(seqs) + 1)), seqs  # no gap, no repeat
        assert len(seen) > count_before
        stored = [e.line for e in c.store.events(run)]
        assert [e.line for e in seen] == stored[: len(seen)]
        assert seen[-1].type == "task.completed"
        assert c.runs.get(run).state == TaskState.COMPLETED
    finally:
        close()
