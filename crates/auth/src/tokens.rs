//! The tokens file: who the people are (name, role, optional projects) and the sha256 of each
//! one's bearer token. It never holds a token itself: `cairn tokens add` prints the token once
//! and stores only its hash, so a leaked file grants nothing.
//!
//! Format (TOML, written by `cairn tokens`, editable by hand):
//! ```toml
//! [[token]]
//! name = "ann"
//! role = "approver"
//! projects = ["web"]        # optional; absent = every project
//! sha256 = "<64 hex digits>"
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Role;

/// Longest name of a person.
pub const MAX_NAME_CHARS: usize = 64;
/// Prefix of every token cairn makes (recognisable in logs and secret scanners).
pub const TOKEN_PREFIX: &str = "cairn_";

#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("cannot read the tokens file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the tokens file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("cannot write the tokens file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("no token named `{0}`; list them with `cairn tokens list`")]
    Unknown(String),
    #[error("a token named `{0}` exists; remove it first (`cairn tokens remove {0}`) or choose another name")]
    Exists(String),
}

/// One person's entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// Recorded as `by` of everything this person does.
    pub name: String,
    pub role: Role,
    /// Projects this person may act on; empty = every project.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<String>,
    /// sha256 of the token, lowercase hex.
    pub sha256: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokensFile {
    #[serde(default, rename = "token")]
    pub tokens: Vec<TokenEntry>,
}

/// sha256 of a token, lowercase hex.
pub fn hash(token: &str) -> String {
    cairn_sha256::sha256_hex(token.as_bytes())
}

/// A new token: 244 random bits from the OS (two v4 UUIDs), hex, with the cairn prefix.
pub fn new_token() -> String {
    format!(
        "{TOKEN_PREFIX}{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Equality of two byte strings in time independent of where they differ.
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// A name people are recorded under: 1-64 of letters, digits, `.`, `_`, `-`, `@`.
pub fn check_name(name: &str) -> Result<(), TokensError> {
    let ok = !name.is_empty()
        && name.chars().count() <= MAX_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
    if ok {
        Ok(())
    } else {
        Err(TokensError::Invalid(format!(
            "name `{name}`: use 1-{MAX_NAME_CHARS} letters, digits, `.`, `_`, `-` or `@`"
        )))
    }
}

fn check_project(project: &str) -> Result<(), TokensError> {
    if !pathguard::is_project_id(project) {
        return Err(TokensError::Invalid(format!(
            "project `{project}`: a project id is {}",
            pathguard::PROJECT_ID_RULE
        )));
    }
    Ok(())
}

impl TokensFile {
    /// Reads and checks the file; a missing file is an error.
    pub fn read(path: &Path) -> Result<TokensFile, TokensError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokensError::Read {
            path: path.to_owned(),
            source,
        })?;
        let file: TokensFile = toml::from_str(&text).map_err(|e| TokensError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        file.check().map_err(|e| TokensError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Ok(file)
    }

    /// Reads the file, or an empty one when it does not exist yet (`cairn tokens add`).
    pub fn read_or_empty(path: &Path) -> Result<TokensFile, TokensError> {
        match path.try_exists() {
            Ok(false) => Ok(TokensFile::default()),
            _ => TokensFile::read(path),
        }
    }

    fn check(&self) -> Result<(), TokensError> {
        let mut names = std::collections::HashSet::new();
        for t in &self.tokens {
            check_name(&t.name)?;
            if !names.insert(t.name.as_str()) {
                return Err(TokensError::Invalid(format!(
                    "two tokens are named `{}`",
                    t.name
                )));
            }
            if t.sha256.len() != 64 || !t.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(TokensError::Invalid(format!(
                    "token `{}`: sha256 must be 64 hex digits (the hash of the token, never the token)",
                    t.name
                )));
            }
            for p in &t.projects {
                check_project(p)?;
            }
        }
        Ok(())
    }

    /// Writes the file atomically (a temporary file renamed over it), readable by its owner only.
    pub fn write(&self, path: &Path) -> Result<(), TokensError> {
        let err = |source| TokensError::Write {
            path: path.to_owned(),
            source,
        };
        let body = toml::to_string(self).map_err(|e| err(std::io::Error::other(e)))?;
        let text = format!(
            "# cairn tokens: one [[token]] per person (name, role, optional projects, sha256 of the\n# token). Manage with `cairn tokens add|list|remove`; the tokens themselves are not stored.\n\n{body}"
        );
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "tokens".into());
        // Beside the file, so that the rename stays in its directory (and file system).
        let tmp = path.with_file_name(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
        let written = (|| {
            use std::io::Write;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts.open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map_err(err)
    }

    /// Adds a person with a new token; returns the token (shown once, never stored).
    pub fn add(
        &mut self,
        name: &str,
        role: Role,
        projects: &[String],
    ) -> Result<String, TokensError> {
        check_name(name)?;
        for p in projects {
            check_project(p)?;
        }
        if self.tokens.iter().any(|t| t.name == name) {
            return Err(TokensError::Exists(name.to_owned()));
        }
        let token = new_token();
        let mut projects = projects.to_vec();
        projects.sort();
        projects.dedup();
        self.tokens.push(TokenEntry {
            name: name.to_owned(),
            role,
            projects,
            sha256: hash(&token),
        });
        Ok(token)
    }

    /// Removes a person (their token stops working).
    pub fn remove(&mut self, name: &str) -> Result<TokenEntry, TokensError> {
        let at = self
            .tokens
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| TokensError::Unknown(name.to_owned()))?;
        Ok(self.tokens.remove(at))
    }

    /// The entry a token belongs to. Every entry's hash is compared, each in constant time, so
    /// the answer's timing says nothing about which bytes matched.
    pub fn find(&self, token: &str) -> Option<&TokenEntry> {
        let given = cairn_sha256::sha256(token.as_bytes());
        let mut found = None;
        for t in &self.tokens {
            let Ok(expected) = hex::decode(&t.sha256) else {
                continue;
            };
            if same_bytes(&given, &expected) && found.is_none() {
                found = Some(t);
            }
        }
        found
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn add_find_remove_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let mut f = TokensFile::read_or_empty(&path).unwrap();
        let t = f
            .add("ann", Role::Approver, &["web".into(), "web".into()])
            .unwrap();
        assert!(t.starts_with(TOKEN_PREFIX) && t.len() == TOKEN_PREFIX.len() + 64);
        assert!(matches!(
            f.add("ann", Role::Viewer, &[]),
            Err(TokensError::Exists(_))
        ));
        assert!(f.add("bad name", Role::Viewer, &[]).is_err());
        assert!(f.add("x", Role::Viewer, &["a b".into()]).is_err());
        f.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&t), "the token itself is never stored");
        assert!(text.contains(&hash(&t)));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let mut back = TokensFile::read(&path).unwrap();
        let e = back.find(&t).unwrap();
        assert_eq!(
            (e.name.as_str(), e.role, e.projects.clone()),
            ("ann", Role::Approver, vec!["web".to_owned()])
        );
        assert!(back.find("cairn_wrong").is_none());
        assert!(back.find("").is_none());
        back.remove("ann").unwrap();
        assert!(back.find(&t).is_none());
        assert!(matches!(back.remove("ann"), Err(TokensError::Unknown(_))));
    }

    #[test]
    fn bytes_are_the_same_only_when_every_byte_and_the_length_are() {
        assert!(same_bytes(b"", b""));
        assert!(same_bytes(b"token", b"token"));
        assert!(!same_bytes(b"token", b"tokens"));
        assert!(!same_bytes(b"token", b"tokem"));
        // Two differences whose bits cancel out (0x03 each) are still two differences.
        assert!(!same_bytes(b"ab", b"ba"));
        assert!(!same_bytes(&[0x01, 0x02], &[0x02, 0x01]));
    }

    #[test]
    fn a_bad_file_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        assert!(TokensFile::read(&path).is_err());
        std::fs::write(
            &path,
            "[[token]]\nname = \"a\"\nrole = \"root\"\nsha256 = \"00\"\n",
        )
        .unwrap();
        let e = TokensFile::read(&path).unwrap_err().to_string();
        assert!(e.contains("tokens.toml"), "{e}");
        std::fs::write(
            &path,
            format!(
                "[[token]]\nname = \"a\"\nrole = \"viewer\"\nsha256 = \"{}\"\n",
                "0".repeat(63)
            ),
        )
        .unwrap();
        assert!(TokensFile::read(&path)
            .unwrap_err()
            .to_string()
            .contains("64 hex"));
    }

    #[test]
    fn names_and_projects_follow_their_rules() {
        let max = "a".repeat(MAX_NAME_CHARS);
        for ok in ["ann", "a.b_c-d@e", "ünal", max.as_str()] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        let over = "a".repeat(MAX_NAME_CHARS + 1);
        for bad in ["", "a b", "a/b", "a:b", over.as_str()] {
            let e = check_name(bad).unwrap_err().to_string();
            assert!(e.contains("1-64"), "{bad}: {e}");
        }
        assert!(check_project("web").is_ok());
        assert!(check_project("../web")
            .unwrap_err()
            .to_string()
            .contains("../web"));
    }

    #[test]
    fn a_file_is_refused_for_a_repeated_name_a_bad_project_or_a_bad_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let entry = |name: &str, projects: &str, sha: &str| {
            format!("[[token]]\nname = \"{name}\"\nrole = \"viewer\"\nprojects = [{projects}]\nsha256 = \"{sha}\"\n")
        };
        let good = "a".repeat(64);
        for (text, says) in [
            (
                entry("ann", "", &good) + &entry("ann", "", &good),
                "two tokens are named `ann`",
            ),
            (entry("ann", "\"a b\"", &good), "project `a b`"),
            (entry("a b", "", &good), "name `a b`"),
            (entry("ann", "", &"g".repeat(64)), "64 hex"),
            (entry("ann", "", &"a".repeat(65)), "64 hex"),
        ] {
            std::fs::write(&path, &text).unwrap();
            let e = TokensFile::read(&path).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("tokens.toml"), "{says}: {e}");
        }
        std::fs::write(&path, entry("ann", "\"web\"", &good.to_uppercase())).unwrap();
        assert_eq!(TokensFile::read(&path).unwrap().tokens.len(), 1);
        // read_or_empty: only a file that is not there reads as empty.
        let none = dir.path().join("none.toml");
        assert!(TokensFile::read_or_empty(&none).unwrap().tokens.is_empty());
        std::fs::write(&path, "not toml [").unwrap();
        assert!(TokensFile::read_or_empty(&path).is_err());
    }

    #[test]
    fn a_token_is_found_by_its_hash_and_the_first_entry_with_it_wins() {
        let token = new_token();
        assert_ne!(token, new_token(), "each token is new");
        let entry = |name: &str, sha256: String| TokenEntry {
            name: name.into(),
            role: Role::Viewer,
            projects: Vec::new(),
            sha256,
        };
        let file = TokensFile {
            tokens: vec![
                entry("bad-hex", "zz".repeat(32)),
                entry("first", hash(&token)),
                entry("second", hash(&token).to_uppercase()),
            ],
        };
        assert_eq!(file.find(&token).unwrap().name, "first");
        assert_eq!(
            hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(file.find("abc").is_none());
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file_and_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        // The path is a directory: the rename over it fails after the temporary file exists.
        let path = dir.path().join("tokens.toml");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("keep"), "x").unwrap();
        let e = TokensFile::default().write(&path).unwrap_err().to_string();
        assert!(
            e.contains("cannot write the tokens file") && e.contains("tokens.toml"),
            "{e}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("tokens.toml")],
            "no temporary file is left"
        );
        // A written file starts with the comment that explains it.
        let file = TokensFile::default();
        let text = {
            let p = dir.path().join("t.toml");
            file.write(&p).unwrap();
            std::fs::read_to_string(p).unwrap()
        };
        assert!(text.starts_with("# cairn tokens:"), "{text}");
    }
}
