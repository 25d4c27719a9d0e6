//! The four services, each on a loopback listener of its own, as the cross-service tests start
//! them (security_test over mutual TLS, client_contract_test in plaintext).
#![allow(dead_code, clippy::unwrap_used)]

use cairn_server::TlsConfig;

/// Where the services listen; the directories live as long as this.
pub struct Services {
    pub store: String,
    pub ingest: String,
    pub runner: String,
    pub orchestrator: String,
    pub dirs: Vec<tempfile::TempDir>,
}

pub async fn listener() -> (tokio::net::TcpListener, String) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap().to_string();
    (l, a)
}

/// Starts the four services with `tls` (default: plaintext). The sandbox-runner uses the local
/// backend; a host without it logs why and the runner's port stays dark.
pub async fn start(tls: &TlsConfig) -> Services {
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();

    let (l, store) = listener().await;
    let mut c = cairn_artifact_store::Config::new(data.path());
    c.tls = tls.clone();
    tokio::spawn(cairn_artifact_store::serve(c, l, std::future::pending()));

    let (l, ingest) = listener().await;
    let c = cairn_ingest::Config {
        store_addr: store.clone(),
        tls: tls.clone(),
        ..cairn_ingest::Config::default()
    };
    tokio::spawn(cairn_ingest::serve(c, l, std::future::pending()));

    let (l, runner) = listener().await;
    let c = cairn_sandbox_runner::Config {
        backend: cairn_sandbox_runner::config::BackendChoice::Local,
        work_root: work.path().to_path_buf(),
        tls: tls.clone(),
        ..cairn_sandbox_runner::Config::default()
    };
    tokio::spawn(async move {
        if let Err(e) = cairn_sandbox_runner::serve(c, l, std::future::pending()).await {
            eprintln!("sandbox-runner did not start: {e}");
        }
    });

    let (l, orchestrator) = listener().await;
    let c = cairn_orchestrator::Config {
        store_addr: store.clone(),
        ingest_addr: ingest.clone(),
        sandbox_addrs: vec![runner.clone()],
        tls: tls.clone(),
        resume_on_start: false,
        ..cairn_orchestrator::Config::default()
    };
    tokio::spawn(cairn_orchestrator::serve(c, l, std::future::pending()));

    Services {
        store,
        ingest,
        runner,
        orchestrator,
        dirs: vec![data, work],
    }
}

/// Waits (up to about 10 s) until `channel` answers health; panics naming `what` otherwise.
pub async fn wait_serving(channel: tonic::transport::Channel, what: &str) {
    for _ in 0..200 {
        if cairn_server::serving(channel.clone(), "", std::time::Duration::from_secs(2))
            .await
            .unwrap_or(false)
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{what} never answered health");
}
