//! The code delivery agent as the `code_delivery` node type: a tool loop over a
//! sandbox session with exactly seven tools (read, write, glob, grep, run_bash_command,
//! todo, end), whose `end` packs the workspace, stores the archive in the artifact-store and
//! delivers it to a OneBot chat or a project directory. Containers and task directories belong
//! to the sandbox runner; this crate never touches a host path. It depends on the node API
//! (cairn-node), the agents, the graph language, delivery and the service clients; never on
//! the orchestrator.
//!
//! - `spec`: the node's fields and submit-time checks;
//! - `agent`: the loop, limits, `end`, the failure notice and cleanup;
//! - `agent::checkpoint`: checkpoints of the session and failover to another runner;
//! - `archive`: the archive's name, format and excludes;
//! - `tools`: the tools' JSON schemas and argument parsing;
//! - `node`: the `code_delivery` node kind; the runner session is cairn-runner-client's
//!   (closed on drop, so cancel cleans up too);
//! - `target`: OneBot chat or directory; `todo`: the `todo` board; `prompt`: what the model is told.

pub mod agent;
mod archive;
pub mod config;
pub mod node;
pub mod prompt;
pub mod target;
pub mod todo;
pub mod tools;

pub use cairn_graph::code_delivery as spec;
pub use cairn_graph::code_delivery::CodeDelivery;
pub use config::{ArchiveFormat, CodeDeliveryConfig};

// Events of a code delivery task (in the run's events.jsonl, with the node id).
/// The task began: source, target, provider, limits.
pub const STARTED: &str = "code_delivery.started";
/// The sandbox session is open: session_id, container_name, backend, git_commit, runner.
pub const SESSION_OPENED: &str = "code_delivery.session_opened";
// Each attempt of an LLM request is an `llm.attempt` event (events.rs) with `step`, the
// request's number in the loop.
/// One tool call: step, call_id, tool, arguments, ok, result (both cut at 2000 characters).
pub const TOOL_CALL: &str = "code_delivery.tool_call";
/// `end` stored the archive and tried the target: archive, sha256, size_bytes, status.
pub const DELIVERED: &str = "code_delivery.delivered";
/// The failure notice: target, stage, error_summary, sent.
pub const FAILURE_NOTICE: &str = "code_delivery.failure_notice";
/// The session was closed (cleanup): session_id, closed.
pub const CLOSED: &str = "code_delivery.session_closed";
/// The session was left open (`cleanup_on_finish = false`).
pub const KEPT: &str = "code_delivery.session_kept";
