//! LLM providers are the operator's choice: a request or graph picks a provider of the
//! orchestrator's `[llm.providers.<name>]` by name; a URL it names itself is refused unless
//! `llm.allow_request_llm_urls`, and even then gets no key configured for another URL;
//! `replay:` reads a cassette from the run's project through the store (pathguard, a size
//! cap), never a file of the host, and no error quotes a file.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "support/fake_openai.rs"]
mod fake_openai;

use cairn_orchestrator::Config;
use cairn_proto::v1::{SubmitRunRequest, TaskState};
use common::*;
use fake_openai::{completion, FakeOpenAi};
use tonic::Code;

tokio::task_local! {
    /// The `[llm]` section (TOML) of the stack a test starts.
    static LLM_TOML: String;
}

/// Environment variable holding the orchestrator's own key in these tests.
const KEY_ENV: &str = "CAIRN_TEST_ORCHESTRATOR_LLM_KEY";
const KEY: &str = "sk-orchestrator-secret-0123456789";

fn from_toml(c: &mut Config) {
    let text = LLM_TOML.try_with(|t| t.clone()).unwrap_or_default();
    c.llm = toml::from_str(&text).unwrap_or_else(|e| panic!("[llm] section: {e}\n{text}"));
    c.llm.initial_backoff_ms = 5;
    c.llm.max_backoff_ms = 20;
    c.llm.max_attempts = 1;
}

/// A stack whose `[llm]` section is `llm_toml`; the orchestrator's key is in `KEY_ENV`.
async fn stack(llm_toml: &str) -> Stack {
    std::env::set_var(KEY_ENV, KEY);
    LLM_TOML
        .scope(
            llm_toml.to_owned(),
            Stack::start(Options {
                ingest: false,
                tweak: from_toml,
                ..Default::default()
            }),
        )
        .await
}

const GRAPH: &str = "nodes:\n  - {id: writer, type: agent_task, prompt: write it, path: \"docs/{{run_id}}/out.md\"}\n";

fn request(graph: &str, llm: &str) -> SubmitRunRequest {
    SubmitRunRequest {
        project_id: PROJECT.into(),
        graph_yaml: graph.into(),
        llm: llm.into(),
        by: "tester".into(),
        ..Default::default()
    }
}

fn reason(s: &tonic::Status) -> String {
    cairn_proto::reason::of(s).unwrap_or_default()
}

/// Every file of the project's records, as text (to search for what must not be there).
async fn records(s: &Stack) -> String {
    let mut all = String::new();
    for path in s.list(".cairn").await {
        if let Some(bytes) = s.read(&path).await {
            all.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    all
}

#[tokio::test]
async fn a_request_url_is_refused_by_default_and_the_server_never_sees_the_key() {
    let capture = FakeOpenAi::start(vec![], Some(completion("exfiltrated"))).await;
    let s = stack(&format!("api_key_env = \"{KEY_ENV}\"\nmodel = \"m\"\n")).await;
    let url = capture.llm();
    let bare = format!("{}#m", capture.base_url);
    let graph_llm = format!("llm: \"{url}\"\n{GRAPH}");
    let node_llm =
        format!("nodes:\n  - {{id: writer, type: agent_task, prompt: hi, llm: \"{url}\"}}\n");
    for (graph, llm) in [
        (GRAPH, url.as_str()),
        (GRAPH, bare.as_str()),
        (graph_llm.as_str(), ""),
        (node_llm.as_str(), ""),
    ] {
        let e = s.submit_req(request(graph, llm)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{llm} {graph}: {e:?}");
        assert!(
            e.message().contains("allow_request_llm_urls")
                && e.message().contains("[llm.providers."),
            "{}",
            e.message()
        );
        if !graph.contains("type: agent_task, prompt: hi") {
            // Run- and graph-level settings are refused by the provider rule itself.
            assert_eq!(reason(&e), "llm_url_not_allowed", "{e:?}");
        }
    }
    assert!(
        capture.authorizations().is_empty(),
        "the URL was called: {:?}",
        capture.authorizations()
    );
    assert!(s.list(".cairn/runs").await.is_empty());
    s.stop().await;
}

#[tokio::test]
async fn an_allowed_request_url_gets_no_key_configured_for_another_url() {
    let capture = FakeOpenAi::start(vec![], Some(completion("answer from the URL"))).await;
    let s = stack(&format!(
        "api_key_env = \"{KEY_ENV}\"\nmodel = \"m\"\nallow_request_llm_urls = true\n\
         [providers.hosted]\nbase_url = \"https://llm.example.invalid/v1\"\nmodel = \"big\"\napi_key_env = \"{KEY_ENV}\"\n"
    ))
    .await;
    let run = s
        .submit_req(request(GRAPH, &capture.llm()))
        .await
        .unwrap()
        .run_id;
    let info = s.wait_final(&run, 60).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    assert!(s
        .read_text(&format!("docs/{run}/out.md"))
        .await
        .contains("answer from the URL"));
    assert_eq!(capture.authorizations(), vec![None], "no key for this URL");
    assert!(!records(&s).await.contains(KEY));
    s.stop().await;
}

#[tokio::test]
async fn replay_of_host_files_is_refused_and_their_content_appears_nowhere() {
    let s = stack("").await;
    // A host file with a recognisable secret.
    let marker = "SECRET-MARKER-7f3a9c";
    let secret = s.dir.path().join("shadow");
    std::fs::write(
        &secret,
        format!(
            "root:{marker}:19000:0:99999:7:::\nanswers: [{{node: writer, content: {marker}}}]\n"
        ),
    )
    .unwrap();
    let abs = format!("replay:{}", secret.display());
    let cases = [
        (abs.clone(), "absolute_path"),
        ("replay:/etc/passwd".to_owned(), "absolute_path"),
        ("replay:../shadow".to_owned(), "traversal"),
        ("replay:graphs/../../shadow".to_owned(), "traversal"),
    ];
    for (llm, want) in &cases {
        let e = s.submit_req(request(GRAPH, llm)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{llm}: {e:?}");
        assert_eq!(reason(&e), *want, "{llm}: {e:?}");
        assert!(
            !e.message().contains(marker) && !e.message().contains("root:"),
            "{llm}: {}",
            e.message()
        );
        assert!(
            e.message().contains("path in the run's project"),
            "{}",
            e.message()
        );
        // The graph's own `llm:` follows the same rule.
        let graph = format!("llm: \"{llm}\"\n{GRAPH}");
        let e = s.submit_req(request(&graph, "")).await.unwrap_err();
        assert_eq!(reason(&e), *want, "graph llm {llm}: {e:?}");
        assert!(!e.message().contains(marker), "{}", e.message());
    }
    // A project file that is not a cassette: position and kind, never its text.
    put_file(
        &s.store,
        "docs/notes.txt",
        format!("first line\nroot:{marker}:0:0\n").as_bytes(),
    )
    .await;
    put_file(
        &s.store,
        "docs/keys.yaml",
        format!("answers:\n  - {{node: writer, {marker}: 1, content: x}}\n").as_bytes(),
    )
    .await;
    for path in ["docs/notes.txt", "docs/keys.yaml"] {
        let e = s
            .submit_req(request(GRAPH, &format!("replay:{path}")))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert_eq!(reason(&e), "malformed_cassette", "{e:?}");
        assert!(!e.message().contains(marker), "{}", e.message());
        assert!(e.message().contains("line "), "{}", e.message());
    }
    assert!(s.list(".cairn/runs").await.is_empty());
    assert!(!records(&s).await.contains(marker));
    s.stop().await;
}

#[tokio::test]
async fn a_cassette_over_the_cap_is_refused_without_being_read() {
    let s = stack("").await;
    put_file(&s.store, "docs/small.txt", b"x").await;
    // 64 GiB of holes, in the store's own data root: reading (or hashing) it whole takes
    // many minutes and gigabytes; the size the store reports first decides.
    let huge = s
        .dir
        .path()
        .join("data/projects")
        .join(PROJECT)
        .join("docs/huge.yaml");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(64 << 30)
        .unwrap();
    let started = std::time::Instant::now();
    let e = s
        .submit_req(request(GRAPH, "replay:docs/huge.yaml"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(reason(&e), "too_large", "{e:?}");
    assert!(e.message().contains("16 MiB"), "{}", e.message());
    // Generous: refusing takes milliseconds, reading 64 GiB takes many minutes.
    assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
    // Over the cap inline too.
    let big = format!("answers: []\n#{}\n", "x".repeat(17 << 20));
    let e = s
        .submit_req(request(GRAPH, &inline_cassette(big.as_bytes())))
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "too_large", "{e:?}");
    s.stop().await;
}

const CASSETTE: &str = "answers:\n  - {node: writer, content: \"from the demo cassette\"}\n";

#[tokio::test]
async fn a_replay_provider_by_name_reads_its_cassette_from_the_project() {
    let s = stack("[providers.demo]\nkind = \"replay\"\ncassette = \"docs/cassettes/demo.yaml\"\n")
        .await;
    // Not there yet: refused at submit, naming the path.
    let e = s.submit_req(request(GRAPH, "demo")).await.unwrap_err();
    assert_eq!(reason(&e), "cassette_not_found", "{e:?}");
    assert!(
        e.message().contains("docs/cassettes/demo.yaml"),
        "{}",
        e.message()
    );
    put_file(&s.store, "docs/cassettes/demo.yaml", CASSETTE.as_bytes()).await;
    // By name in the request, and as the graph's `llm:` with the explicit prefix.
    for (graph, llm) in [
        (GRAPH.to_owned(), "demo"),
        (format!("llm: provider:demo\n{GRAPH}"), ""),
    ] {
        let run = s.submit_req(request(&graph, llm)).await.unwrap().run_id;
        let info = s.wait_final(&run, 60).await;
        assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
        assert!(s
            .read_text(&format!("docs/{run}/out.md"))
            .await
            .contains("from the demo cassette"));
        let created = s.events(&run).await;
        let created = created.iter().find(|e| e.r#type == "task.created").unwrap();
        assert_eq!(data(created)["llm"], "provider:demo");
    }
    // An unknown name lists the configured ones.
    let e = s.submit_req(request(GRAPH, "nope")).await.unwrap_err();
    assert_eq!(reason(&e), "unknown_llm_provider", "{e:?}");
    assert!(e.message().contains("demo"), "{}", e.message());
    s.stop().await;
}

#[tokio::test]
async fn an_openai_provider_by_name_gets_its_key_and_only_its_key() {
    let server = FakeOpenAi::start(vec![], Some(completion("from the named provider"))).await;
    let local_env = "CAIRN_TEST_LOCAL_PROVIDER_KEY";
    std::env::set_var(local_env, "sk-local-provider");
    let s = stack(&format!(
        "api_key_env = \"{KEY_ENV}\"\nallow_request_llm_urls = true\n\
         [providers.local]\nbase_url = \"{}\"\nmodel = \"local-model\"\napi_key_env = \"{local_env}\"\n",
        server.base_url
    ))
    .await;
    let run = s.submit_req(request(GRAPH, "local")).await.unwrap().run_id;
    let info = s.wait_final(&run, 60).await;
    assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
    assert!(s
        .read_text(&format!("docs/{run}/out.md"))
        .await
        .contains("from the named provider"));
    assert_eq!(server.requests()[0]["model"], "local-model");
    // A request naming the same base URL gets the key configured for it (and not [llm]'s).
    let run = s
        .submit_req(request(
            GRAPH,
            &format!("openai:{}/#other", server.base_url),
        ))
        .await
        .unwrap()
        .run_id;
    assert_eq!(
        s.wait_final(&run, 60).await.state,
        TaskState::Completed as i32
    );
    assert_eq!(
        server.authorizations(),
        vec![
            Some("Bearer sk-local-provider".to_owned()),
            Some("Bearer sk-local-provider".to_owned())
        ]
    );
    assert_eq!(server.requests()[1]["model"], "other");
    s.stop().await;
}

#[tokio::test]
async fn default_llm_is_the_implicit_default_provider() {
    let server = FakeOpenAi::start(vec![], Some(completion("from the default"))).await;
    LLM_TOML
        .scope(format!("api_key_env = \"{KEY_ENV}\"\n"), async {
            std::env::set_var(KEY_ENV, KEY);
            let url = server.llm();
            let s = Stack::start(Options {
                ingest: false,
                tweak: |c| {
                    from_toml(c);
                    c.default_llm = DEFAULT_URL.try_with(|u| u.clone()).unwrap_or_default();
                },
                ..Default::default()
            });
            let s = DEFAULT_URL.scope(url, s).await;
            let run = s.submit_req(request(GRAPH, "")).await.unwrap().run_id;
            let info = s.wait_final(&run, 60).await;
            assert_eq!(info.state, TaskState::Completed as i32, "{info:#?}");
            // The operator configured this URL: [llm].api_key_env's key goes there.
            assert_eq!(server.authorizations(), vec![Some(format!("Bearer {KEY}"))]);
            let events = s.events(&run).await;
            let created = events.iter().find(|e| e.r#type == "task.created").unwrap();
            assert_eq!(data(created)["llm"], "provider:default");
            s.stop().await;
        })
        .await;
}

tokio::task_local! {
    static DEFAULT_URL: String;
}
