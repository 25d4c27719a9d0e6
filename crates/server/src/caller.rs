//! Who is calling: the identity a verified client certificate names (SAN URI
//! `cairn://<identity>`), `local` for an in-process connection or a plaintext one (loopback,
//! or a listener started with `--insecure-listen`) on a host that requires no credential, and
//! the peer's address. Put into every request's
//! extensions by [`crate::access`]; services read it with [`Caller::of`].

use std::net::SocketAddr;

use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::tls::IDENTITY_URI_SCHEME;

/// The name recorded for plaintext callers.
pub const LOCAL: &str = "local";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// A plaintext connection: the single-user default, trusted with everything.
    Local,
    /// The identity of a certificate the server's CA signed (or of an admin token, which acts
    /// as `cli` on a host that requires tokens).
    Service(String),
    /// A plaintext connection to a host that requires tokens: it reaches only the services
    /// that check the token themselves (the orchestrator) and the probes.
    Anonymous,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub principal: Principal,
    pub peer: Option<SocketAddr>,
}

/// Why a connection carries no usable identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unidentified {
    /// TLS without a client certificate (the handshake normally refuses this first).
    NoCertificate,
    /// A certificate the CA signed but that names no `cairn://` identity.
    NoIdentity,
    /// A certificate with more than one `cairn://` URI.
    SeveralIdentities,
}

impl Caller {
    /// The caller of a gRPC request; `local` when it came through no cairn host (in-process).
    pub fn of<T>(request: &tonic::Request<T>) -> Caller {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or(Caller {
                principal: Principal::Local,
                peer: request.remote_addr(),
            })
    }

    /// Reads the connection information tonic put into an HTTP request's extensions.
    pub(crate) fn from_extensions(ext: &http::Extensions) -> Result<Caller, Unidentified> {
        if let Some(tls) = ext.get::<TlsConnectInfo<TcpConnectInfo>>() {
            let peer = tls.get_ref().remote_addr();
            let certs = tls.peer_certs().ok_or(Unidentified::NoCertificate)?;
            let leaf = certs.first().ok_or(Unidentified::NoCertificate)?;
            let identity = cached_identity_of(leaf.as_ref())?;
            return Ok(Caller {
                principal: Principal::Service(identity),
                peer,
            });
        }
        let peer = ext
            .get::<TcpConnectInfo>()
            .and_then(TcpConnectInfo::remote_addr);
        // In-process connections and plaintext ones are told apart by the access layer.
        Ok(Caller {
            principal: Principal::Local,
            peer,
        })
    }

    /// The identity's name (`local` for plaintext callers).
    pub fn name(&self) -> &str {
        match &self.principal {
            Principal::Local => LOCAL,
            Principal::Service(name) => name,
            Principal::Anonymous => "anonymous",
        }
    }

    /// Whether this is the given certificate identity (plaintext callers are none).
    pub fn is(&self, identity: &str) -> bool {
        matches!(&self.principal, Principal::Service(name) if name == identity)
    }

    /// Whether the caller is trusted as the single local user (in-process, or plaintext on a
    /// host that requires no credential).
    pub fn is_local(&self) -> bool {
        self.principal == Principal::Local
    }

    /// The peer address for logs ("unknown" when not a TCP connection).
    pub fn peer_text(&self) -> String {
        self.peer
            .map(|p| p.to_string())
            .unwrap_or_else(|| "unknown".to_owned())
    }
}

/// [`identity_of`] through a small cache keyed by the certificate's bytes: every call of a
/// connection presents the same certificate, and parsing it each time costs more than the
/// lookup. A verified certificate's bytes fully determine the identity, so the cache can
/// never answer for another certificate.
fn cached_identity_of(der: &[u8]) -> Result<String, Unidentified> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    const ENTRIES: usize = 256;
    type Cache = HashMap<Vec<u8>, Result<String, Unidentified>>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(hit) = cache.lock().ok().and_then(|c| c.get(der).cloned()) {
        return hit;
    }
    let identity = identity_of(der);
    if let Ok(mut c) = cache.lock() {
        if c.len() >= ENTRIES {
            c.clear();
        }
        c.insert(der.to_vec(), identity.clone());
    }
    identity
}

/// The identity a DER certificate names: its one SAN URI `cairn://<identity>`. A certificate
/// with several `cairn://` URIs names no single identity and is refused, whichever of them
/// would be valid.
pub fn identity_of(der: &[u8]) -> Result<String, Unidentified> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|_| Unidentified::NoIdentity)?;
    let san = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .ok_or(Unidentified::NoIdentity)?;
    let mut uris = san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::URI(uri) => uri.strip_prefix(IDENTITY_URI_SCHEME),
            _ => None,
        });
    match (uris.next(), uris.next()) {
        (Some(id), None) if is_identity_name(id) => Ok(id.to_owned()),
        (Some(_), Some(_)) => Err(Unidentified::SeveralIdentities),
        _ => Err(Unidentified::NoIdentity),
    }
}

/// Identity names: lowercase letters, digits and `-`, 1-63 characters.
pub fn is_identity_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair, SanType};

    /// A self-signed certificate (DER) with these SAN URIs beside a DNS name.
    fn cert_naming(uris: &[&str]) -> Vec<u8> {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        for uri in uris {
            params
                .subject_alt_names
                .push(SanType::URI((*uri).try_into().unwrap()));
        }
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn a_certificate_names_exactly_one_valid_identity_or_none() {
        let named = |uris: &[&str]| identity_of(&cert_naming(uris));
        assert_eq!(named(&["cairn://ingest"]), Ok("ingest".to_owned()));
        assert_eq!(
            named(&["https://cli.example/", "cairn://cli"]),
            Ok("cli".to_owned())
        );
        assert_eq!(
            named(&["cairn://cli", "cairn://orchestrator"]),
            Err(Unidentified::SeveralIdentities)
        );
        // One of them invalid: still two names, still refused.
        assert_eq!(
            named(&["cairn://cli", "cairn://Admin"]),
            Err(Unidentified::SeveralIdentities)
        );
        assert_eq!(named(&["cairn://Admin"]), Err(Unidentified::NoIdentity));
        assert_eq!(
            named(&["https://cli.example/"]),
            Err(Unidentified::NoIdentity)
        );
        assert_eq!(named(&[]), Err(Unidentified::NoIdentity));
        assert_eq!(
            identity_of(b"not a certificate"),
            Err(Unidentified::NoIdentity)
        );
        // The cache answers as the parse does, each certificate for itself.
        let console = cert_naming(&["cairn://console"]);
        let two = cert_naming(&["cairn://a", "cairn://b"]);
        for _ in 0..2 {
            assert_eq!(cached_identity_of(&console), Ok("console".to_owned()));
            assert_eq!(
                cached_identity_of(&two),
                Err(Unidentified::SeveralIdentities)
            );
        }
    }

    #[test]
    fn identity_names_are_1_to_63_lowercase_letters_digits_and_dashes() {
        for good in ["a", "7", "-", "sandbox-runner-2", &"a".repeat(63)] {
            assert!(is_identity_name(good), "{good}");
        }
        for bad in [
            "",
            "Cli",
            "cli_1",
            "cli.x",
            "cli/x",
            "cli x",
            "é",
            &"a".repeat(64),
        ] {
            assert!(!is_identity_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_caller_is_named_by_its_kind_and_only_plaintext_is_local() {
        let peer = Some("127.0.0.1:4000".parse().unwrap());
        let ingest = Caller {
            principal: Principal::Service("ingest".into()),
            peer,
        };
        assert_eq!(ingest.name(), "ingest");
        assert!(ingest.is("ingest") && !ingest.is("cli") && !ingest.is_local());
        assert_eq!(ingest.peer_text(), "127.0.0.1:4000");
        let local = Caller {
            principal: Principal::Local,
            peer: None,
        };
        assert_eq!(
            (local.name(), local.peer_text().as_str()),
            (LOCAL, "unknown")
        );
        assert!(local.is_local() && !local.is(LOCAL));
        let anonymous = Caller {
            principal: Principal::Anonymous,
            peer,
        };
        assert_eq!(anonymous.name(), "anonymous");
        assert!(!anonymous.is_local() && !anonymous.is("anonymous"));

        // A request that came through no host is the local user's; else the host's caller.
        assert_eq!(Caller::of(&tonic::Request::new(())), local);
        let mut req = tonic::Request::new(());
        req.extensions_mut().insert(ingest.clone());
        assert_eq!(Caller::of(&req), ingest);
    }
}
