"""LangGraph peer of the orchestrator benchmark (bench/orchestrator.sh).

The same three N-node graphs as bench/src/bin/orchestrator_load.rs, on LangGraph with its
SQLite checkpointer and durability="sync" (every step's checkpoint is committed before the
next step starts):

- chain:  N nodes in a chain doing no I/O, each adding its output to the state;
- write:  N nodes in a chain, each writing 4 KiB durably (temp file, fsync, rename, fsync of
          the directory: what the artifact-store does for a Put) and adding {path, sha256};
- fanout: one node fanning out N `Send`s to a node that writes 4 KiB durably.

Time: app.invoke() wall clock (graph compiled beforehand). Size: the SQLite database
(with its WAL) after the run. Prints one JSON line per scenario.
"""

import argparse
import hashlib
import json
import operator
import os
import sqlite3
import statistics
import tempfile
import time
from typing import Annotated, TypedDict

from importlib.metadata import version

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

BLOCK = b"x" * 4096


class State(TypedDict):
    results: Annotated[list, operator.add]


def durable_write(path: str, data: bytes) -> str:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return hashlib.sha256(data).hexdigest()


def chain_graph(n: int, out: str) -> StateGraph:
    g = StateGraph(State)
    for i in range(n):
        g.add_node(f"c{i}", lambda s, i=i: {"results": [{"node": f"c{i}", "value": True}]})
    g.add_edge(START, "c0")
    for i in range(1, n):
        g.add_edge(f"c{i - 1}", f"c{i}")
    g.add_edge(f"c{n - 1}", END)
    return g


def write_graph(n: int, out: str) -> StateGraph:
    g = StateGraph(State)

    def node(i):
        def write(_s):
            path = os.path.join(out, f"w{i}.txt")
            sha = durable_write(path, BLOCK)
            return {"results": [{"node": f"w{i}", "path": path, "bytes": len(BLOCK), "sha256": sha}]}

        return write

    for i in range(n):
        g.add_node(f"w{i}", node(i))
    g.add_edge(START, "w0")
    for i in range(1, n):
        g.add_edge(f"w{i - 1}", f"w{i}")
    g.add_edge(f"w{n - 1}", END)
    return g


def fanout_graph(n: int, out: str) -> StateGraph:
    g = StateGraph(State)

    def fan(_s):
        return {}

    def write(arg):
        i = arg["i"]
        path = os.path.join(out, f"f{i}.txt")
        sha = durable_write(path, BLOCK)
        return {"results": [{"node": f"fan.{i}", "path": path, "bytes": len(BLOCK), "sha256": sha}]}

    g.add_node("fan", fan)
    g.add_node("write", write)
    g.add_edge(START, "fan")
    g.add_conditional_edges("fan", lambda _s: [Send("write", {"i": i}) for i in range(n)], ["write"])
    g.add_edge("write", END)
    return g


GRAPHS = {"chain": chain_graph, "write": write_graph, "fanout": fanout_graph}


def run_once(kind: str, n: int, work: str) -> tuple[float, int]:
    run_dir = tempfile.mkdtemp(dir=work, prefix=f"{kind}-")
    out = os.path.join(run_dir, "docs")
    os.makedirs(out)
    db = os.path.join(run_dir, "checkpoints.sqlite")
    conn = sqlite3.connect(db, check_same_thread=False)
    saver = SqliteSaver(conn)
    app = GRAPHS[kind](n, out).compile(checkpointer=saver)
    config = {"configurable": {"thread_id": kind}, "recursion_limit": n + 10}
    t0 = time.perf_counter()
    result = app.invoke({"results": []}, config=config, durability="sync")
    secs = time.perf_counter() - t0
    assert len(result["results"]) == n, len(result["results"])
    conn.close()
    size = sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p))
    return secs, size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", default=tempfile.gettempdir())
    ap.add_argument("--only", default="chain,write,fanout")
    args = ap.parse_args()
    for kind in args.only.split(","):
        runs = [run_once(kind, args.nodes, args.work) for _ in range(args.repeat)]
        secs = statistics.median(r[0] for r in runs)
        size = sorted(runs)[len(runs) // 2][1]
        print(
            json.dumps(
                {
                    "system": f"langgraph {version('langgraph')} + sqlite {version('langgraph-checkpoint-sqlite')}",
                    "scenario": kind,
                    "nodes": args.nodes,
                    "seconds": round(secs, 4),
                    "ms_per_node": round(secs * 1000 / args.nodes, 4),
                    "record_bytes": size,
                    "runs": [round(r[0], 3) for r in runs],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
