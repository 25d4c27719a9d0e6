//! The records of one external agent instance under `.cairn/runs/<run>/agents/<instance>/`
//! `session.json` in the documented shape, `runtime/requests.jsonl`
//! (each turn as sent), `runtime/events.jsonl` (the CLI's own event lines, verbatim),
//! `runtime/stderr.log`, `runtime/pid`, and the CLI's kept state (`codex_home/...`). Everything
//! goes through the store; this module never touches a filesystem.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tonic::Status;

use cairn_node::RunDir;
use cairn_store_client::{PutOptions, Store};

/// The states of an agent instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    /// A CLI process is running a turn.
    Working,
    /// The turn ended asking a human (the node's gate is blocked); resumed once decided.
    Awaiting,
    /// No process; the handle is kept, so a rework or a later attempt resumes the session.
    Dormant,
}

impl InstanceState {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Working => "working",
            InstanceState::Awaiting => "awaiting",
            InstanceState::Dormant => "dormant",
        }
    }
}

/// `recording` of session.json: paths relative to the instance directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recording {
    pub requests: String,
    pub events: String,
    pub stderr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,
}

impl Default for Recording {
    fn default() -> Self {
        Recording {
            requests: format!("./{REQUESTS}"),
            events: format!("./{EVENTS}"),
            stderr: format!("./{STDERR}"),
            rollout: None,
        }
    }
}

/// session.json, field for field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionFile {
    pub agent: String,
    pub instance: String,
    pub adapter: String,
    /// The adapter's opaque handle (codex: tool, threadId, cwd, codexHome, rolloutPath);
    /// `null` until the CLI has reported one.
    pub vendor_session: Value,
    pub recording: Recording,
    pub started_at: String,
    pub last_active_at: String,
    pub state: InstanceState,
}

pub const SESSION: &str = "session.json";
pub const REQUESTS: &str = "runtime/requests.jsonl";
pub const EVENTS: &str = "runtime/events.jsonl";
pub const STDERR: &str = "runtime/stderr.log";
pub const PID: &str = "runtime/pid";

/// Writer of one instance's directory.
#[derive(Clone)]
pub struct InstanceRecords {
    store: Store,
    project: String,
    dir: RunDir,
    pub instance: String,
}

impl InstanceRecords {
    pub fn new(store: Store, project: &str, run_id: &str, instance: &str) -> InstanceRecords {
        InstanceRecords {
            store,
            project: project.to_owned(),
            dir: RunDir::new(run_id),
            instance: instance.to_owned(),
        }
    }

    /// Project path of `rel` inside the instance directory.
    pub fn path(&self, rel: &str) -> String {
        self.dir.agent(&self.instance, rel)
    }

    /// Replaces `rel` (the instance's own records are always overwritten).
    pub async fn put(&self, rel: &str, bytes: Bytes) -> Result<(), Status> {
        let opts = PutOptions {
            overwrite: true,
            ..Default::default()
        };
        self.store
            .put(&self.project, &self.path(rel), bytes, &opts)
            .await
            .map(|_| ())
    }

    pub async fn get(&self, rel: &str) -> Result<Option<Bytes>, Status> {
        self.store.get(&self.project, &self.path(rel)).await
    }

    /// Appends `text` to `rel` (the store has no append: read, then replace; one writer per
    /// instance, the node attempt).
    pub async fn append(&self, rel: &str, text: &str) -> Result<(), Status> {
        if text.is_empty() {
            return Ok(());
        }
        let mut body = self.get(rel).await?.map(|b| b.to_vec()).unwrap_or_default();
        if !body.is_empty() && !body.ends_with(b"\n") {
            body.push(b'\n');
        }
        body.extend_from_slice(text.as_bytes());
        if !body.ends_with(b"\n") {
            body.push(b'\n');
        }
        self.put(rel, Bytes::from(body)).await
    }

    /// session.json as last written; `None` before the first turn (or when unreadable, which
    /// starts a new session rather than failing on a hand-edited file).
    pub async fn load_session(&self) -> Result<Option<SessionFile>, Status> {
        Ok(self
            .get(SESSION)
            .await?
            .and_then(|b| serde_json::from_slice::<SessionFile>(&b).ok()))
    }

    pub async fn save_session(&self, s: &SessionFile) -> Result<(), Status> {
        let text = serde_json::to_string_pretty(s).unwrap_or_default();
        self.put(SESSION, Bytes::from(format!("{text}\n"))).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_json_has_exactly_the_seed_fields() {
        let s = SessionFile {
            agent: "db".into(),
            instance: "db-1".into(),
            adapter: "codex-exec".into(),
            vendor_session: serde_json::json!({"tool": "codex", "threadId": "t"}),
            recording: Recording {
                rollout: Some("./codex_home/sessions/r.jsonl".into()),
                ..Default::default()
            },
            started_at: "2025-12-14T15:01:10Z".into(),
            last_active_at: "2025-12-14T15:03:33Z".into(),
            state: InstanceState::Awaiting,
        };
        let v = serde_json::to_value(&s).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "adapter",
                "agent",
                "instance",
                "lastActiveAt",
                "recording",
                "startedAt",
                "state",
                "vendorSession"
            ]
        );
        assert_eq!(v["state"], "awaiting");
        assert_eq!(v["recording"]["requests"], "./runtime/requests.jsonl");
        assert_eq!(v["recording"]["events"], "./runtime/events.jsonl");
        assert_eq!(v["recording"]["stderr"], "./runtime/stderr.log");
        assert_eq!(v["recording"]["rollout"], "./codex_home/sessions/r.jsonl");
        let back: SessionFile = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
    }
}
