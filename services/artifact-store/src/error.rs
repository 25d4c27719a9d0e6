//! The store's error type and its ONE mapping to gRPC status codes (proto header of
//! artifact_store.proto). Refusals carry the reason word in the `cairn-reason` metadata; every
//! message says what was wrong and how to fix it.

use std::io;

use pathguard::{Reason, Rejection};
use rustix::io::Errno;
use tonic::{Code, Status};

/// The fields of a run's task.yaml a person may change (see `run_records`).
pub const TASK_YAML_EDITABLE: &str = "title, goal, milestones[].note and roster[].note";

/// Everything that can go wrong in the artifact-store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A path broke a pathguard rule (syntax, denylist or allowed prefixes).
    #[error("{0}")]
    Path(#[from] Rejection),

    /// A path the store keeps for itself (run event logs, temp files).
    #[error("path {path:?} is reserved: {why}")]
    Reserved { path: String, why: &'static str },

    /// A symlink was met while walking to the path; the store never follows symlinks.
    #[error("path {path:?} goes through a symlink; the store never follows symlinks: remove the symlink or write to a real path")]
    SymlinkInPath { path: String },

    /// Something other than the expected kind is at the path.
    #[error("path {path:?}: {found}")]
    NotAFile { path: String, found: &'static str },

    /// overwrite=false and different bytes are already there.
    #[error("path {path:?} already holds different bytes ({existing_size} bytes); set overwrite=true to replace them, or write to another path")]
    Exists {
        project: String,
        path: String,
        existing_size: u64,
    },

    /// A run's graph.resolved.json is there already with other bytes, or was asked deleted.
    #[error("{path:?} is written once, when its run is submitted, and is never replaced or deleted (the same bytes again are accepted as unchanged): a run's graph cannot change; submit a new run to run another graph")]
    WriteOnce { path: String },

    /// A compare-and-swap Put (`if_sha256`) found other bytes than expected at the path.
    #[error("path {path:?} no longer holds the bytes this write expected to replace (sha256 {expected}, found {actual}): someone changed it since it was read; nothing was written, re-read it and decide again")]
    Changed {
        project: String,
        path: String,
        expected: String,
        actual: String,
    },

    /// A person's edit of a run's task.yaml touched what the orchestrator owns.
    #[error("{path:?}: {problem}; a person may edit only {editable} of a run's task.yaml (the rest is regenerated from the run's events: change the run with cairn gate, cairn runs or cairn notes), and nothing was written", editable = TASK_YAML_EDITABLE)]
    NotEditable { path: String, problem: String },

    /// A person's write of a run record that only a command may change (the command is named).
    #[error("{path:?}: {why}; {instead}. Nothing was written")]
    EditByCommand {
        path: String,
        why: String,
        instead: &'static str,
    },

    /// The bytes received do not match what the client announced.
    #[error("path {path:?}: received {actual} but the request expected {expected}; nothing was written, resend the file")]
    DigestMismatch {
        path: String,
        expected: String,
        actual: String,
    },

    /// A size limit was hit.
    #[error("{what} exceeds the limit of {limit} bytes")]
    TooLarge { what: String, limit: u64 },

    /// A snapshot Put would take the project's snapshots past their quota.
    #[error("snapshot {path:?} ({bytes} bytes) would take the snapshots of project {project:?} past their quota of {limit} bytes ({held} bytes held); remove old snapshots (cairn store ls -r .cairn/snapshots, cairn runs archive) or raise snapshots.max_project_bytes")]
    SnapshotQuota {
        project: String,
        path: String,
        bytes: u64,
        held: u64,
        limit: u64,
    },

    /// An id (project, run) is not of the form [A-Za-z0-9._-]{1,128}.
    #[error("{kind} id {id:?} is invalid: use 1-128 characters of A-Z a-z 0-9 . _ - (not \".\" or \"..\")")]
    InvalidId { kind: &'static str, id: String },

    /// A project id outside the project id rule.
    #[error("project id {0:?} is invalid: use {rule}", rule = pathguard::PROJECT_ID_RULE)]
    InvalidProjectId(String),

    /// The request is malformed.
    #[error("{0}")]
    BadRequest(String),

    /// The project does not exist.
    #[error("project {0:?} does not exist; create it with CreateProject (or set create_project on the Put)")]
    ProjectNotFound(String),

    /// Nothing is at the path.
    #[error("nothing at {path:?} in project {project:?}; check the path with List")]
    NotFound { project: String, path: String },

    /// A run has no event log.
    #[error("run {run:?} of project {project:?} has no events yet; check the run id, or pass follow=true to wait for them")]
    RunNotFound { project: String, run: String },

    /// UpdateJson saw another version than the caller expected.
    #[error("document {path:?} is at version {stored} but the update expected {expected}; re-read it and retry, or use MERGE_POLICY_MAX")]
    VersionConflict {
        path: String,
        stored: u64,
        expected: u64,
    },

    /// A file acknowledged to this run (PUT_DURABILITY_WITH_RUN_EVENTS) could not be published
    /// after the reply; the run's events are refused from then on, so none claims it.
    #[error("run {run:?}: the write of {path:?} was acknowledged but could not be published ({cause}); the run's events are refused until the store restarts, so none of them claims that file: fix the cause, restart the store and resume the run (its last nodes are redone)")]
    PublicationLost {
        run: String,
        path: String,
        cause: String,
    },

    /// An AppendEvents presented a publication token the store cannot prove durable (issued
    /// before a restart, or for another run): the files it stands for may never have landed.
    #[error("run {run:?}: publication token {token:?} {why}; nothing was appended: write the files whose tokens were refused again (each new Put reply carries a new token) and resend the events with the new tokens")]
    PublicationUnproven {
        run: String,
        token: String,
        why: &'static str,
    },

    /// A fenced AppendEvents from a writer whose claim on the run was superseded.
    #[error("run {run:?} was claimed by another writer (epoch {current}); this writer's epoch {sent} is fenced off and nothing was written: stop driving the run, or claim it again (ClaimRun) and re-read its events first")]
    Fenced {
        run: String,
        sent: u64,
        current: u64,
    },

    /// The caller's identity may not write there (docs/security.md, the store's scopes).
    #[error("identity `{identity}` may not {action}: {rule}")]
    NotPermitted {
        identity: String,
        action: String,
        rule: &'static str,
    },

    /// An ingest claim the store does not accept (`reason`: claim_invalid, claim_expired,
    /// claim_other_run).
    #[error("{message}")]
    ClaimRefused {
        reason: &'static str,
        message: String,
    },

    /// A batch holds an event type the caller's identity may not emit.
    #[error("identity `{identity}` may not append events of type {kind:?} to run {run:?} ({rule}); nothing was appended")]
    EventNotPermitted {
        identity: String,
        run: String,
        kind: String,
        rule: &'static str,
    },

    /// A write, event or claim for a run that was archived.
    #[error("run {run:?} is archived (its records are packed into .cairn/runs/{run}/run.tar.gz) and takes no more writes, events or claims; its records are still read as before: unpack it first (cairn runs unarchive), or submit a new run to continue the work")]
    Archived { run: String },

    /// Unarchiving a run that is not archived.
    #[error("run {run:?} is not archived (there is no .cairn/runs/{run}/run.tar.gz): its records are on disk already")]
    NotArchived { run: String },

    /// Archiving a run that may still have work.
    #[error("run {run:?} is {state}, not finished; only completed, failed or canceled runs are archived: wait for it to end or cancel it (cairn runs cancel) first")]
    Unfinished { run: String, state: String },

    /// A restore into a store that already has a project of the backup.
    #[error("the store already has {what}; a restore writes only into a store without the backup's projects: restore into an empty store, or restore one project the store does not have with --project")]
    NotEmpty { what: String },

    /// A backup file that cannot be read back whole or does not match its own list.
    #[error("the backup is not usable: {0}; nothing was restored: take the backup again (cairn store backup --out FILE) or restore another copy")]
    BadBackup(String),

    /// The store is shutting down or a background task ended.
    #[error("the artifact-store is shutting down; retry against a running store")]
    Unavailable,

    /// The client's stream broke before the end of the request.
    #[error("the request stream broke: {0}; nothing was written, resend the file")]
    Stream(String),

    /// An operating-system error.
    #[error("{context}: {source}{}", if disk_full(source) { "; free space (or raise the quota) on the store's data root and retry" } else { "" })]
    Io { context: String, source: io::Error },

    /// Bad configuration.
    #[error("configuration: {0}")]
    Config(String),

    /// The gRPC server failed.
    #[error("server: {0}")]
    Server(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<cairn_durable::IoError> for Error {
    fn from(e: cairn_durable::IoError) -> Self {
        Error::io(e.what, e.source)
    }
}

impl Error {
    /// An I/O error with what the store was doing.
    pub fn io(context: impl Into<String>, source: impl Into<io::Error>) -> Self {
        Error::Io {
            context: context.into(),
            source: source.into(),
        }
    }

    /// The reason word of this error (`cairn-reason` and `ErrorInfo.reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Path(r) => r.reason.as_str(),
            Error::Reserved { .. } => "denied",
            Error::SymlinkInPath { .. } => "symlink_in_path",
            Error::NotAFile { .. } => "not_a_file",
            Error::Exists { .. } => "exists",
            Error::Changed { .. } => "changed",
            Error::NotEditable { .. } | Error::EditByCommand { .. } => "not_editable",
            Error::WriteOnce { .. } => "write_once",
            Error::DigestMismatch { .. } => "digest_mismatch",
            Error::TooLarge { .. } => "too_large",
            Error::SnapshotQuota { .. } => "snapshot_quota",
            Error::Unavailable => "store_unavailable",
            Error::Io { .. } | Error::PublicationLost { .. } => "io_error",
            Error::Fenced { .. } => "fenced",
            Error::NotPermitted { .. } => "identity",
            Error::ClaimRefused { reason, .. } => reason,
            Error::EventNotPermitted { .. } => "event_not_permitted",
            Error::PublicationUnproven { .. } => "publication_unproven",
            Error::InvalidId { .. } | Error::InvalidProjectId(_) => "invalid_id",
            // A project not made yet has a word of its own: clients tell it from a missing
            // file (the CLI names `cairn project create`; listings of a missing prefix are empty).
            Error::ProjectNotFound(_) => "no_project",
            Error::NotFound { .. } | Error::RunNotFound { .. } => "not_found",
            Error::VersionConflict { .. } => "version_conflict",
            Error::Archived { .. } => "archived",
            Error::NotArchived { .. } => "not_archived",
            Error::Unfinished { .. } => "run_unfinished",
            Error::NotEmpty { .. } => "store_not_empty",
            Error::BadBackup(_) => "backup_corrupt",
            e => cairn_proto::reason::fallback(e.code()),
        }
    }

    /// What the refusal is about, for `ErrorInfo.metadata` (empty values are left out).
    fn details(&self) -> Vec<(&'static str, String)> {
        match self {
            Error::Reserved { path, .. }
            | Error::SymlinkInPath { path }
            | Error::NotAFile { path, .. }
            | Error::DigestMismatch { path, .. } => vec![("path", path.clone())],
            Error::NotEditable { path, .. }
            | Error::EditByCommand { path, .. }
            | Error::WriteOnce { path } => {
                vec![("path", path.clone())]
            }
            Error::Exists { project, path, .. }
            | Error::Changed { project, path, .. }
            | Error::NotFound { project, path } => {
                vec![("project", project.clone()), ("path", path.clone())]
            }
            Error::ProjectNotFound(project) => vec![("project", project.clone())],
            Error::SnapshotQuota {
                project,
                path,
                held,
                limit,
                ..
            } => vec![
                ("project", project.clone()),
                ("path", path.clone()),
                ("held_bytes", held.to_string()),
                ("limit_bytes", limit.to_string()),
            ],
            Error::RunNotFound { project, run } => {
                vec![("project", project.clone()), ("run_id", run.clone())]
            }
            Error::VersionConflict {
                path,
                stored,
                expected,
            } => vec![
                ("path", path.clone()),
                ("stored_version", stored.to_string()),
                ("expected_version", expected.to_string()),
            ],
            Error::Fenced { run, current, .. } => {
                vec![("run_id", run.clone()), ("epoch", current.to_string())]
            }
            Error::PublicationLost { run, path, .. } => {
                vec![("run_id", run.clone()), ("path", path.clone())]
            }
            Error::PublicationUnproven { run, .. }
            | Error::Archived { run }
            | Error::NotArchived { run }
            | Error::Unfinished { run, .. } => vec![("run_id", run.clone())],
            Error::EventNotPermitted { run, kind, .. } => {
                vec![("run_id", run.clone()), ("type", kind.clone())]
            }
            Error::InvalidId { kind, id } => {
                vec![("field", (*kind).to_owned()), ("id", id.clone())]
            }
            Error::InvalidProjectId(id) => {
                vec![("field", "project".to_owned()), ("id", id.clone())]
            }
            Error::Path(r) => vec![("path", r.path.clone())],
            _ => Vec::new(),
        }
    }

    fn code(&self) -> Code {
        match self {
            Error::Path(r) => match r.reason {
                Reason::Denied | Reason::PrefixNotAllowed => Code::PermissionDenied,
                _ => Code::InvalidArgument,
            },
            Error::Reserved { .. }
            | Error::SymlinkInPath { .. }
            | Error::NotPermitted { .. }
            | Error::ClaimRefused { .. }
            | Error::EventNotPermitted { .. } => Code::PermissionDenied,
            Error::NotAFile { .. }
            | Error::PublicationLost { .. }
            | Error::PublicationUnproven { .. }
            | Error::Changed { .. }
            | Error::NotEditable { .. }
            | Error::EditByCommand { .. }
            | Error::WriteOnce { .. }
            | Error::Archived { .. }
            | Error::NotArchived { .. }
            | Error::Unfinished { .. }
            | Error::NotEmpty { .. }
            | Error::Fenced { .. } => Code::FailedPrecondition,
            Error::BadBackup(_) => Code::DataLoss,
            Error::Exists { .. } => Code::AlreadyExists,
            Error::DigestMismatch { .. }
            | Error::InvalidId { .. }
            | Error::InvalidProjectId(_)
            | Error::BadRequest(_)
            | Error::Stream(_) => Code::InvalidArgument,
            Error::TooLarge { .. } | Error::SnapshotQuota { .. } => Code::ResourceExhausted,
            Error::ProjectNotFound(_) | Error::NotFound { .. } | Error::RunNotFound { .. } => {
                Code::NotFound
            }
            Error::VersionConflict { .. } => Code::Aborted,
            Error::Unavailable => Code::Unavailable,
            Error::Io { source, .. } if disk_full(source) => Code::ResourceExhausted,
            Error::Io { .. } | Error::Config(_) | Error::Server(_) => Code::Internal,
        }
    }
}

/// No space or quota left for a write (ENOSPC, EDQUOT, EFBIG): RESOURCE_EXHAUSTED on every
/// write RPC, so a client can tell "free some space" from a bug.
fn disk_full(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::FileTooLarge
    )
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        let code = err.code();
        if code == Code::Internal {
            tracing::error!(error = %err, "artifact-store internal error");
        }
        let details = err.details();
        let pairs: Vec<(&str, &str)> = details.iter().map(|(k, v)| (*k, v.as_str())).collect();
        cairn_proto::reason::status_with(code, err.to_string(), err.reason(), &pairs)
    }
}

/// Turns an errno met while walking to `path` into the store's refusal.
pub(crate) fn refusal(errno: Errno, project: &str, path: &str, doing: &str) -> Error {
    match errno {
        // ELOOP: a symlink on the way (RESOLVE_NO_SYMLINKS / O_NOFOLLOW); EXDEV: an escape
        // attempt caught by RESOLVE_BENEATH.
        Errno::LOOP | Errno::XDEV => Error::SymlinkInPath { path: path.to_owned() },
        Errno::NOTDIR => Error::NotAFile {
            path: path.to_owned(),
            found: "a file is where a directory of the path should be; choose another path or delete that file",
        },
        Errno::ISDIR => Error::NotAFile {
            path: path.to_owned(),
            found: "a directory is there, not a file; choose another path",
        },
        Errno::NOENT => Error::NotFound { project: project.to_owned(), path: path.to_owned() },
        Errno::NAMETOOLONG => Error::BadRequest(format!("path {path:?} is too long for the filesystem")),
        e => Error::io(format!("{doing} {path:?} in project {project:?}"), e),
    }
}
