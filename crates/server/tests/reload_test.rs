//! A host over mutual TLS on loopback takes renewed certificates without a restart: calls on
//! open connections go on, new connections see the new certificate, and a broken replacement
//! leaves the previous one in use.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_server::pki::{self, PkiSpec};
use cairn_server::{Host, TlsConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

const SERVICE: &str = "artifact-store";

/// The leaf certificate (DER) of a PEM file.
fn leaf_of(path: &Path) -> Vec<u8> {
    CertificateDer::from_pem_file(path).unwrap().to_vec()
}

/// The leaf certificate the server at `addr` presents to a new connection (as `cli`).
async fn served_leaf(addr: &str, dir: &Path) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
        roots.add(ca.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_file(dir.join("cli.pem")).unwrap()],
            PrivateKeyDer::from_pem_file(dir.join("cli.key")).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// Writes `body` to `path` by rename, as a renewal does.
fn replace(path: &Path, body: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, body).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// New certificates for `identities` from the CA in `dir`, put in place by rename.
fn reissue(dir: &Path, identities: &[&str]) {
    let scratch = tempfile::tempdir().unwrap();
    for f in ["ca.pem", "ca.key"] {
        std::fs::copy(dir.join(f), scratch.path().join(f)).unwrap();
    }
    pki::init(&PkiSpec {
        identities: identities.iter().map(|s| (*s).to_owned()).collect(),
        ..PkiSpec::new(scratch.path())
    })
    .unwrap();
    for id in identities {
        for ext in ["pem", "key"] {
            let name = format!("{id}.{ext}");
            replace(
                &dir.join(&name),
                &std::fs::read(scratch.path().join(&name)).unwrap(),
            );
        }
    }
}

struct Served {
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), cairn_server::Error>>,
}

async fn serve(dir: &Path) -> Served {
    serve_polling(dir, Duration::from_millis(100)).await
}

async fn serve_polling(dir: &Path, every: Duration) -> Served {
    let mut host = Host::new();
    host.secure(SERVICE, &TlsConfig::dir(dir), false, &Default::default())
        .unwrap();
    host.tls_poll(every);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(host.serve(listener, async move {
        let _ = stopped.await;
    }));
    Served {
        addr,
        stop: Some(stop),
        task,
    }
}

fn channel(addr: &str, dir: &Path) -> tonic::transport::Channel {
    let tls = TlsConfig::dir(dir).load("cli").unwrap().unwrap();
    cairn_server::connect_tls(addr, Some(&tls)).unwrap()
}

async fn healthy(channel: tonic::transport::Channel) -> bool {
    cairn_server::serving(channel, "", Duration::from_secs(2))
        .await
        .unwrap_or(false)
}

async fn wait_up(addr: &str, dir: &Path) {
    for _ in 0..100 {
        if healthy(channel(addr, dir)).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the host never answered health over TLS");
}

/// Waits until a new connection is served `want`; false after 5 s.
async fn served_becomes(addr: &str, dir: &Path, want: &[u8]) -> bool {
    for _ in 0..100 {
        if served_leaf(addr, dir).await == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn stop(mut served: Served) {
    let _ = served.stop.take().unwrap().send(());
    served.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_certificates_are_served_to_new_connections_while_calls_go_on() {
    let pki_dir = tempfile::tempdir().unwrap();
    let dir = pki_dir.path();
    pki::init(&PkiSpec::new(dir)).unwrap();
    let served = serve(dir).await;
    wait_up(&served.addr, dir).await;
    let old = leaf_of(&dir.join(format!("{SERVICE}.pem")));
    assert_eq!(served_leaf(&served.addr, dir).await, old);

    // A client calling all along, on one channel opened before the renewal.
    let done = Arc::new(AtomicBool::new(false));
    let (calls, failures) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let caller = {
        let (done, calls, failures) = (done.clone(), calls.clone(), failures.clone());
        let ch = channel(&served.addr, dir);
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                if !healthy(ch.clone()).await {
                    failures.fetch_add(1, Ordering::SeqCst);
                }
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    pki::renew(dir, 30).unwrap();
    let new = leaf_of(&dir.join(format!("{SERVICE}.pem")));
    assert_ne!(new, old);
    assert!(
        served_becomes(&served.addr, dir, &new).await,
        "a new connection still gets the old certificate after the files were renewed"
    );
    // New clients with renewed certificates get through too.
    assert!(healthy(channel(&served.addr, dir)).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    done.store(true, Ordering::SeqCst);
    caller.await.unwrap();
    assert!(calls.load(Ordering::SeqCst) > 10, "too few calls made");
    assert_eq!(
        failures.load(Ordering::SeqCst),
        0,
        "calls failed during the renewal"
    );
    stop(served).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_replacement_keeps_the_old_certificate_and_a_later_fix_is_taken() {
    let pki_dir = tempfile::tempdir().unwrap();
    let dir = pki_dir.path();
    pki::init(&PkiSpec::new(dir)).unwrap();
    let served = serve(dir).await;
    wait_up(&served.addr, dir).await;
    let cert = dir.join(format!("{SERVICE}.pem"));
    let old = leaf_of(&cert);
    let good = std::fs::read(&cert).unwrap();

    replace(
        &cert,
        b"-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n",
    );
    // Several polls later the old certificate is still served, and calls work.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(served_leaf(&served.addr, dir).await, old);
    assert!(healthy(channel(&served.addr, dir)).await);

    // A certificate whose key is not beside it is refused as well.
    let scratch = tempfile::tempdir().unwrap();
    pki::init(&PkiSpec::new(scratch.path())).unwrap();
    replace(
        &cert,
        &std::fs::read(scratch.path().join(format!("{SERVICE}.pem"))).unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(served_leaf(&served.addr, dir).await, old);

    // The watcher survived both: a good renewal is taken.
    replace(&cert, &good);
    reissue(dir, &[SERVICE]);
    let new = leaf_of(&cert);
    assert!(served_becomes(&served.addr, dir, &new).await);
    stop(served).await;
}

#[test]
fn a_failed_reload_names_the_file_and_keeps_the_configuration() {
    let pki_dir = tempfile::tempdir().unwrap();
    let dir = pki_dir.path();
    pki::init(&PkiSpec::new(dir)).unwrap();
    let paths = TlsConfig::dir(dir)
        .load(SERVICE)
        .unwrap()
        .unwrap()
        .paths()
        .clone();
    let tls = cairn_server::reload::ReloadingTls::new(paths.clone()).unwrap();
    let before = tls.current();
    std::fs::write(&paths.key, "not a key").unwrap();
    let err = tls.reload().unwrap_err().to_string();
    assert!(err.contains(&paths.key.display().to_string()), "{err}");
    assert!(Arc::ptr_eq(&before, &tls.current()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_roll_over_with_an_overlap_bundle_keeps_serving() {
    let pki_dir = tempfile::tempdir().unwrap();
    let dir = pki_dir.path();
    pki::init(&PkiSpec::new(dir)).unwrap();
    let served = serve(dir).await;
    wait_up(&served.addr, dir).await;
    // The material of a client of the old CA only, kept aside.
    let old_client = tempfile::tempdir().unwrap();
    for f in ["ca.pem", "cli.pem", "cli.key"] {
        std::fs::copy(dir.join(f), old_client.path().join(f)).unwrap();
    }
    let open = channel(&served.addr, dir);
    assert!(healthy(open.clone()).await);
    // A channel made now and first used after the roll-over.
    let later = channel(&served.addr, dir);

    // 1. The new CA joins the trust bundle (and its key becomes the one that issues).
    let new_ca = tempfile::tempdir().unwrap();
    pki::init(&PkiSpec {
        identities: vec!["cli".into()],
        ..PkiSpec::new(new_ca.path())
    })
    .unwrap();
    let old_ca = std::fs::read(dir.join("ca.pem")).unwrap();
    let new_ca_pem = std::fs::read(new_ca.path().join("ca.pem")).unwrap();
    replace(&dir.join("ca.pem"), &[old_ca, new_ca_pem.clone()].concat());
    replace(
        &dir.join("ca.key"),
        &std::fs::read(new_ca.path().join("ca.key")).unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    // 2. Every leaf re-issued by the new CA.
    pki::renew(dir, 30).unwrap();
    let new = leaf_of(&dir.join(format!("{SERVICE}.pem")));
    assert!(served_becomes(&served.addr, dir, &new).await);
    assert!(healthy(channel(&served.addr, dir)).await);
    // 3. The old CA leaves the bundle: new-CA clients get through, old-CA ones no longer.
    replace(&dir.join("ca.pem"), &new_ca_pem);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(healthy(channel(&served.addr, dir)).await);
    assert!(!healthy(channel(&served.addr, old_client.path())).await);
    // A connection made before the roll-over keeps working.
    assert!(healthy(open).await);
    // A new connection of a channel made before reads the files as they are now.
    assert!(
        healthy(later).await,
        "a channel made before the roll-over still dials with the old files"
    );
    stop(served).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_at_once() {
    // Our own handler first: a SIGHUP before the host's would end the test process.
    let _hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).unwrap();
    let pki_dir = tempfile::tempdir().unwrap();
    let dir = pki_dir.path();
    pki::init(&PkiSpec::new(dir)).unwrap();
    let served = serve_polling(dir, Duration::from_secs(3600)).await;
    wait_up(&served.addr, dir).await;
    let old = leaf_of(&dir.join(format!("{SERVICE}.pem")));
    pki::renew(dir, 30).unwrap();
    let new = leaf_of(&dir.join(format!("{SERVICE}.pem")));
    // No poll comes for an hour: the old certificate stays until the signal.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(served_leaf(&served.addr, dir).await, old);
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(served_becomes(&served.addr, dir, &new).await);
    stop(served).await;
}
