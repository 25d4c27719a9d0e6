//! External coding-agent CLIs as agent instances. An adapter knows one CLI:
//! the command line of a turn (new, or resumed by the CLI's own session handle), how its JSONL
//! event stream reads, and which of its state files must be kept so a dormant instance can be
//! resumed later. It never runs anything itself: the `external_agent` node kind (node.rs) runs
//! each turn in a runner session (cairn-runner-client) and records the instance under
//! `agents/<instance>/` (session.rs). docs/adapters.md explains how to add one.
//! Depends on the node API (cairn-node), the graph language and the service clients; never on
//! the orchestrator.

pub mod codex;
mod live;
pub mod node;
mod report;
pub mod session;
pub mod turns;

use serde::Serialize;
use serde_json::Value;

pub use codex::CodexExec;

/// Names of the adapters this build knows, for messages.
pub const ADAPTERS: &[&str] = &[codex::NAME];

/// The adapter called `name` (graph field `adapter:`).
pub fn by_name(name: &str) -> Option<&'static dyn AgentAdapter> {
    match name {
        codex::NAME => Some(&CodexExec),
        _ => None,
    }
}

/// Why a line of a CLI's stream or a turn's request could not be handled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    /// The CLI wrote something its protocol does not allow (not JSON, a known event missing a
    /// required field).
    #[error("{adapter}: line {line} of its output is not a valid event: {message}")]
    Protocol {
        adapter: &'static str,
        line: usize,
        message: String,
    },
    /// The turn cannot be expressed for this CLI (e.g. an empty prompt).
    #[error("{adapter}: {message}")]
    Request {
        adapter: &'static str,
        message: String,
    },
}

/// How a file changed, as the CLI reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Add,
    Update,
    Delete,
}

/// One changed file. `path` is as the CLI wrote it (absolute inside the sandbox, or relative
/// to the CLI's working directory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileChange {
    pub path: String,
    pub kind: ChangeKind,
}

/// Token counts of one turn (whatever the CLI reports; absent fields are 0).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TurnUsage {
    pub input_tokens: u64,
    pub cached_input_tokens: u64,
    pub output_tokens: u64,
}

/// What a line of a CLI's stream means to the orchestrator.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentEvent {
    /// The CLI's session handle (codex: the thread id of `thread.started`).
    SessionStarted {
        handle: String,
    },
    TurnStarted,
    /// A message of the agent (the last one is the node's `text`).
    Message {
        text: String,
    },
    /// A command the agent ran (recorded; nothing to do).
    Command {
        command: String,
        exit_code: Option<i64>,
    },
    /// Files the agent changed (applied changes only).
    FilesChanged {
        changes: Vec<FileChange>,
    },
    /// The CLI refused to do something without a human's approval (a gate).
    ApprovalRequested {
        id: String,
        what: String,
    },
    TurnCompleted {
        usage: TurnUsage,
    },
    TurnFailed {
        message: String,
    },
    /// An error the CLI reported; fatal only when the turn does not complete afterwards.
    Error {
        message: String,
    },
    /// Anything else (reasoning, plans, unknown future event types): kept in the recording.
    Other,
}

/// What kind of turn to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TurnKind {
    /// A new CLI session.
    Start,
    /// Continue the CLI session `handle` (after a gate decision, a rework, an interruption).
    Resume { handle: String },
}

/// One turn to run.
#[derive(Clone, Debug)]
pub struct Turn {
    pub kind: TurnKind,
    pub prompt: String,
    /// A human approved what the previous turn asked for: the adapter may lift the CLI's own
    /// approval policy for this turn (the sandbox still isolates it).
    pub approved: bool,
    /// The node's extra arguments (`args:`), after the adapter's own.
    pub extra_args: Vec<String>,
}

/// Where a CLI keeps its resumable state inside the sandbox, and which part of it is kept in
/// the run directory between turns (the instance may be resumed in a fresh sandbox session).
#[derive(Clone, Copy, Debug)]
pub struct StateDir {
    /// Directory name, both under the sandbox's state root and under `agents/<instance>/`.
    pub name: &'static str,
    /// Environment variable that points the CLI at it.
    pub env: &'static str,
    /// Sub-paths kept between turns (prefixes ending in `/`, or file names). Credentials and
    /// caches are never kept.
    pub keep: &'static [&'static str],
}

/// One external agent CLI.
pub trait AgentAdapter: Send + Sync {
    /// Name in graphs (`adapter:`) and in session.json `adapter`.
    fn name(&self) -> &'static str;
    /// The program when the node sets no `command` (argv prefix, found on the sandbox's PATH).
    fn default_command(&self) -> Vec<String>;
    /// The CLI's state directory.
    fn state_dir(&self) -> StateDir;
    /// The full argv of `turn` (`command` is the program prefix).
    fn argv(&self, command: &[String], turn: &Turn) -> Result<Vec<String>, AdapterError>;
    /// Reads one non-empty line of the CLI's stdout (`line_no` is 1-based, for messages).
    fn parse_line(&self, line_no: usize, line: &str) -> Result<AgentEvent, AdapterError>;
    /// session.json `vendorSession`: an opaque handle the orchestrator stores and gives back.
    /// `rollout` is the recorded rollout file relative to the instance directory, if any.
    fn vendor_session(&self, handle: &str, cwd: &str, rollout: Option<&str>) -> Value;
    /// The resume handle inside a stored `vendorSession`.
    fn handle_of(&self, vendor_session: &Value) -> Option<String>;
    /// The CLI's rollout file among the kept state files (relative to the state dir), if any.
    fn rollout_of(&self, _handle: &str, _kept: &[String]) -> Option<String> {
        None
    }
}

/// Quotes `s` for `bash -lc` (single quotes; embedded quotes closed and escaped).
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_keeps_words_and_escapes_the_rest() {
        assert_eq!(shell_quote("codex"), "codex");
        assert_eq!(shell_quote("--json"), "--json");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's $HOME `x`"), r"'it'\''s $HOME `x`'");
    }

    #[test]
    fn adapters_are_found_by_name() {
        for name in ADAPTERS {
            assert_eq!(by_name(name).map(|a| a.name()), Some(*name));
        }
        assert!(by_name("nope").is_none());
    }
}
