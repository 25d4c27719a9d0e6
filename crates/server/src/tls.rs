//! Transport security: mutual TLS from one PKI. Every cairn program reads the same settings —
//! a directory made by `cairn certs init` (`ca.pem`, `<identity>.pem`, `<identity>.key`) or
//! explicit `cert`/`key`/`ca` paths — and with them a server requires a client certificate
//! signed by the CA and a client verifies the server against the CA. rustls only; no OpenSSL.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

pub use crate::reload::TlsPaths;

/// The identities `cairn certs init` issues by default: cairn's programs, and `etcd`, which
/// serves the orchestrator replicas' membership with it (and is granted no cairn call).
pub const IDENTITIES: [&str; 7] = [
    "artifact-store",
    "ingest",
    "sandbox-runner",
    "orchestrator",
    "console",
    "cli",
    "etcd",
];

/// Where a certificate names its identity: a subject alternative name URI `cairn://<identity>`.
pub const IDENTITY_URI_SCHEME: &str = "cairn://";

/// How long a TLS handshake may take before the connection is dropped.
pub(crate) const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {}: {source} (make the files with `cairn certs init --out DIR`, or fix the path)", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {} holds no PEM {expected} (is it the right file?)", path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("{what} {}: {why}", path.display())]
    Invalid {
        what: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("TLS settings are incomplete: {0}")]
    Incomplete(String),
}

/// The `[tls]` section every service's configuration has (also `--tls-dir`, `CAIRN_TLS_DIR`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// A directory made by `cairn certs init`: `ca.pem`, `<identity>.pem`, `<identity>.key`.
    pub dir: Option<PathBuf>,
    /// This program's certificate (PEM); overrides `<dir>/<identity>.pem`.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM); overrides `<dir>/<identity>.key`.
    pub key: Option<PathBuf>,
    /// The CA that signs every peer (PEM); overrides `<dir>/ca.pem`.
    pub ca: Option<PathBuf>,
}

impl TlsConfig {
    /// Whether any TLS setting is given (then every connection is mutual TLS).
    pub fn is_set(&self) -> bool {
        self.dir.is_some() || self.cert.is_some() || self.key.is_some() || self.ca.is_some()
    }

    /// A directory setting alone.
    pub fn dir(dir: impl Into<PathBuf>) -> TlsConfig {
        TlsConfig {
            dir: Some(dir.into()),
            ..TlsConfig::default()
        }
    }

    /// Settings from flags/environment over these (each given one wins).
    pub fn overridden_by(&self, other: &TlsConfig) -> TlsConfig {
        TlsConfig {
            dir: other.dir.clone().or_else(|| self.dir.clone()),
            cert: other.cert.clone().or_else(|| self.cert.clone()),
            key: other.key.clone().or_else(|| self.key.clone()),
            ca: other.ca.clone().or_else(|| self.ca.clone()),
        }
    }

    /// The material of `identity` (whose files a directory holds), or `None` without TLS.
    pub fn load(&self, identity: &str) -> Result<Option<Tls>, TlsError> {
        if !self.is_set() {
            return Ok(None);
        }
        let pick = |explicit: &Option<PathBuf>, file: String, what: &'static str| {
            explicit
                .clone()
                .or_else(|| self.dir.as_ref().map(|d| d.join(file)))
                .ok_or_else(|| {
                    TlsError::Incomplete(format!(
                        "no {what}: give `dir` (--tls-dir) or the `{what}` path"
                    ))
                })
        };
        let cert = pick(&self.cert, format!("{identity}.pem"), "cert")?;
        let key = pick(&self.key, format!("{identity}.key"), "key")?;
        let ca = pick(&self.ca, "ca.pem".to_owned(), "ca")?;
        Ok(Some(Tls {
            identity: identity.to_owned(),
            cert_pem: read_pem(&cert, "certificate", "CERTIFICATE")?,
            key_pem: read_pem(&key, "key", "PRIVATE KEY")?,
            ca_pem: read_pem(&ca, "CA certificate", "CERTIFICATE")?,
            paths: TlsPaths { cert, key, ca },
        }))
    }
}

fn read_pem(path: &Path, what: &'static str, expected: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    let text = String::from_utf8_lossy(&bytes);
    if !text.contains("-----BEGIN ") || !text.contains(expected) {
        return Err(TlsError::Pem {
            what,
            path: path.to_owned(),
            expected,
        });
    }
    Ok(bytes)
}

/// One program's TLS material: its certificate and key, and the CA it trusts.
#[derive(Clone)]
pub struct Tls {
    identity: String,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    ca_pem: Vec<u8>,
    paths: TlsPaths,
}

impl std::fmt::Debug for Tls {
    // The key stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// The identity whose files were read.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The files the material was read from (a serving host reads them again when they change).
    pub fn paths(&self) -> &TlsPaths {
        &self.paths
    }

    /// Client side: the server must present a certificate signed by the CA for the host name
    /// dialled; we present ours.
    pub fn client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .assume_http2(true)
            .timeout(HANDSHAKE_TIMEOUT)
    }
}

/// Flags and variables for the `[tls]` section, shared by every command that serves or dials.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// Mutual TLS with the PKI in DIR (`cairn certs init --out DIR`): ca.pem, <identity>.pem,
    /// <identity>.key. Servers then require client certificates and refuse plaintext.
    #[arg(long, global = true, env = "CAIRN_TLS_DIR", value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// This program's certificate (PEM), instead of DIR/<identity>.pem.
    #[arg(long, global = true, env = "CAIRN_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM), instead of DIR/<identity>.key.
    #[arg(long, global = true, env = "CAIRN_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// The CA certificate (PEM), instead of DIR/ca.pem.
    #[arg(long, global = true, env = "CAIRN_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Serve plaintext on a non-loopback address anyway (without TLS anyone who reaches the
    /// port is trusted; a warning is logged at start).
    #[arg(long, global = true, env = "CAIRN_INSECURE_LISTEN")]
    pub insecure_listen: bool,
}

impl TlsArgs {
    /// The `[tls]` settings these flags give (unset flags give nothing).
    pub fn config(&self) -> TlsConfig {
        TlsConfig {
            dir: self.tls_dir.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            ca: self.tls_ca.clone(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn path(s: &str) -> Option<PathBuf> {
        Some(PathBuf::from(s))
    }

    #[test]
    fn any_one_setting_turns_tls_on_and_flags_override_the_file_one_by_one() {
        assert!(!TlsConfig::default().is_set());
        let none = TlsConfig::default;
        for one in [
            TlsConfig::dir("d"),
            TlsConfig {
                cert: path("c"),
                ..none()
            },
            TlsConfig {
                key: path("k"),
                ..none()
            },
            TlsConfig {
                ca: path("a"),
                ..none()
            },
        ] {
            assert!(one.is_set(), "{one:?}");
        }
        assert_eq!(TlsConfig::dir("d").dir, path("d"));
        let file = TlsConfig {
            dir: path("d"),
            cert: path("c"),
            key: None,
            ca: path("a"),
        };
        let flags = TlsConfig {
            dir: None,
            cert: path("c2"),
            key: path("k2"),
            ca: None,
        };
        assert_eq!(
            file.overridden_by(&flags),
            TlsConfig {
                dir: path("d"),
                cert: path("c2"),
                key: path("k2"),
                ca: path("a"),
            }
        );
        let args = TlsArgs {
            tls_dir: path("d"),
            tls_cert: path("c"),
            tls_key: path("k"),
            tls_ca: path("a"),
            insecure_listen: false,
        };
        assert_eq!(
            args.config(),
            TlsConfig {
                dir: path("d"),
                cert: path("c"),
                key: path("k"),
                ca: path("a"),
            }
        );
    }

    #[test]
    fn load_reads_the_identitys_files_and_refuses_wrong_or_missing_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        crate::pki::init(&crate::pki::PkiSpec::new(dir)).unwrap();
        assert!(TlsConfig::default().load("ingest").unwrap().is_none());

        let tls = TlsConfig::dir(dir).load("ingest").unwrap().unwrap();
        assert_eq!(tls.identity(), "ingest");
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        assert_eq!(
            (&tls.cert_pem, &tls.key_pem, &tls.ca_pem),
            (&read("ingest.pem"), &read("ingest.key"), &read("ca.pem"))
        );
        assert_eq!(tls.paths().cert, dir.join("ingest.pem"));
        assert_eq!(tls.paths().key, dir.join("ingest.key"));
        assert_eq!(tls.paths().ca, dir.join("ca.pem"));
        // Logs name the identity and never show the key.
        let shown = format!("{tls:?}");
        assert!(shown.contains("ingest"), "{shown}");
        assert!(
            !shown.contains("PRIVATE") && !shown.contains("key_pem"),
            "{shown}"
        );

        // An explicit path wins over the directory's file.
        let cli = TlsConfig {
            cert: Some(dir.join("cli.pem")),
            key: Some(dir.join("cli.key")),
            ..TlsConfig::dir(dir)
        };
        assert_eq!(
            cli.load("ingest").unwrap().unwrap().cert_pem,
            read("cli.pem")
        );

        // No directory and no key path: incomplete, naming what is missing.
        let incomplete = TlsConfig {
            cert: Some(dir.join("cli.pem")),
            ..TlsConfig::default()
        };
        let err = incomplete.load("cli").unwrap_err();
        assert!(
            matches!(&err, TlsError::Incomplete(m) if m.contains("no key")),
            "{err}"
        );

        // A certificate where the key belongs, a file of no PEM, a missing file.
        for (key, want) in [
            (dir.join("cli.pem"), "holds no PEM PRIVATE KEY"),
            (dir.join("missing.key"), "cannot read key"),
        ] {
            let wrong = TlsConfig {
                key: Some(key),
                ..TlsConfig::dir(dir)
            };
            let err = wrong.load("cli").unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
        std::fs::write(dir.join("junk.pem"), "CERTIFICATE but no PEM armour").unwrap();
        let junk = TlsConfig {
            ca: Some(dir.join("junk.pem")),
            ..TlsConfig::dir(dir)
        };
        let err = junk.load("cli").unwrap_err().to_string();
        assert!(err.contains("holds no PEM CERTIFICATE"), "{err}");
    }
}
