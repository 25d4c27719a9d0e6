from cairn_client import Client

graph = {
    "vars": {"who": "world"},
    "nodes": [
        {
            "id": "hello",
            "type": "write_file",
            "path": "docs/{{run_id}}/hello.txt",
            "content": "hello {{vars.who}}",
        },
        {"id": "review", "type": "gate", "reason": "read hello.txt", "needs": ["hello"]},
    ],
}

with Client.from_env() as cairn:  # CAIRN_ADDR, CAIRN_TLS_DIR, CAIRN_TOKEN, CAIRN_PROJECT
    run = cairn.runs.submit(graph, vars={"who": "Python"})
    for event in cairn.runs.watch(run):  # live, until the run ends; resumes after a disconnect
        print(event.seq, event.type, event.node_id)
        if event.type == "gate.blocked":
            cairn.runs.approve(run, note="looks good")
    run = cairn.runs.wait(run)
    print(run.state.name, cairn.store.get(f"docs/{run.run_id}/hello.txt").decode())
