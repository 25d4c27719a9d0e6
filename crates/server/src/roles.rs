//! Humans and the orchestrator's RPCs: the roles people hold, the least role each RPC needs
//! (the one table, [`Rpc::required_role`]), and the client-side bearer token interceptor.
//! Shared by the orchestrator (which checks), the CLI and the console (which send tokens).
//! Depends on tonic and serde only.

use serde::{Deserialize, Serialize};
use tonic::metadata::{Ascii, MetadataValue};

/// Metadata key of the bearer token.
pub const AUTHORIZATION: &str = "authorization";

/// Metadata key of the seconds a throttled caller should wait before trying again.
pub const RETRY_AFTER: &str = "retry-after";

/// The token of an `authorization` value `Bearer <token>` (scheme in any case).
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// What a person may do; each role includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read: list, show, watch, events.
    Viewer,
    /// Viewer + submit, cancel, resume, notes, rework, context edits.
    Operator,
    /// Operator + gate approve / reject.
    Approver,
    /// Everything.
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Operator, Role::Approver, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Approver => "approver",
            Role::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Role, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s.trim().to_ascii_lowercase())
            .ok_or_else(|| format!("role `{s}`: use viewer, operator, approver or admin"))
    }
}

/// The orchestrator's RPCs, as the authorization table knows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    SubmitRun,
    GetRun,
    ListRuns,
    WatchRun,
    WatchLogs,
    CancelRun,
    ResumeRun,
    ApproveGate,
    RejectGate,
    AddNote,
    RequestRework,
    EditContext,
    EditTask,
    WhoAmI,
    ReplayRun,
    DiffRuns,
}

impl Rpc {
    /// THE table: the least role each RPC needs (docs/security.md "Humans: tokens and roles").
    pub fn required_role(self) -> Role {
        match self {
            Rpc::GetRun
            | Rpc::ListRuns
            | Rpc::WatchRun
            | Rpc::WatchLogs
            | Rpc::WhoAmI
            | Rpc::DiffRuns => Role::Viewer,
            // A replay starts a run: what SubmitRun needs, on the recorded run's project.
            Rpc::ReplayRun
            | Rpc::SubmitRun
            | Rpc::CancelRun
            | Rpc::ResumeRun
            | Rpc::AddNote
            | Rpc::RequestRework
            | Rpc::EditContext
            | Rpc::EditTask => Role::Operator,
            Rpc::ApproveGate | Rpc::RejectGate => Role::Approver,
        }
    }

    /// Whether the call acts on one project (and a project-scoped token is checked against it).
    pub fn has_project(self) -> bool {
        self != Rpc::WhoAmI
    }

    pub fn name(self) -> &'static str {
        match self {
            Rpc::SubmitRun => "SubmitRun",
            Rpc::GetRun => "GetRun",
            Rpc::ListRuns => "ListRuns",
            Rpc::WatchRun => "WatchRun",
            Rpc::WatchLogs => "WatchLogs",
            Rpc::CancelRun => "CancelRun",
            Rpc::ResumeRun => "ResumeRun",
            Rpc::ApproveGate => "ApproveGate",
            Rpc::RejectGate => "RejectGate",
            Rpc::AddNote => "AddNote",
            Rpc::RequestRework => "RequestRework",
            Rpc::EditContext => "EditContext",
            Rpc::EditTask => "EditTask",
            Rpc::WhoAmI => "WhoAmI",
            Rpc::ReplayRun => "ReplayRun",
            Rpc::DiffRuns => "DiffRuns",
        }
    }
}

/// Client side: a tonic interceptor that sends a bearer token with every call (none = nothing
/// added). Used by the CLI (`--token`) and the console (the logged-in person's token).
#[derive(Clone, Debug, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    pub fn new(token: Option<&str>) -> std::result::Result<Bearer, String> {
        match token.map(str::trim).filter(|t| !t.is_empty()) {
            None => Ok(Bearer(None)),
            Some(t) => {
                let mut v = MetadataValue::try_from(format!("Bearer {t}"))
                    .map_err(|_| "the token has characters a header cannot carry".to_owned())?;
                v.set_sensitive(true);
                Ok(Bearer(Some(v)))
            }
        }
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut req: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert(AUTHORIZATION, v.clone());
        }
        Ok(req)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn each_role_includes_the_ones_before_it() {
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Approver);
        assert!(Role::Approver < Role::Admin);
        assert_eq!("Approver".parse::<Role>().unwrap(), Role::Approver);
        assert!("root".parse::<Role>().is_err());
        assert_eq!(Rpc::ApproveGate.required_role(), Role::Approver);
        assert_eq!(Rpc::AddNote.required_role(), Role::Operator);
        assert_eq!(Rpc::WatchRun.required_role(), Role::Viewer);
        assert_eq!(Rpc::WatchLogs.required_role(), Role::Viewer);
        assert!(Rpc::WatchLogs.has_project());
    }
}
