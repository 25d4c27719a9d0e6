//! The access layer in front of a host, over mutual TLS on loopback: a certificate identity
//! reaches only the RPCs the table grants it; any other call is refused PERMISSION_DENIED
//! before it is routed, and the refusal is logged at warn with the identity.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cairn_server::pki::{self, PkiSpec};
use cairn_server::{Host, TlsConfig};
use tonic::Code;

/// Everything logged by this test binary.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs() -> &'static Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        logs
    })
}

/// The status of a unary call of `/cairn.v1.<rpc>` with an empty message.
async fn call(channel: tonic::transport::Channel, rpc: &str) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path: http::uri::PathAndQuery = format!("/cairn.v1.{rpc}").parse().unwrap();
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    match grpc.unary(tonic::Request::new(()), path, codec).await {
        Ok(_) => tonic::Status::ok(""),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_reach_only_what_the_table_grants_and_refusals_are_logged() {
    let logs = logs();
    let pki_dir = tempfile::tempdir().unwrap();
    pki::init(&PkiSpec::new(pki_dir.path())).unwrap();
    let tls = TlsConfig::dir(pki_dir.path());
    let mut host = Host::new();
    host.secure("ingest", &tls, false, &Default::default())
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(host.serve(listener, async move {
        let _ = stopped.await;
    }));
    let channel = |identity: &str| {
        let tls = tls.load(identity).unwrap().unwrap();
        cairn_server::connect_tls(&addr, Some(&tls)).unwrap()
    };
    // Up: health is open to every authenticated caller.
    let mut up = false;
    for _ in 0..100 {
        if cairn_server::serving(channel("console"), "", Duration::from_secs(2))
            .await
            .unwrap_or(false)
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "the host never answered health over mTLS");

    // Granted: past the layer, to the router (which serves no such service here).
    for (identity, rpc) in [
        ("orchestrator", "Ingest/SetEnabled"),
        ("cli", "ArtifactStore/Delete"),
        ("ingest", "ArtifactStore/Put"),
        ("console", "Orchestrator/ApproveGate"),
    ] {
        let s = call(channel(identity), rpc).await;
        assert_eq!(s.code(), Code::Unimplemented, "{identity} {rpc}: {s:?}");
    }
    // Not granted: refused before routing, naming the identity.
    for (identity, rpc) in [
        ("console", "ArtifactStore/Put"),
        ("console", "Ingest/SetEnabled"),
        ("ingest", "ArtifactStore/ClaimRun"),
        ("sandbox-runner", "ArtifactStore/Get"),
        ("artifact-store", "SandboxRunner/Run"),
    ] {
        let s = call(channel(identity), rpc).await;
        assert_eq!(s.code(), Code::PermissionDenied, "{identity} {rpc}: {s:?}");
        assert!(
            s.message()
                .contains(&format!("identity `{identity}` may not call")),
            "{}",
            s.message()
        );
        assert_eq!(cairn_proto::reason::of(&s).as_deref(), Some("identity"));
    }
    // tonic's own TLS (`endpoint` with the material, as the benches and etcd dial): the host's
    // certificate is trusted and the identity presented is the material's.
    let tonic_tls = |identity: &str| {
        let tls = tls.load(identity).unwrap().unwrap();
        cairn_server::endpoint(&addr, Some(&tls), None)
            .unwrap()
            .connect_lazy()
    };
    let s = call(tonic_tls("cli"), "ArtifactStore/Delete").await;
    assert_eq!(s.code(), Code::Unimplemented, "cli over tonic's TLS: {s:?}");
    let s = call(tonic_tls("console"), "ArtifactStore/Put").await;
    assert_eq!(
        s.code(),
        Code::PermissionDenied,
        "console over tonic's TLS: {s:?}"
    );
    assert!(
        s.message().contains("identity `console` may not call"),
        "{s:?}"
    );
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let refused: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("call refused"))
        .collect();
    assert!(
        refused.iter().any(|l| l.contains("WARN")
            && l.contains("identity=\"console\"")
            && l.contains("cairn.v1.ArtifactStore/Put")),
        "{text}"
    );
    assert_eq!(refused.len(), 6, "{text}");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
