"""The async client: a file in and out of the store, a sandbox run and session, an ingest, and a
run followed to its end. Needs CAIRN_ADDR (the address `cairn up` prints)."""

from __future__ import annotations

import asyncio

from cairn_client import AsyncClient, CairnError, TaskState


async def main() -> None:
    async with AsyncClient.from_env() as cairn:
        put = await cairn.store.put("docs/tour/data.csv", b"a,b\n1,2\n", overwrite=True)
        print("stored", put.path, put.sha256[:12])
        print("read back", await cairn.store.get("docs/tour/data.csv"))
        async for entry in cairn.store.ls("docs/tour"):
            print("listed", entry.path, entry.size)

        result = await cairn.sandbox.run(
            "print(open('/input/data.csv').read().count('\\n'))",
            inputs={"data.csv": await cairn.store.get("docs/tour/data.csv")},
        )
        print("sandbox printed", result.stdout.decode().strip())
        async with cairn.sandbox.session() as s:
            await s.write("hello.sh", "echo hello from a session\n")
            print((await s.exec("bash hello.sh")).stdout.decode().strip())

        manifest = await cairn.ingest(
            "```python file=tour/hi.py\nprint('hi')\n```\n", run="tour-ingest"
        )
        print("ingest wrote", manifest.written, "of", manifest.total_blocks, "blocks")

        graph = {
            "nodes": [
                {"id": "a", "type": "write_file", "path": "docs/{{run_id}}/a.txt", "content": "a"}
            ]
        }
        run = await cairn.runs.submit(graph)
        async for event in cairn.runs.watch(run):
            print("event", event.seq, event.type)
        done = await cairn.runs.wait(run, timeout=60)
        assert done.state == TaskState.COMPLETED
        try:
            await cairn.store.put("../outside.txt", b"x")
        except CairnError as e:
            print("refused:", e.reason, "-", e.hint)


if __name__ == "__main__":
    asyncio.run(main())
