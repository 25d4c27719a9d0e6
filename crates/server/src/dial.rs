//! Client TLS that follows its files: every new connection of a channel is made with the
//! certificate, key and CA bundle as they are on disk then (read again only when one of them
//! changed). Connections already open keep theirs. A replacement that does not load is logged
//! with the file it names and the previous material stays in use.

use std::sync::{Arc, Mutex};

use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::reload::{invalid, mismatch, signature, Material, Signature, TlsPaths};
use crate::tls::{TlsError, HANDSHAKE_TIMEOUT};

/// Dials TLS connections for a channel (see [`crate::connect_named`]).
#[derive(Clone)]
pub(crate) struct Dialer {
    paths: TlsPaths,
    server_name: Option<String>,
    current: Arc<Mutex<(Signature, Arc<ClientConfig>)>>,
}

impl Dialer {
    /// Loads the files once; an error here is the caller's error.
    pub(crate) fn new(paths: TlsPaths, server_name: Option<&str>) -> Result<Dialer, TlsError> {
        let seen = signature(&paths);
        let config = Arc::new(client_config(&paths)?);
        Ok(Dialer {
            paths,
            server_name: server_name.map(str::to_owned),
            current: Arc::new(Mutex::new((seen, config))),
        })
    }

    /// The configuration for a new connection: the files again when they changed.
    fn config(&self) -> Arc<ClientConfig> {
        let now = signature(&self.paths);
        let mut current = match self.current.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        if current.0 != now {
            current.0 = now;
            match client_config(&self.paths) {
                Ok(config) => {
                    tracing::info!(cert = %self.paths.cert.display(), "TLS client files reloaded; new connections use them");
                    current.1 = Arc::new(config);
                }
                Err(e) => tracing::error!(
                    error = %e,
                    "TLS client reload failed; new connections still use the previous files"
                ),
            }
        }
        current.1.clone()
    }

    /// A TLS connection to the host and port of `uri`, verified for the server name given or
    /// the host dialled.
    pub(crate) async fn dial(
        self,
        uri: http::Uri,
    ) -> Result<hyper_util::rt::TokioIo<TlsStream<TcpStream>>, std::io::Error> {
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
        let host = uri
            .host()
            .ok_or_else(|| invalid(format!("{uri} names no host")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let name = self.server_name.clone().unwrap_or_else(|| host.clone());
        let name = ServerName::try_from(name).map_err(|e| invalid(e.to_string()))?;
        let tcp = TcpStream::connect((host.as_str(), port)).await?;
        // Without it Nagle delays HTTP/2 window updates and streamed Puts crawl.
        tcp.set_nodelay(true)?;
        let connector = tokio_rustls::TlsConnector::from(self.config());
        let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, tcp))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")
            })??;
        Ok(hyper_util::rt::TokioIo::new(tls))
    }
}

/// The client configuration the files give: servers must present a certificate a CA of the
/// bundle signed for the name dialled; we present ours. HTTP/2 only, as gRPC.
fn client_config(paths: &TlsPaths) -> Result<ClientConfig, TlsError> {
    let Material { chain, key, roots } = Material::read(paths)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("certificate", &paths.cert, e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| mismatch(paths, e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
