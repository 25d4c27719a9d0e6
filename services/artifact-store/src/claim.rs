//! Ingest claims: the capability a run's driver hands the ingest service so that ingest may
//! write for that run. A claim is the store's own statement "run R of project P, epoch E, may
//! write under these prefixes until T", keyed with HMAC-SHA256 under a secret only the store
//! holds. It replaces a fence (a run id and a small epoch number anyone who can read the run's
//! `events.epoch` knows): the run, epoch and prefixes a write is checked against come from the
//! verified claim, never from the request.
//!
//! The key lives in `<data_root>/claim.key` (mode 0600, outside every project, so no RPC reads
//! it) and survives a restart of the store, so the claims of runs under way stay valid;
//! removing the file voids every claim at the next start.
//!
//! May depend on: error; never on an operation module.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use base64::Engine as _;
use hmac::{Hmac, KeyInit as _, Mac as _};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::error::{Error, Result};

/// Version prefix of claims (a later format gets another).
const PREFIX: &str = "c1";
/// The key's file beneath the data root.
pub const KEY_FILE: &str = "claim.key";
/// How long a claim lasts when the request does not say.
pub const DEFAULT_TTL_S: u32 = 600;
/// The longest a claim may last.
pub const MAX_TTL_S: u32 = 3600;
/// Longest claim text looked at (a real one is a few hundred bytes).
const MAX_CLAIM_BYTES: usize = 4096;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// What a verified claim grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    #[serde(rename = "p")]
    pub project: String,
    #[serde(rename = "r")]
    pub run: String,
    #[serde(rename = "e")]
    pub epoch: u64,
    /// Path prefixes, each ending in `/`.
    #[serde(rename = "a")]
    pub prefixes: Vec<String>,
    /// Expiry, milliseconds since the Unix epoch.
    #[serde(rename = "x")]
    pub expires_ms: u64,
    /// Makes every claim distinct.
    #[serde(rename = "n")]
    nonce: String,
}

impl Claim {
    /// Whether the claim lets a write land at `path`.
    pub fn allows(&self, path: &str) -> bool {
        self.prefixes.iter().any(|p| path.starts_with(p.as_str()))
    }
}

/// Why a claim is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not a claim this store made (malformed, forged, or made with another key).
    Invalid,
    /// Made by this store, but its time is over.
    Expired,
}

/// The store's claim key.
pub struct ClaimKey {
    key: [u8; 32],
}

impl std::fmt::Debug for ClaimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClaimKey(..)")
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn random_bytes() -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key
}

impl ClaimKey {
    /// A key held in memory only (tests).
    #[cfg(test)]
    pub fn ephemeral() -> ClaimKey {
        ClaimKey {
            key: random_bytes(),
        }
    }

    /// Reads `<data_root>/claim.key`, making it (mode 0600, atomically) when missing.
    pub fn load_or_create(data_root: &Path) -> Result<ClaimKey> {
        let path = data_root.join(KEY_FILE);
        if !path.exists() {
            // Written whole beside it, then linked: a concurrent start reads a whole key.
            let temp = data_root.join(format!(".cairn-tmp-{KEY_FILE}.{}", uuid::Uuid::new_v4()));
            let made = (|| {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&temp)?;
                f.write_all(format!("{}\n", hex::encode(random_bytes())).as_bytes())?;
                f.sync_all()?;
                match std::fs::hard_link(&temp, &path) {
                    Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
                    _ => {}
                }
                std::fs::File::open(data_root)?.sync_all()
            })();
            let _ = std::fs::remove_file(&temp);
            made.map_err(|e| Error::io(format!("writing the claim key {}", path.display()), e))?;
        }
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|e| Error::io(format!("reading the claim key {}", path.display()), e))?;
        if !meta.is_file() {
            return Err(Error::Config(format!(
                "{} is not a regular file; remove it (the store makes a new claim key)",
                path.display()
            )));
        }
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(Error::Config(format!(
                "the claim key {} is readable by other users; make it private: chmod 600 {}",
                path.display(),
                path.display()
            )));
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::io(format!("reading the claim key {}", path.display()), e))?;
        let key = hex::decode(text.trim())
            .ok()
            .and_then(|k| <[u8; 32]>::try_from(k).ok())
            .ok_or_else(|| {
                Error::Config(format!(
                    "{} is not a claim key (64 hex digits); remove it and the store makes a new one (claims issued before become invalid)",
                    path.display()
                ))
            })?;
        Ok(ClaimKey { key })
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        #[allow(clippy::expect_used)]
        Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC accepts any key length")
    }

    /// A claim on `run` of `project` at `epoch`, writing under `prefixes`, until `expires_ms`.
    pub fn issue(
        &self,
        project: &str,
        run: &str,
        epoch: u64,
        prefixes: Vec<String>,
        expires_ms: u64,
    ) -> String {
        let claim = Claim {
            project: project.to_owned(),
            run: run.to_owned(),
            epoch,
            prefixes,
            expires_ms,
            nonce: hex::encode(&random_bytes()[..16]),
        };
        let body = B64.encode(serde_json::to_vec(&claim).unwrap_or_default());
        let mut mac = self.mac();
        mac.update(PREFIX.as_bytes());
        mac.update(b".");
        mac.update(body.as_bytes());
        let tag = B64.encode(mac.finalize().into_bytes());
        format!("{PREFIX}.{body}.{tag}")
    }

    /// The claim `text` grants, if this store made it and it has not expired at `now_ms`.
    /// The tag is compared in constant time.
    pub fn verify(&self, text: &str, now_ms: u64) -> Result<Claim, Refused> {
        if text.len() > MAX_CLAIM_BYTES {
            return Err(Refused::Invalid);
        }
        let mut parts = text.split('.');
        let (Some(PREFIX), Some(body), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Refused::Invalid);
        };
        let tag = B64.decode(tag).map_err(|_| Refused::Invalid)?;
        let mut mac = self.mac();
        mac.update(PREFIX.as_bytes());
        mac.update(b".");
        mac.update(body.as_bytes());
        mac.verify_slice(&tag).map_err(|_| Refused::Invalid)?;
        let claim: Claim = B64
            .decode(body)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(Refused::Invalid)?;
        if claim.expires_ms <= now_ms {
            return Err(Refused::Expired);
        }
        Ok(claim)
    }
}

/// Where an ingest claim on `run` may write: `workspace/` and the run's ingest manifests,
/// narrowed to `asked` when given (each must lie inside one of those).
pub fn ingest_prefixes(run: &str, asked: &[String]) -> Result<Vec<String>, String> {
    let scope = [
        "workspace/".to_owned(),
        format!(".cairn/runs/{run}/ingest/"),
    ];
    if asked.is_empty() {
        return Ok(scope.to_vec());
    }
    asked
        .iter()
        .map(|a| {
            let p = format!("{}/", a.trim_end_matches('/'));
            let inside = scope.iter().any(|s| p.starts_with(s.as_str()));
            let bad = p.split('/').any(|c| c == ".." || c == ".") || p.starts_with('/');
            if inside && !bad {
                Ok(p)
            } else {
                Err(format!(
                    "allowed prefix {a:?} is not inside an ingest claim's scope ({} or {}); narrow to a prefix inside one of them",
                    scope[0], scope[1]
                ))
            }
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_accepted_only_as_issued_and_until_it_expires() {
        let key = ClaimKey::ephemeral();
        let prefixes = ingest_prefixes("r1", &[]).unwrap();
        let t = key.issue("p", "r1", 3, prefixes.clone(), 10_000);
        let c = key.verify(&t, 9_999).unwrap();
        assert_eq!(
            (c.project.as_str(), c.run.as_str(), c.epoch),
            ("p", "r1", 3)
        );
        assert!(c.allows("workspace/a.py") && c.allows(".cairn/runs/r1/ingest/n.json"));
        assert!(!c.allows(".cairn/runs/r1/task.yaml") && !c.allows("docs/x.md"));
        assert!(!c.allows(".cairn/runs/r10/ingest/n.json"));
        assert_eq!(key.verify(&t, 10_000), Err(Refused::Expired));
        assert_ne!(t, key.issue("p", "r1", 3, prefixes.clone(), 10_000));
        // Another store's key, or a body changed after issue (another run, a later epoch).
        assert_eq!(ClaimKey::ephemeral().verify(&t, 0), Err(Refused::Invalid));
        let mut parts: Vec<&str> = t.split('.').collect();
        let mut forged = c.clone();
        forged.epoch = 4;
        forged.run = "r2".into();
        let body = B64.encode(serde_json::to_vec(&forged).unwrap());
        parts[1] = &body;
        assert_eq!(key.verify(&parts.join("."), 0), Err(Refused::Invalid));
        for bad in [
            "",
            "3",
            "c1",
            "c1..",
            "c2.x.y",
            &format!("{t}.x"),
            &"c".repeat(5000),
        ] {
            assert_eq!(key.verify(bad, 0), Err(Refused::Invalid), "{bad}");
        }
    }

    #[test]
    fn prefixes_only_narrow_the_ingest_scope() {
        assert_eq!(
            ingest_prefixes("r", &["workspace/src".into()]).unwrap(),
            ["workspace/src/"]
        );
        for bad in [
            "docs",
            ".cairn/runs/r/",
            ".cairn/runs/s/ingest",
            "workspace/../docs",
            "/workspace",
        ] {
            assert!(ingest_prefixes("r", &[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_key_survives_a_restart_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let a = ClaimKey::load_or_create(dir.path()).unwrap();
        let t = a.issue("p", "r", 1, vec!["workspace/".into()], u64::MAX);
        let b = ClaimKey::load_or_create(dir.path()).unwrap();
        assert!(
            b.verify(&t, 0).is_ok(),
            "a restarted store accepts its live claims"
        );
        let path = dir.path().join(KEY_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(ClaimKey::load_or_create(dir.path()).is_err());
    }
}
