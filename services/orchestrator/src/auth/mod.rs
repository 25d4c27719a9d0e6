//! Humans as principals: who is calling the orchestrator (a bearer token from the tokens file),
//! what each role may do (the one table, [`Rpc::required_role`]), and on which projects.
//!
//! service.rs asks [`Auth::authorize`] at the top of every handler, before anything is read or
//! written; what it returns ([`Caller`]) is the only source of the `by` recorded. Without a
//! tokens file nothing is checked (the single-user loopback default) and the client's `by`
//! stays as today. This module must never trust a name the client sends when a token is
//! configured, nor compare a token other than by constant-time hash comparison.

pub mod tokens;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use cairn_server::roles::{Bearer, Role, Rpc, AUTHORIZATION};
use tokens::TokensFile;

/// How often the tokens file is looked at for changes (`cairn tokens add|remove` take effect
/// within this, without a restart).
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// `[auth]` of the orchestrator's configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// The tokens file (`cairn tokens add`); empty = no authentication (loopback default).
    pub tokens_file: String,
}

/// Who made a call, as far as the orchestrator knows.
#[derive(Clone, Debug, PartialEq)]
pub struct Caller {
    pub name: String,
    pub role: Role,
    /// Empty = every project.
    pub projects: Vec<String>,
    /// True when the name comes from a token (then it is the only `by` recorded).
    pub authenticated: bool,
}

impl Caller {
    /// Without a tokens file: the connecting user, whoever it is.
    fn local() -> Caller {
        Caller {
            name: "local".into(),
            role: Role::Admin,
            projects: Vec::new(),
            authenticated: false,
        }
    }

    /// The `by` to record: the token's name; without tokens, the name the client gave.
    pub fn by(&self, claimed: &str) -> String {
        if !self.authenticated {
            return claimed.to_owned();
        }
        if !claimed.is_empty() && claimed != self.name {
            tracing::debug!(principal = %self.name, claimed, "ignoring the client's `by`: the token's name is recorded");
        }
        self.name.clone()
    }
}

/// The tokens file, re-read when it changes.
struct TokenStore {
    path: PathBuf,
    state: Mutex<Loaded>,
}

struct Loaded {
    file: Arc<TokensFile>,
    stamp: Option<(SystemTime, u64)>,
    checked: Instant,
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl TokenStore {
    fn open(path: &Path) -> Result<TokenStore> {
        let file =
            TokensFile::read(path).map_err(|e| Error::Config(format!("auth.tokens_file: {e}")))?;
        if file.tokens.is_empty() {
            tracing::warn!(path = %path.display(), "the tokens file has no tokens: every call will be refused; add one with `cairn tokens add`");
        }
        Ok(TokenStore {
            path: path.to_owned(),
            state: Mutex::new(Loaded {
                file: Arc::new(file),
                stamp: stamp(path),
                checked: Instant::now(),
            }),
        })
    }

    fn current(&self) -> Arc<TokensFile> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.checked.elapsed() >= RELOAD_CHECK {
            s.checked = Instant::now();
            let now = stamp(&self.path);
            if now != s.stamp {
                s.stamp = now;
                match TokensFile::read(&self.path) {
                    Ok(f) => {
                        tracing::info!(path = %self.path.display(), tokens = f.tokens.len(), "tokens file reloaded");
                        s.file = Arc::new(f);
                    }
                    // A half-edited or removed file must not open the doors: keep what we had.
                    Err(e) => tracing::warn!(error = %e, "keeping the previous tokens"),
                }
            }
        }
        s.file.clone()
    }
}

/// Authentication and authorization of the orchestrator's callers.
pub struct Auth {
    tokens: Option<TokenStore>,
}

/// Why a call was refused: the reason word and the message.
enum Refusal {
    Unauthenticated(String),
    Denied(&'static str, String),
}

impl Auth {
    pub fn new(config: &AuthConfig) -> Result<Auth> {
        let path = config.tokens_file.trim();
        let tokens = if path.is_empty() {
            None
        } else {
            Some(TokenStore::open(Path::new(path))?)
        };
        Ok(Auth { tokens })
    }

    pub fn tokens_required(&self) -> bool {
        self.tokens.is_some()
    }

    /// Who calls `rpc` on `project`, if the table lets them; every refusal is logged at warn
    /// with the principal (or "anonymous"), the peer address, the RPC and the reason.
    pub fn authorize<T>(&self, req: &tonic::Request<T>, rpc: Rpc, project: &str) -> Result<Caller> {
        let Some(store) = &self.tokens else {
            return Ok(Caller::local());
        };
        let peer = req
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "unknown".into());
        let decided = match bearer_of(req.metadata()) {
            Err(why) => Err((None, Refusal::Unauthenticated(why))),
            Ok(token) => match store.current().find(token) {
                None => Err((
                    None,
                    Refusal::Unauthenticated(
                        "the token is not known (mistyped, or removed from the tokens file); ask an admin for one (`cairn tokens add`)".into(),
                    ),
                )),
                Some(e) => {
                    let caller = Caller {
                        name: e.name.clone(),
                        role: e.role,
                        projects: e.projects.clone(),
                        authenticated: true,
                    };
                    match check(&caller, rpc, project) {
                        Ok(()) => Ok(caller),
                        Err(r) => Err((Some(caller.name), r)),
                    }
                }
            },
        };
        decided.map_err(|(who, refusal)| {
            let who = who.unwrap_or_else(|| "anonymous".into());
            let (reason, error) = match refusal {
                Refusal::Unauthenticated(m) => ("unauthenticated", Error::Unauthenticated(m)),
                Refusal::Denied(reason, message) => {
                    (reason, Error::PermissionDenied { reason, message })
                }
            };
            tracing::warn!(principal = %who, peer = %peer, rpc = rpc.name(), reason, project, "call refused");
            error
        })
    }
}

/// The table and the project scope applied to one authenticated caller.
fn check(caller: &Caller, rpc: Rpc, project: &str) -> std::result::Result<(), Refusal> {
    let needed = rpc.required_role();
    if caller.role < needed {
        return Err(Refusal::Denied(
            "role",
            format!(
                "`{}` has role {}; {} needs role {needed} or above (ask an admin to change the role in the tokens file)",
                caller.name,
                caller.role,
                rpc.name()
            ),
        ));
    }
    if rpc.has_project()
        && !caller.projects.is_empty()
        && !caller.projects.iter().any(|p| p == project)
    {
        return Err(Refusal::Denied(
            "project",
            format!(
                "`{}` may act on project(s) {} only, not `{project}`",
                caller.name,
                caller.projects.join(", ")
            ),
        ));
    }
    Ok(())
}

/// The token of an `authorization: Bearer <token>` header.
fn bearer_of(md: &tonic::metadata::MetadataMap) -> std::result::Result<&str, String> {
    let Some(v) = md.get(AUTHORIZATION) else {
        return Err("this orchestrator needs a token: send `authorization: Bearer <token>` (cairn --token or CAIRN_TOKEN; an admin makes one with `cairn tokens add`)".into());
    };
    let v = v
        .to_str()
        .map_err(|_| "the authorization header is not text".to_owned())?;
    match v.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err("the authorization header must be `Bearer <token>`".into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bearer_header_forms() {
        let mut md = tonic::metadata::MetadataMap::new();
        assert!(bearer_of(&md).is_err());
        md.insert(AUTHORIZATION, "Basic abc".parse().unwrap());
        assert!(bearer_of(&md).is_err());
        md.insert(AUTHORIZATION, "bearer abc".parse().unwrap());
        assert_eq!(bearer_of(&md).unwrap(), "abc");
        md.insert(AUTHORIZATION, "Bearer ".parse().unwrap());
        assert!(bearer_of(&md).is_err());
    }
}
