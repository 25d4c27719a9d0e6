//! Server TLS that follows its files: the certificate, key and CA bundle are read again on
//! SIGHUP and when any of them changes on disk (polled), without a restart. Each connection
//! is accepted with the configuration current when it arrives; connections already open keep
//! theirs. A replacement that does not load (bad PEM, a key that does not match the
//! certificate, an empty CA bundle) is logged with the file it names and the previous
//! configuration stays in use.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::Stream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::tls::{TlsError, HANDSHAKE_TIMEOUT};

/// How often the files are checked for changes unless a host says otherwise.
pub const POLL_EVERY: Duration = Duration::from_secs(3);

/// Where a server's TLS material lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPaths {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// What the poll compares: a file replaced by rename changes inode, one rewritten in place
/// changes mtime or size.
pub(crate) type Signature = Vec<Option<(u64, u64, i64, i64, u64)>>;

pub(crate) fn signature(paths: &TlsPaths) -> Signature {
    [&paths.cert, &paths.key, &paths.ca]
        .into_iter()
        .map(|p| {
            std::fs::metadata(p)
                .ok()
                .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
        })
        .collect()
}

/// The server configuration in use, and where to read its replacement.
pub struct ReloadingTls {
    paths: TlsPaths,
    current: RwLock<Arc<ServerConfig>>,
    seen: Mutex<Signature>,
}

impl std::fmt::Debug for ReloadingTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingTls")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl ReloadingTls {
    /// Loads the files once; an error here is a start-up error.
    pub fn new(paths: TlsPaths) -> Result<ReloadingTls, TlsError> {
        let seen = signature(&paths);
        let config = server_config(&paths)?;
        Ok(ReloadingTls {
            paths,
            current: RwLock::new(Arc::new(config)),
            seen: Mutex::new(seen),
        })
    }

    /// The configuration new connections are accepted with.
    pub fn current(&self) -> Arc<ServerConfig> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Reads the files again; on success new connections use them, on failure nothing changes.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = Arc::new(server_config(&self.paths)?);
        match self.current.write() {
            Ok(mut c) => *c = config,
            Err(poisoned) => *poisoned.into_inner() = config,
        }
        Ok(())
    }

    /// Takes the files as they are now as seen.
    fn remember(&self) {
        let now = signature(&self.paths);
        match self.seen.lock() {
            Ok(mut s) => *s = now,
            Err(poisoned) => *poisoned.into_inner() = now,
        }
    }

    /// Reloads when a file changed since the last check; `None` when none did.
    pub fn reload_if_changed(&self) -> Option<Result<(), TlsError>> {
        let now = signature(&self.paths);
        {
            let mut seen = match self.seen.lock() {
                Ok(s) => s,
                Err(poisoned) => poisoned.into_inner(),
            };
            if *seen == now {
                return None;
            }
            // Remembered even when loading fails: a broken file is reported once, and the
            // next change (the fix, or the second file of a pair) is tried again.
            *seen = now;
        }
        Some(self.reload())
    }

    fn logged(&self, why: &str, result: Result<(), TlsError>) {
        match result {
            Ok(()) => tracing::info!(
                cert = %self.paths.cert.display(),
                why,
                "TLS certificate, key and CA bundle reloaded; new connections use them"
            ),
            Err(e) => tracing::error!(
                error = %e,
                why,
                "TLS reload failed; still serving the previous certificate"
            ),
        }
    }

    /// Reloads on SIGHUP and whenever the files change (checked `every`), until aborted.
    pub fn watch(self: Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut hup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let hup_received = async {
                    match hup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tick.tick() => {
                        if let Some(result) = self.reload_if_changed() {
                            self.logged("files changed", result);
                        }
                    }
                    Some(()) = hup_received => {
                        // Remembered first, so the poll does not load the same files again.
                        self.remember();
                        let result = self.reload();
                        self.logged("SIGHUP", result);
                    }
                }
            }
        })
    }
}

/// TLS connections accepted on `listener`, each with the configuration current when it
/// arrived. Handshakes run concurrently; failed ones are dropped. Stops accepting when the
/// stream is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<ReloadingTls>,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => return,
            };
            let tcp = match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Without it Nagle delays HTTP/2 window updates and streamed Puts crawl.
            let _ = tcp.set_nodelay(true);
            let acceptor = TlsAcceptor::from(tls.current());
            let tx = tx.clone();
            tokio::spawn(async move {
                let peer = tcp.peer_addr().ok();
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(?peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(?peer, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

pub(crate) fn invalid(what: &'static str, path: &Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::Invalid {
        what,
        path: path.to_owned(),
        why: why.to_string(),
    }
}

/// Certificates of a PEM file; at least one.
fn certificates(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(what, path, e))?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            path: path.to_owned(),
            expected: "CERTIFICATE",
        });
    }
    Ok(certs)
}

/// What the files hold: our certificate chain and key, and the CA bundle.
pub(crate) struct Material {
    pub(crate) chain: Vec<CertificateDer<'static>>,
    pub(crate) key: PrivateKeyDer<'static>,
    pub(crate) roots: RootCertStore,
}

impl Material {
    pub(crate) fn read(paths: &TlsPaths) -> Result<Material, TlsError> {
        let chain = certificates(&paths.cert, "certificate")?;
        let key_pem = read(&paths.key, "key")?;
        let key =
            PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| invalid("key", &paths.key, e))?;
        let mut roots = RootCertStore::empty();
        for ca in certificates(&paths.ca, "CA certificate")? {
            roots
                .add(ca)
                .map_err(|e| invalid("CA certificate", &paths.ca, e))?;
        }
        Ok(Material { chain, key, roots })
    }
}

/// The error of a key that does not go with its certificate (or is unusable).
pub(crate) fn mismatch(paths: &TlsPaths, e: rustls::Error) -> TlsError {
    invalid(
        "key",
        &paths.key,
        format!("does not go with {}: {e}", paths.cert.display()),
    )
}

/// The server configuration the files give: our certificate, and clients must present one a
/// CA of the bundle signed. HTTP/2 only, as gRPC.
pub fn server_config(paths: &TlsPaths) -> Result<ServerConfig, TlsError> {
    let Material { chain, key, roots } = Material::read(paths)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| invalid("CA certificate", &paths.ca, e))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("certificate", &paths.cert, e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| mismatch(paths, e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
