mod common;
use common::*;
use cairn_proto::v1::TaskState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_file_chain_completes() {
    let s = Stack::start(Options::default()).await;
    let info = s
        .submit("title: t\nnodes:\n  - {id: a, type: write_file, path: docs/a.txt, content: 'hello {{run_id}}'}\n  - {id: b, type: write_file, path: docs/b.txt, content: 'a at {{nodes.a.path}}'}\n", &[])
        .await
        .unwrap();
    let done = s.wait_state(&info.run_id, TaskState::Completed, 20).await;
    println!("{done:#?}");
    println!("{:#?}", s.event_types(&info.run_id).await);
    assert_eq!(s.read_text("docs/b.txt").await, "a at docs/a.txt");
    s.stop().await;
}
