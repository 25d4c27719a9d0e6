//! examples/ingest/hello_project.md ingests as documented: four files written (one empty, a
//! README carrying its own fence), three recorded and refused, the plain fence not recorded.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::Level;
use common::{request, Ingest, Store};

const EXAMPLE: &str = include_str!("../../../examples/ingest/hello_project.md");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_project_example() {
    let store = Store::start().await;
    let mut ingest = Ingest::start(common::config(&store.addr())).await;
    let reply = ingest
        .client
        .ingest(request("hello", "r1", EXAMPLE.as_bytes()))
        .await
        .unwrap()
        .into_inner();
    let got: Vec<(String, String, String)> = reply
        .artifacts
        .iter()
        .map(|a| {
            (
                a.declared_file.clone(),
                format!("{:?}", a.status()),
                a.reason.clone(),
            )
        })
        .collect();
    let want = [
        ("hello/greet.py", "Written", ""),
        ("hello/__init__.py", "Written", ""),
        ("tests/test_greet.py", "Written", ""),
        ("README.md", "Written", ""),
        ("hello/cli.py", "Skipped", "malformed_header"),
        ("../outside.py", "Rejected", "traversal"),
        (".env", "Rejected", "denied"),
    ];
    let want: Vec<(String, String, String)> = want
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        reply.level(),
        Level::Error,
        "a refused path is a safety refusal"
    );

    let files = store.workspace_files("hello");
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        [
            "README.md",
            "hello/__init__.py",
            "hello/greet.py",
            "tests/test_greet.py"
        ]
    );
    assert_eq!(files["hello/__init__.py"], b"");
    assert_eq!(
        files["README.md"],
        b"# hello\n\n```sh\npython -m pytest -q\n```\n"
    );
    assert!(!String::from_utf8_lossy(&store.events_text("hello", "r1")).contains("never-written"));

    // The written module works (when a Python is around).
    let ws = store.workspace("hello");
    let check = "from hello.greet import greet; assert greet('Ada') == 'Hello, Ada!'; assert greet(' ') == 'Hello, world!'";
    match std::process::Command::new("python3")
        .arg("-c")
        .arg(check)
        .current_dir(&ws)
        .status()
    {
        Ok(status) => assert!(status.success(), "the ingested module does not work"),
        Err(e) => println!("SKIP: python3 not runnable ({e}); files checked byte for byte above"),
    }
    ingest.server.stop().await;
}
