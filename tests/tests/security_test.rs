//! Trust boundaries over real mutual TLS on loopback: the four services each on a listener of
//! its own with its own certificate from one `cairn certs init` PKI. Every identity × RPC cell
//! is allowed or refused as the access table says; plaintext, certificate-less, expired and
//! foreign-CA clients get nothing; forged events, claims and record writes are refused; the
//! store stamps the authenticated identity on the events it accepts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::{
    put_request, AppendEventsRequest, ClaimRunRequest, CreateProjectRequest, EventInput, PutHeader,
    PutRequest, ReadEventsRequest, RunFence, StatRequest,
};
use cairn_server::pki::{self, PkiSpec};
use cairn_server::{Tls, TlsConfig};
use tonic::transport::Channel;
use tonic::Code;

/// Every RPC of cairn's four services (the access table's rows refer to these).
const STORE: &[&str] = &[
    "CreateProject",
    "ListProjects",
    "Put",
    "Get",
    "Stat",
    "List",
    "Delete",
    "AppendEvents",
    "ReadEvents",
    "ListRunSummaries",
    "ClaimRun",
    "GrantIngestClaim",
    "UpdateJson",
];
const INGEST: &[&str] = &["Parse", "Ingest", "SetEnabled", "GetEnabled"];
const RUNNER: &[&str] = &[
    "Run",
    "RunStream",
    "OpenSession",
    "Exec",
    "ReadFile",
    "WriteFile",
    "Glob",
    "Grep",
    "Pack",
    "CloseSession",
    "TouchSession",
    "GetRunnerInfo",
];
const ORCHESTRATOR: &[&str] = &[
    "SubmitRun",
    "GetRun",
    "ListRuns",
    "WatchRun",
    "CancelRun",
    "ResumeRun",
    "ApproveGate",
    "RejectGate",
    "AddNote",
    "RequestRework",
    "EditContext",
    "EditTask",
];

/// The table the services must enforce (docs/security.md), written out cell by cell.
fn expected(identity: &str, service: &str, method: &str) -> bool {
    let store_read = [
        "Get",
        "Stat",
        "List",
        "ListProjects",
        "ReadEvents",
        "ListRunSummaries",
    ];
    match (identity, service) {
        ("orchestrator", "ArtifactStore" | "Ingest" | "SandboxRunner") => true,
        // Replicas forward calls about a run to the one that drives it.
        ("orchestrator", "Orchestrator") => true,
        ("ingest", "ArtifactStore") => {
            store_read.contains(&method)
                || ["Put", "AppendEvents", "CreateProject"].contains(&method)
        }
        ("console", "ArtifactStore") => store_read.contains(&method),
        ("console", "Orchestrator") => true,
        ("cli", _) => true,
        _ => false,
    }
}

struct Deployment {
    pki: PathBuf,
    store: String,
    ingest: String,
    runner: String,
    orchestrator: String,
    _dirs: Vec<tempfile::TempDir>,
}

fn make_pki(dir: &Path) {
    pki::init(&PkiSpec::new(dir)).unwrap();
    // An identity the table does not know, from the same CA.
    pki::init(&PkiSpec {
        identities: vec!["stranger".into()],
        ..PkiSpec::new(dir)
    })
    .unwrap();
}

async fn deploy() -> Deployment {
    let pki_dir = tempfile::tempdir().unwrap();
    make_pki(pki_dir.path());
    let tls = TlsConfig::dir(pki_dir.path());
    let s = common::start(&tls).await;
    let pki = pki_dir.path().to_path_buf();
    let mut dirs = s.dirs;
    dirs.push(pki_dir);
    let d = Deployment {
        pki,
        store: s.store,
        ingest: s.ingest,
        runner: s.runner,
        orchestrator: s.orchestrator,
        _dirs: dirs,
    };
    // Every server answers health over mTLS before the test starts.
    for addr in [&d.store, &d.ingest, &d.runner, &d.orchestrator] {
        common::wait_serving(d.channel(addr, "cli"), &format!("{addr} (over mTLS)")).await;
    }
    d
}

impl Deployment {
    fn tls(&self, identity: &str) -> Tls {
        TlsConfig::dir(&self.pki).load(identity).unwrap().unwrap()
    }

    fn channel(&self, addr: &str, identity: &str) -> Channel {
        cairn_server::connect_tls(addr, Some(&self.tls(identity))).unwrap()
    }

    fn addr_of(&self, service: &str) -> &str {
        match service {
            "ArtifactStore" => &self.store,
            "Ingest" => &self.ingest,
            "SandboxRunner" => &self.runner,
            _ => &self.orchestrator,
        }
    }
}

/// Calls `/cairn.v1.<service>/<method>` with one empty message (valid for every request type)
/// and returns the status it ends with (Ok for a reply).
async fn call(channel: Channel, service: &str, method: &str) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.ok();
    let path: http::uri::PathAndQuery = format!("/cairn.v1.{service}/{method}").parse().unwrap();
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    let mut req = tonic::Request::new(tokio_stream::once(()));
    req.set_timeout(Duration::from_secs(10));
    match grpc.streaming(req, path, codec).await {
        Ok(resp) => {
            let mut s = resp.into_inner();
            match s.message().await {
                Ok(_) => tonic::Status::ok(""),
                Err(e) => e,
            }
        }
        Err(e) => e,
    }
}

fn refused_by_table(s: &tonic::Status) -> bool {
    s.code() == Code::PermissionDenied && s.message().contains("may not call")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_identity_gets_exactly_what_the_table_grants() {
    let d = deploy().await;
    let mut wrong = Vec::new();
    let identities = [
        "orchestrator",
        "ingest",
        "sandbox-runner",
        "console",
        "cli",
        "artifact-store",
        "stranger",
    ];
    for identity in identities {
        for (service, methods) in [
            ("ArtifactStore", STORE),
            ("Ingest", INGEST),
            ("SandboxRunner", RUNNER),
            ("Orchestrator", ORCHESTRATOR),
        ] {
            let ch = d.channel(d.addr_of(service), identity);
            for method in methods {
                let status = call(ch.clone(), service, method).await;
                let allowed = expected(identity, service, method);
                let denied = refused_by_table(&status);
                if allowed == denied || status.code() == Code::Unauthenticated {
                    wrong.push(format!(
                        "{identity} -> {service}/{method}: expected {}, got {:?} {:?}",
                        if allowed { "allowed" } else { "denied" },
                        status.code(),
                        status.message()
                    ));
                }
                if denied {
                    assert_eq!(
                        cairn_proto::reason::of(&status).as_deref(),
                        Some("identity"),
                        "a denial carries the reason word"
                    );
                }
            }
        }
    }
    assert!(wrong.is_empty(), "cells wrong:\n{}", wrong.join("\n"));
}

/// A client with a CA but no certificate of its own.
fn anonymous_channel(addr: &str, pki: &Path) -> Channel {
    let ca = std::fs::read(pki.join("ca.pem")).unwrap();
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca));
    tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plaintext_certificateless_expired_and_foreign_clients_are_refused() {
    let d = deploy().await;
    // An expired cli certificate from the deployment's own CA.
    let expired = tempfile::tempdir().unwrap();
    for f in ["ca.pem", "ca.key"] {
        std::fs::copy(d.pki.join(f), expired.path().join(f)).unwrap();
    }
    pki::init(&PkiSpec {
        identities: vec!["cli".into()],
        days: 1,
        backdate: time::Duration::days(3),
        ..PkiSpec::new(expired.path())
    })
    .unwrap();
    // A whole other PKI.
    let foreign = tempfile::tempdir().unwrap();
    pki::init(&PkiSpec::new(foreign.path())).unwrap();

    for addr in [&d.store, &d.ingest, &d.runner, &d.orchestrator] {
        let clients: Vec<(&str, Channel)> = vec![
            ("plaintext", cairn_server::connect(addr).unwrap()),
            ("no certificate", anonymous_channel(addr, &d.pki)),
            (
                "expired",
                cairn_server::connect_tls(
                    addr,
                    Some(&TlsConfig::dir(expired.path()).load("cli").unwrap().unwrap()),
                )
                .unwrap(),
            ),
            (
                "foreign CA",
                cairn_server::connect_tls(
                    addr,
                    Some(&TlsConfig::dir(foreign.path()).load("cli").unwrap().unwrap()),
                )
                .unwrap(),
            ),
        ];
        // Refused at the connection: how the client reports a handshake the server broke off
        // varies (UNAVAILABLE, CANCELLED, or INTERNAL "h2 protocol error" when a plaintext
        // client reads a TLS alert); never a reply, and never a status from a handler.
        for (what, ch) in clients {
            let s = call(ch, "ArtifactStore", "ListProjects").await;
            assert!(
                matches!(
                    s.code(),
                    Code::Unavailable
                        | Code::Unauthenticated
                        | Code::Unknown
                        | Code::Cancelled
                        | Code::Internal
                ),
                "{what} client to {addr} must be refused, got {:?} {}",
                s.code(),
                s.message()
            );
        }
    }
    // The deployment's own certificate works (the refusals above are not a broken server).
    let ok = call(d.channel(&d.store, "cli"), "ArtifactStore", "ListProjects").await;
    assert_eq!(ok.code(), Code::Ok, "{ok:?}");
}

/// A certificate of the deployment's CA with these SAN URIs, written as `<name>.pem`/`.key`
/// into `dir` next to a copy of the CA certificate, so `TlsConfig::dir(dir).load(name)` reads it.
fn cert_with_uris(pki: &Path, dir: &Path, name: &str, uris: &[&str]) {
    let ca_key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(pki.join("ca.key")).unwrap()).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(
        &std::fs::read_to_string(pki.join("ca.pem")).unwrap(),
        ca_key,
    )
    .unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    for uri in uris {
        params
            .subject_alt_names
            .push(rcgen::SanType::URI((*uri).try_into().unwrap()));
    }
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::copy(pki.join("ca.pem"), dir.join("ca.pem")).unwrap();
    std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_certificate_naming_two_identities_is_refused_whichever_is_valid() {
    let d = deploy().await;
    let dir = tempfile::tempdir().unwrap();
    cert_with_uris(
        &d.pki,
        dir.path(),
        "two",
        &["cairn://sandbox-runner", "cairn://cli"],
    );
    cert_with_uris(
        &d.pki,
        dir.path(),
        "bad-first",
        &["cairn://NOT_AN_ID", "cairn://cli"],
    );
    cert_with_uris(&d.pki, dir.path(), "one", &["cairn://cli"]);
    for name in ["two", "bad-first"] {
        let tls = TlsConfig::dir(dir.path()).load(name).unwrap().unwrap();
        for (addr, service, method) in [
            (&d.store, "ArtifactStore", "ListProjects"),
            (&d.runner, "SandboxRunner", "GetRunnerInfo"),
        ] {
            let ch = cairn_server::connect_tls(addr, Some(&tls)).unwrap();
            let s = call(ch, service, method).await;
            assert_eq!(
                s.code(),
                Code::Unauthenticated,
                "{name} to {service}: {s:?}"
            );
            if name == "two" {
                assert!(s.message().contains("more than one"), "{s:?}");
            }
        }
    }
    // The same CA's certificate with one identity works.
    let tls = TlsConfig::dir(dir.path()).load("one").unwrap().unwrap();
    let ok = call(
        cairn_server::connect_tls(&d.store, Some(&tls)).unwrap(),
        "ArtifactStore",
        "ListProjects",
    )
    .await;
    assert_eq!(ok.code(), Code::Ok, "{ok:?}");
}

/// etcd authorizes its clients by the subject's common name, cairn by the SAN URI: both must
/// name the same identity.
#[test]
fn certs_init_names_the_identity_in_the_common_name_too() {
    let dir = tempfile::tempdir().unwrap();
    pki::init(&PkiSpec::new(dir.path())).unwrap();
    for id in cairn_server::tls::IDENTITIES {
        let pem = std::fs::read(dir.path().join(format!("{id}.pem"))).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let cert = pem.parse_x509().unwrap();
        let cns: Vec<&str> = cert
            .subject()
            .iter_common_name()
            .map(|cn| cn.as_str().unwrap())
            .collect();
        assert_eq!(cns, vec![id], "{id}");
    }
}

fn append_req(run: &str, events: Vec<EventInput>, epoch: u64) -> AppendEventsRequest {
    AppendEventsRequest {
        project_id: "p".into(),
        run_id: run.into(),
        events,
        epoch,
        ..Default::default()
    }
}

fn event(kind: &str) -> EventInput {
    EventInput {
        r#type: kind.into(),
        data_json: r#"{"by":"mallory"}"#.into(),
        ..Default::default()
    }
}

async fn put(
    client: &mut ArtifactStoreClient<Channel>,
    path: &str,
    fence: Option<RunFence>,
) -> Result<(), tonic::Status> {
    put_claimed(client, path, fence, "").await
}

async fn put_claimed(
    client: &mut ArtifactStoreClient<Channel>,
    path: &str,
    fence: Option<RunFence>,
    claim: &str,
) -> Result<(), tonic::Status> {
    let header = PutHeader {
        project_id: "p".into(),
        path: path.into(),
        create_project: true,
        fence,
        claim: claim.into(),
        ..Default::default()
    };
    let msgs = vec![
        PutRequest {
            msg: Some(put_request::Msg::Header(header)),
        },
        PutRequest {
            msg: Some(put_request::Msg::Chunk(b"forged".to_vec().into())),
        },
    ];
    client.put(tokio_stream::iter(msgs)).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_records_claims_and_events_are_refused_and_accepted_ones_name_the_identity() {
    let d = deploy().await;
    let mut admin = ArtifactStoreClient::new(d.channel(&d.store, "cli"));
    admin
        .create_project(CreateProjectRequest {
            project_id: "p".into(),
        })
        .await
        .unwrap();
    // Without credentials: nothing at all.
    let mut anon = ArtifactStoreClient::new(anonymous_channel(&d.store, &d.pki));
    assert!(anon
        .append_events(append_req("r1", vec![event("gate.approved")], 0))
        .await
        .is_err());
    assert!(anon
        .claim_run(ClaimRunRequest {
            project_id: "p".into(),
            run_id: "r1".into(),
            holder: "mallory".into(),
        })
        .await
        .is_err());
    assert!(put(&mut anon, "docs/x.md", None).await.is_err());

    // The console may read, not write records, append or claim.
    let mut console = ArtifactStoreClient::new(d.channel(&d.store, "console"));
    let s = console
        .append_events(append_req("r1", vec![event("gate.approved")], 0))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied);
    let s = console
        .claim_run(ClaimRunRequest {
            project_id: "p".into(),
            run_id: "r1".into(),
            holder: "console".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied);

    // Ingest: not without an ingest claim (the run's epoch is no claim), not outside its
    // scopes, not another run's records; with the ingest claim the orchestrator was granted it
    // may write workspace/ and the claimed run's manifests.
    let mut orch = ArtifactStoreClient::new(d.channel(&d.store, "orchestrator"));
    let claim = orch
        .claim_run(ClaimRunRequest {
            project_id: "p".into(),
            run_id: "r1".into(),
            holder: "orchestrator-1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let fence = Some(RunFence {
        run_id: "r1".into(),
        epoch: claim.epoch,
    });
    let granted = orch
        .grant_ingest_claim(cairn_proto::v1::GrantIngestClaimRequest {
            project_id: "p".into(),
            run_id: "r1".into(),
            epoch: claim.epoch,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .claim;
    let mut ingest = ArtifactStoreClient::new(d.channel(&d.store, "ingest"));
    for (path, claimed, ok) in [
        ("workspace/a.py", "", false),
        ("workspace/a.py", granted.as_str(), true),
        (".cairn/runs/r1/ingest/n.json", &granted, true),
        (".cairn/runs/r1/task.yaml", &granted, false),
        (".cairn/runs/r2/ingest/n.json", &granted, false),
        ("docs/x.md", &granted, false),
    ] {
        let r = put_claimed(&mut ingest, path, fence.clone(), claimed).await;
        assert_eq!(r.is_ok(), ok, "ingest Put {path}: {r:?}");
        if let Err(s) = r {
            assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
            assert_eq!(cairn_proto::reason::of(&s).as_deref(), Some("identity"));
        }
    }
    // A caller's allowed_prefixes only narrow: ingest asking for docs/ still gets nothing there.
    let header = PutHeader {
        project_id: "p".into(),
        path: "docs/y.md".into(),
        allowed_prefixes: vec!["docs/".into()],
        fence: fence.clone(),
        claim: granted.clone(),
        ..Default::default()
    };
    let r = ingest
        .put(tokio_stream::iter(vec![PutRequest {
            msg: Some(put_request::Msg::Header(header)),
        }]))
        .await;
    assert_eq!(r.unwrap_err().code(), Code::PermissionDenied);
    for p in ["docs/x.md", "docs/y.md", ".cairn/runs/r1/task.yaml"] {
        let st = admin
            .stat(StatRequest {
                project_id: "p".into(),
                path: p.into(),
                include_sha256: false,
            })
            .await;
        assert_eq!(st.unwrap_err().code(), Code::NotFound, "{p} must not exist");
    }
    let s = ingest
        .append_events(append_req("r1", vec![event("ingest.done")], 0))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied);
    let s = ingest
        .append_events(append_req("r1", vec![event("ingest.done")], claim.epoch))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied);
    ingest
        .append_events(AppendEventsRequest {
            claim: granted.clone(),
            ..append_req("r1", vec![event("ingest.done")], 0)
        })
        .await
        .unwrap();
    orch.append_events(append_req("r1", vec![event("node.completed")], claim.epoch))
        .await
        .unwrap();
    // A client cannot forge the identity field.
    let s = orch
        .append_events(append_req(
            "r1",
            vec![EventInput {
                r#type: "x".into(),
                data_json: r#"{"identity":"cli"}"#.into(),
                ..Default::default()
            }],
            claim.epoch,
        ))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);

    let mut stream = admin
        .read_events(ReadEventsRequest {
            project_id: "p".into(),
            run_id: "r1".into(),
            from_seq: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    while let Some(e) = stream.message().await.unwrap() {
        let line: serde_json::Value = serde_json::from_str(&e.line_json).unwrap();
        seen.push((
            e.r#type.clone(),
            line["identity"].as_str().map(str::to_owned),
        ));
    }
    assert_eq!(
        seen,
        vec![
            ("ingest.done".to_owned(), Some("ingest".to_owned())),
            ("node.completed".to_owned(), Some("orchestrator".to_owned())),
        ],
        "exactly the accepted events, each naming who appended it"
    );
}

#[test]
fn certs_init_writes_a_pki_with_private_keys_and_named_identities() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let written = pki::init(&PkiSpec {
        dns: vec!["cairn.example.internal".into()],
        ..PkiSpec::new(dir.path())
    })
    .unwrap();
    assert_eq!(written.len(), 2 + 2 * cairn_server::tls::IDENTITIES.len());
    for id in cairn_server::tls::IDENTITIES {
        let info = pki::describe(&dir.path().join(format!("{id}.pem"))).unwrap();
        assert_eq!(info.identity.as_deref(), Some(id));
        for name in [
            id,
            "localhost",
            "127.0.0.1",
            "::1",
            "cairn.example.internal",
        ] {
            assert!(
                info.names.iter().any(|n| n == name),
                "{id}: {name} missing in {:?}",
                info.names
            );
        }
        let mode = std::fs::metadata(dir.path().join(format!("{id}.key")))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{id}.key must be private");
    }
    // A second init into the same directory refuses to replace identities.
    let e = pki::init(&PkiSpec::new(dir.path())).unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    assert!(pki::init(&PkiSpec {
        identities: vec!["Bad Name".into()],
        ..PkiSpec::new(tempfile::tempdir().unwrap().path())
    })
    .is_err());
}

#[tokio::test]
async fn plaintext_beyond_loopback_is_refused_unless_insecure_listen() {
    let public: std::net::SocketAddr = "10.20.30.40:7070".parse().unwrap();
    let e = cairn_server::check_listen(public, false, false).unwrap_err();
    assert!(e.to_string().contains("--tls-dir"), "{e}");
    assert!(e.to_string().contains("--insecure-listen"), "{e}");
    assert!(cairn_server::check_listen(public, true, false).is_ok());
    assert!(cairn_server::check_listen(public, false, true).is_ok());
    assert!(cairn_server::check_listen("127.0.0.1:7070".parse().unwrap(), false, false).is_ok());
    assert!(cairn_server::check_listen("[::1]:7070".parse().unwrap(), false, false).is_ok());
    assert!(cairn_server::check_listen_text("0.0.0.0:7070", false, false).is_err());
}
