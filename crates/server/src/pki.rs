//! A working PKI for one deployment (`cairn certs init`): a CA, and for each identity a
//! certificate valid as a TLS server and client whose SAN URI `cairn://<identity>` names it.
//! Keys are written 0600 and never overwritten silently.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::caller::is_identity_name;
use crate::tls::{IDENTITIES, IDENTITY_URI_SCHEME};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{0} is not an identity name (lowercase letters, digits and '-', 1-63 characters)")]
    BadIdentity(String),
    #[error("{0:?} is not a DNS name or IP address")]
    BadName(String),
    #[error("--days must be between 1 and 3650, not {0}")]
    BadDays(u32),
    #[error("{} already exists: give another --out, or --force to replace the PKI", .0.display())]
    Exists(PathBuf),
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("making a certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("reading the CA in {}: {why}", dir.display())]
    Ca { dir: PathBuf, why: String },
    #[error("cannot renew {}: {why}", path.display())]
    Renew { path: PathBuf, why: String },
    #[error("giving {} to {uid}:{gid}: {source} (--owner needs root, or the owner itself)", path.display())]
    Chown {
        path: PathBuf,
        uid: u32,
        gid: u32,
        source: std::io::Error,
    },
}

/// Parses `--owner UID:GID` (numbers: the ids of the user a container runs as).
pub fn parse_owner(text: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not UID:GID (e.g. 10002:10002)"))?;
    let num = |s: &str| {
        s.parse::<u32>().map_err(|_| {
            format!("{s:?} in {text:?} is not a numeric id (UID:GID, e.g. 10002:10002)")
        })
    };
    Ok((num(uid)?, num(gid)?))
}

/// What `cairn certs init` makes.
#[derive(Debug, Clone)]
pub struct PkiSpec {
    pub out: PathBuf,
    pub days: u32,
    /// Extra DNS names (or IP addresses) on every certificate.
    pub dns: Vec<String>,
    /// Identities to issue; empty = [`IDENTITIES`].
    pub identities: Vec<String>,
    /// Replace files that exist.
    pub force: bool,
    /// Backdate `not_before`/`not_after` by this much (tests of expired certificates).
    pub backdate: Duration,
    /// Also write `<out>/<identity>/` holding only `ca.pem`, `<identity>.pem` and
    /// `<identity>.key`: one directory a container mounts without seeing other keys.
    pub split: bool,
    /// Give every file and directory written to this `(uid, gid)`.
    pub owner: Option<(u32, u32)>,
}

impl PkiSpec {
    pub fn new(out: impl Into<PathBuf>) -> PkiSpec {
        PkiSpec {
            out: out.into(),
            days: 365,
            dns: Vec::new(),
            identities: Vec::new(),
            force: false,
            backdate: Duration::ZERO,
            split: false,
            owner: None,
        }
    }
}

/// Names every certificate carries besides its identity: loopback, and the names the compose
/// file and the Kubernetes manifests give the service (namespaces `cairn` and `cairn-sandbox`).
fn standard_names(identity: &str) -> Vec<String> {
    let mut names = vec![
        identity.to_owned(),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    for ns in ["cairn", "cairn-sandbox"] {
        names.push(format!("{identity}.{ns}"));
        names.push(format!("{identity}.{ns}.svc"));
        names.push(format!("{identity}.{ns}.svc.cluster.local"));
    }
    names
}

/// The files written: `ca.pem`, `ca.key`, and `<identity>.pem` / `<identity>.key` each (with
/// `split`, also `<identity>/ca.pem|<identity>.pem|<identity>.key`). When `out` already holds
/// a CA (`ca.pem` and `ca.key`) and `force` is off, that CA issues the identities (adding
/// identities to a deployment) and only their files are written.
pub fn init(spec: &PkiSpec) -> Result<Vec<PathBuf>, PkiError> {
    if !(1..=3650).contains(&spec.days) {
        return Err(PkiError::BadDays(spec.days));
    }
    let identities: Vec<String> = if spec.identities.is_empty() {
        IDENTITIES.iter().map(|s| (*s).to_owned()).collect()
    } else {
        spec.identities.clone()
    };
    for id in &identities {
        if !is_identity_name(id) {
            return Err(PkiError::BadIdentity(id.clone()));
        }
    }
    for name in &spec.dns {
        if name.is_empty() || name.len() > 253 || name.contains(char::is_whitespace) {
            return Err(PkiError::BadName(name.clone()));
        }
    }
    let write = |name: &str, body: &str, mode: u32| -> Result<PathBuf, PkiError> {
        let path = spec.out.join(name);
        let err = |source| PkiError::Write {
            path: path.clone(),
            source,
        };
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).mode(mode);
        if spec.force {
            opts.create(true).truncate(true);
        } else {
            opts.create_new(true);
        }
        let mut f = opts.open(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                PkiError::Exists(path.clone())
            } else {
                err(e)
            }
        })?;
        f.write_all(body.as_bytes()).map_err(err)?;
        f.sync_all().map_err(err)?;
        Ok(path)
    };
    let mut made_dirs = Vec::new();
    let mkdir = |dir: &Path, made: &mut Vec<PathBuf>| -> Result<(), PkiError> {
        if !dir.is_dir() {
            std::fs::create_dir_all(dir).map_err(|source| PkiError::Write {
                path: dir.to_owned(),
                source,
            })?;
            made.push(dir.to_owned());
        }
        Ok(())
    };
    mkdir(&spec.out, &mut made_dirs)?;
    let reuse_ca =
        !spec.force && spec.out.join("ca.pem").exists() && spec.out.join("ca.key").exists();
    if !spec.force {
        let ca_files = if reuse_ca {
            vec![]
        } else {
            vec!["ca.pem".to_owned()]
        };
        for name in ca_files.into_iter().chain(identities.iter().flat_map(|i| {
            let split = spec
                .split
                .then(|| split_files(i).map(|(_, to)| to))
                .into_iter()
                .flatten();
            [format!("{i}.pem"), format!("{i}.key")]
                .into_iter()
                .chain(split)
        })) {
            let path = spec.out.join(&name);
            if path.exists() {
                return Err(PkiError::Exists(path));
            }
        }
    }
    let now = OffsetDateTime::now_utc() - spec.backdate;
    let not_after = now + Duration::days(i64::from(spec.days));
    let mut written = Vec::new();
    let issuer = if reuse_ca {
        read_issuer(&spec.out)?
    } else {
        new_ca(now, not_after, &write, &mut written)?
    };
    for id in &identities {
        let key = KeyPair::generate()?;
        let mut names = standard_names(id);
        names.extend(spec.dns.iter().cloned());
        let cert = leaf(id, names, now, not_after)?.signed_by(&key, &issuer)?;
        written.push(write(&format!("{id}.pem"), &cert.pem(), 0o644)?);
        written.push(write(&format!("{id}.key"), &key.serialize_pem(), 0o600)?);
    }
    if spec.split {
        for id in &identities {
            mkdir(&spec.out.join(id), &mut made_dirs)?;
            for (from, to) in split_files(id) {
                let from = spec.out.join(from);
                let body = std::fs::read_to_string(&from)
                    .map_err(|source| PkiError::Write { path: from, source })?;
                let mode = if to.ends_with(".key") { 0o600 } else { 0o644 };
                written.push(write(&to, &body, mode)?);
            }
        }
    }
    if let Some((uid, gid)) = spec.owner {
        for path in made_dirs.iter().chain(&written) {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|source| {
                PkiError::Chown {
                    path: path.clone(),
                    uid,
                    gid,
                    source,
                }
            })?;
        }
    }
    Ok(written)
}

/// The CA `dir` holds (`ca.pem`, `ca.key`), to issue with.
fn read_issuer(dir: &Path) -> Result<Issuer<'static, KeyPair>, PkiError> {
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name)).map_err(|e| PkiError::Ca {
            dir: dir.to_owned(),
            why: format!("{name}: {e}"),
        })
    };
    let bad = |why: String| PkiError::Ca {
        dir: dir.to_owned(),
        why,
    };
    let key = KeyPair::from_pem(&read("ca.key")?).map_err(|e| bad(e.to_string()))?;
    let bundle = read("ca.pem")?;
    // During a CA roll-over ca.pem holds the old and the new CA: issue as the one whose key
    // ca.key is.
    for pem in x509_parser::pem::Pem::iter_from_buffer(bundle.as_bytes()) {
        let pem = pem.map_err(|e| bad(format!("ca.pem: {e}")))?;
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(&pem.contents) else {
            continue;
        };
        if cert.public_key().subject_public_key.data.as_ref() == key.public_key_raw() {
            let der = rustls::pki_types::CertificateDer::from(pem.contents.as_slice());
            return Issuer::from_ca_cert_der(&der, key).map_err(|e| bad(e.to_string()));
        }
    }
    Err(bad(
        "no certificate in ca.pem is the CA of ca.key".to_owned()
    ))
}

/// The certificate of identity `id` for host names `names`: serves and dials.
fn leaf(
    id: &str,
    names: Vec<String>,
    now: OffsetDateTime,
    not_after: OffsetDateTime,
) -> Result<CertificateParams, PkiError> {
    let mut params = CertificateParams::new(names).map_err(|_| PkiError::BadName(id.to_owned()))?;
    params.subject_alt_names.push(SanType::URI(
        format!("{IDENTITY_URI_SCHEME}{id}")
            .try_into()
            .map_err(|_| PkiError::BadIdentity(id.to_owned()))?,
    ));
    params.distinguished_name = dn(id);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.not_before = now - Duration::minutes(5);
    params.not_after = not_after;
    Ok(params)
}

/// Re-issues every identity certificate in `dir` (each `<identity>.pem` with its
/// `<identity>.key` beside it, and its copy in `<identity>/` when `--split` made one) from the
/// CA the directory holds, valid `days` from now. Identities, host names and keys stay; the
/// CA is not touched. Each file is replaced by rename, so a reader sees the old certificate or
/// the new one, never a mix (a certificate and its key always match: the key is kept).
/// Returns the files written.
pub fn renew(dir: &Path, days: u32) -> Result<Vec<PathBuf>, PkiError> {
    if !(1..=3650).contains(&days) {
        return Err(PkiError::BadDays(days));
    }
    let issuer = read_issuer(dir)?;
    let listing = std::fs::read_dir(dir).map_err(|e| PkiError::Ca {
        dir: dir.to_owned(),
        why: e.to_string(),
    })?;
    let mut ids: Vec<String> = listing
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name.strip_suffix(".pem")?.to_owned();
            (id != "ca" && dir.join(format!("{id}.key")).is_file()).then_some(id)
        })
        .collect();
    ids.sort();
    let now = OffsetDateTime::now_utc();
    let not_after = now + Duration::days(i64::from(days));
    let mut written = Vec::new();
    for id in &ids {
        let path = dir.join(format!("{id}.pem"));
        let info = describe(&path).map_err(|e| PkiError::Renew {
            path: path.clone(),
            why: e.to_string(),
        })?;
        if info.identity.as_deref() != Some(id.as_str()) {
            return Err(PkiError::Renew {
                path,
                why: format!("it does not name the identity cairn://{id}"),
            });
        }
        let key_path = dir.join(format!("{id}.key"));
        let key_pem = std::fs::read_to_string(&key_path).map_err(|e| PkiError::Renew {
            path: key_path.clone(),
            why: e.to_string(),
        })?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| PkiError::Renew {
            path: key_path.clone(),
            why: e.to_string(),
        })?;
        let mut params = leaf(id, info.names, now, not_after)?;
        // rcgen derives the serial from the key, which is kept: a renewal needs its own.
        params.serial_number = Some(fresh_serial(id));
        let pem = params.signed_by(&key, &issuer)?.pem();
        let copy = dir.join(id).join(format!("{id}.pem"));
        for target in std::iter::once(path).chain(copy.is_file().then_some(copy)) {
            replace_file(&target, &pem, 0o644)?;
            written.push(target);
        }
    }
    Ok(written)
}

/// A serial number no other certificate of the CA has: the time of issue and a per-process
/// random hash, positive.
fn fresh_serial(id: &str) -> rcgen::SerialNumber {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let random = std::collections::hash_map::RandomState::new().hash_one((id, nanos));
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&random.to_be_bytes());
    bytes[8..].copy_from_slice(&(nanos as u64).to_be_bytes());
    // Positive and without a leading zero byte.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    rcgen::SerialNumber::from_slice(&bytes)
}

/// Writes `body` to `path` through a temporary file renamed over it, with `mode` and the
/// owner of the file it replaces.
fn replace_file(path: &Path, body: &str, mode: u32) -> Result<(), PkiError> {
    let err = |source| PkiError::Write {
        path: path.to_owned(),
        source,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.renew"));
    let owner = std::fs::metadata(path).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        (m.uid(), m.gid())
    });
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(body.as_bytes())?;
        f.sync_all()?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        }
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(err)
}

/// The files of an identity's own directory (`--split`): (flat file, its copy).
fn split_files(id: &str) -> [(String, String); 3] {
    [
        ("ca.pem".to_owned(), format!("{id}/ca.pem")),
        (format!("{id}.pem"), format!("{id}/{id}.pem")),
        (format!("{id}.key"), format!("{id}/{id}.key")),
    ]
}

type WriteFile<'a> = dyn Fn(&str, &str, u32) -> Result<PathBuf, PkiError> + 'a;

/// A new CA: writes `ca.pem` and `ca.key` (kept beside the PKI so more identities can be
/// issued later; keep it offline in production).
fn new_ca(
    now: OffsetDateTime,
    not_after: OffsetDateTime,
    write: &WriteFile<'_>,
    written: &mut Vec<PathBuf>,
) -> Result<Issuer<'static, KeyPair>, PkiError> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = dn("cairn CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = now - Duration::minutes(5);
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key)?;
    written.push(write("ca.pem", &ca_cert.pem(), 0o644)?);
    written.push(write("ca.key", &ca_key.serialize_pem(), 0o600)?);
    Ok(Issuer::new(ca, ca_key))
}

fn dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "cairn");
    dn
}

/// What `cairn certs show` prints of a certificate.
#[derive(Debug, Clone)]
pub struct CertInfo {
    pub identity: Option<String>,
    /// DNS names and IP addresses.
    pub names: Vec<String>,
    pub not_before: String,
    pub not_after: String,
    /// The serial number in hex (a renewal gives a new one).
    pub serial: String,
    /// The issuing CA's distinguished name.
    pub issuer: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DescribeError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a PEM certificate", .0.display())]
    NotACertificate(PathBuf),
    #[error("the certificate presented is not X.509 DER")]
    NotDer,
}

/// Reads a PEM certificate file.
pub fn describe(path: &Path) -> Result<CertInfo, DescribeError> {
    let bytes = std::fs::read(path).map_err(|source| DescribeError::Read {
        path: path.to_owned(),
        source,
    })?;
    let not_cert = || DescribeError::NotACertificate(path.to_owned());
    let (_, pem) = x509_parser::pem::parse_x509_pem(&bytes).map_err(|_| not_cert())?;
    describe_der(&pem.contents).map_err(|_| not_cert())
}

/// Reads a certificate in DER (as a server presents it).
pub fn describe_der(der: &[u8]) -> Result<CertInfo, DescribeError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|_| DescribeError::NotDer)?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(n) => names.push((*n).to_owned()),
                x509_parser::extensions::GeneralName::IPAddress(ip) => {
                    let ip = match ip.len() {
                        4 => <[u8; 4]>::try_from(*ip).map(std::net::IpAddr::from).ok(),
                        16 => <[u8; 16]>::try_from(*ip).map(std::net::IpAddr::from).ok(),
                        _ => None,
                    };
                    names.extend(ip.map(|ip| ip.to_string()));
                }
                _ => {}
            }
        }
    }
    Ok(CertInfo {
        identity: crate::caller::identity_of(der).ok(),
        names,
        not_before: cert.validity().not_before.to_string(),
        not_after: cert.validity().not_after.to_string(),
        serial: cert.raw_serial_as_string().replace(':', ""),
        issuer: cert.issuer().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn split_gives_each_identity_a_directory_of_its_own_files_only() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("pki");
        pki_split(&out);
        for id in IDENTITIES {
            let dir = out.join(id);
            let mut want = vec![
                "ca.pem".to_owned(),
                format!("{id}.key"),
                format!("{id}.pem"),
            ];
            want.sort();
            assert_eq!(names_in(&dir), want, "{id}");
            for (flat, copy) in split_files(id) {
                assert_eq!(
                    std::fs::read(out.join(&flat)).unwrap(),
                    std::fs::read(out.join(&copy)).unwrap(),
                    "{copy}"
                );
            }
            let mode = std::fs::metadata(dir.join(format!("{id}.key")))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{id}.key");
            assert_eq!(
                describe(&dir.join(format!("{id}.pem")))
                    .unwrap()
                    .identity
                    .as_deref(),
                Some(id)
            );
        }
        // The flat files stay, and the CA key only at the top.
        assert!(out.join("ca.key").is_file());
        assert!(out.join("cli.pem").is_file() && out.join("cli.key").is_file());
        // A second run refuses to replace the split files as it refuses the flat ones.
        let again = init(&PkiSpec {
            split: true,
            ..PkiSpec::new(&out)
        });
        assert!(matches!(again, Err(PkiError::Exists(_))), "{again:?}");
    }

    fn pki_split(out: &Path) -> Vec<PathBuf> {
        init(&PkiSpec {
            split: true,
            ..PkiSpec::new(out)
        })
        .unwrap()
    }

    #[test]
    fn split_adds_a_directory_for_a_new_identity_of_the_same_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("pki");
        pki_split(&out);
        let written = init(&PkiSpec {
            split: true,
            identities: vec!["reporter".into()],
            ..PkiSpec::new(&out)
        })
        .unwrap();
        assert!(
            written.contains(&out.join("reporter/reporter.key")),
            "{written:?}"
        );
        assert_eq!(
            std::fs::read(out.join("reporter/ca.pem")).unwrap(),
            std::fs::read(out.join("ca.pem")).unwrap()
        );
    }

    #[test]
    fn owner_is_given_every_file_and_directory_written() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("pki");
        // Our own ids work without privileges; root may give any.
        let (uid, gid) = {
            let m = std::fs::metadata(tmp.path()).unwrap();
            (m.uid(), m.gid())
        };
        let target = if uid == 0 { (10002, 10002) } else { (uid, gid) };
        let written = init(&PkiSpec {
            split: true,
            owner: Some(target),
            ..PkiSpec::new(&out)
        })
        .unwrap();
        for path in written.iter().chain([&out, &out.join("orchestrator")]) {
            let m = std::fs::metadata(path).unwrap();
            assert_eq!((m.uid(), m.gid()), target, "{}", path.display());
        }
    }

    /// Identity, host names, serial and validity end of a PEM certificate.
    fn facts(path: &Path) -> (Option<String>, Vec<String>, Vec<u8>, i64) {
        let info = describe(path).unwrap();
        let bytes = std::fs::read(path).unwrap();
        let (_, pem) = x509_parser::pem::parse_x509_pem(&bytes).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&pem.contents).unwrap();
        (
            info.identity,
            info.names,
            cert.raw_serial().to_vec(),
            cert.validity().not_after.timestamp(),
        )
    }

    #[test]
    fn renew_keeps_identities_names_keys_and_the_ca_and_extends_validity() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("pki");
        init(&PkiSpec {
            days: 2,
            split: true,
            dns: vec!["store.example".into()],
            ..PkiSpec::new(&out)
        })
        .unwrap();
        let read = |name: &str| std::fs::read(out.join(name)).unwrap();
        let ca = (read("ca.pem"), read("ca.key"));
        let before: Vec<_> = IDENTITIES
            .iter()
            .map(|id| {
                (
                    facts(&out.join(format!("{id}.pem"))),
                    read(&format!("{id}.key")),
                )
            })
            .collect();

        let written = renew(&out, 30).unwrap();
        assert_eq!(written.len(), 2 * IDENTITIES.len(), "{written:?}");
        assert_eq!((read("ca.pem"), read("ca.key")), ca, "the CA changed");
        for (id, ((identity, names, serial, not_after), key)) in IDENTITIES.iter().zip(before) {
            let pem = out.join(format!("{id}.pem"));
            let (identity2, names2, serial2, not_after2) = facts(&pem);
            assert_eq!(identity2, identity, "{id}");
            assert_eq!(identity2.as_deref(), Some(*id));
            assert_eq!(names2, names, "{id}");
            assert!(names2.contains(&"store.example".to_owned()), "{id}");
            assert_ne!(serial2, serial, "{id}");
            assert!(not_after2 > not_after + 20 * 86_400, "{id}");
            assert_eq!(read(&format!("{id}.key")), key, "{id}: the key changed");
            assert_eq!(
                std::fs::read(&pem).unwrap(),
                read(&format!("{id}/{id}.pem"))
            );
            let mode = std::fs::metadata(&pem).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o644, "{id}");
        }
        // No temporary file is left behind.
        assert!(!names_in(&out).iter().any(|n| n.starts_with('.')));
        assert!(matches!(renew(&out, 0), Err(PkiError::BadDays(0))));
    }

    #[test]
    fn owner_parses_numeric_uid_and_gid_only() {
        assert_eq!(parse_owner("10002:10003"), Ok((10002, 10003)));
        for bad in ["10002", "cairn:cairn", ":1", "1:", "1:2:3", "-1:0"] {
            assert!(parse_owner(bad).is_err(), "{bad}");
        }
    }
}
