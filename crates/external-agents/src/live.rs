//! A live turn of an `external_agent` node: the runner session of the attempt, the staging
//! of the project files and the CLI's kept state, the CLI's one `Exec`, and what comes back
//! (its event lines, stderr and pid under `agents/<instance>/runtime/`, the turn's record
//! under `turns/<attempt>-<turn>/` (turns.rs), its file changes written back through the
//! store, its kept state).

use std::collections::BTreeMap;

use bytes::Bytes;
use cairn_proto::v1::{OpenSessionRequest, WriteMode};
use serde_json::json;

use crate::report::{
    plan_changes, status_error, TurnDone, MAX_STAGED_BYTES, MAX_STAGED_FILES, PROJECT_DIR,
    STATE_ROOT,
};
use crate::session::{InstanceRecords, PID, REQUESTS};
use crate::turns::{self, TurnRecord};
use crate::{shell_quote, AgentAdapter, ChangeKind, Turn};
use cairn_graph::{ErrorKind, ExternalAgent};
use cairn_node::events::now;
use cairn_node::{NodeCtx, NodeError};
use cairn_runner_client::session::RunnerSession;
use cairn_store_client::PutOptions;

/// Marker the turn's shell writes to stderr before it becomes the CLI.
const PID_MARKER: &str = "cairn-agent-pid ";

/// Runs the turn in a runner session of its own, opened here and closed on every way out
/// (`close`, or drop on cancel and deadline).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn live_turn(
    ctx: &NodeCtx,
    spec: &ExternalAgent,
    adapter: &dyn AgentAdapter,
    records: &InstanceRecords,
    workspace: &str,
    argv: &[String],
    resumed: bool,
    turn: &Turn,
    request: &str,
) -> Result<TurnDone, NodeError> {
    let sandbox_id = format!("agent-{}", uuid::Uuid::new_v4());
    // The balancer picks a healthy runner; the session stays on it.
    let opened = match ctx.backends.runners.pick().await {
        Ok(runner) => {
            let req = OpenSessionRequest {
                session_id: sandbox_id.clone(),
                git: None,
                network: spec.network,
                limits: None,
                run_id: ctx.run_id.clone(),
                node_id: ctx.node_id.clone(),
                // The runner's default image (the adapter's CLI is staged into it).
                image: String::new(),
            };
            RunnerSession::open(vec![runner], req, "external_agent").await
        }
        Err(s) => Err(s),
    };
    // The turn's record once its CLI ran (None: it failed before).
    let mut ran = None;
    let outcome = match opened {
        Ok(sandbox) => {
            let outcome = turn_in(
                ctx, spec, adapter, records, &sandbox, workspace, argv, resumed, turn, request,
                &mut ran,
            )
            .await;
            if let Err(e) = sandbox.close().await {
                tracing::warn!(session_id = %sandbox_id, error = %e.message(), "closing the agent's sandbox session failed; the runner removes it at its next start");
            }
            outcome
        }
        Err(s) => Err(NodeError::from_status(
            "opening the agent's sandbox session",
            &s,
        )),
    };
    if let Err(e) = &outcome {
        turns::record_failure(ctx, records, adapter.name(), request, ran, e).await;
    }
    outcome
}

/// The shell command of a turn: make the directories, point the CLI at its state, announce
/// the pid, then become the CLI.
fn turn_command(
    argv: &[String],
    env: &BTreeMap<String, String>,
    state_env: &str,
    state_dir: &str,
) -> String {
    let mut cmd = format!(
        "mkdir -p /workspace/{PROJECT_DIR} /workspace/{STATE_ROOT}/{state_dir} && cd /workspace/{PROJECT_DIR} && export {state_env}=/workspace/{STATE_ROOT}/{state_dir}"
    );
    for (k, v) in env {
        cmd.push_str(&format!(" {k}={}", shell_quote(v)));
    }
    cmd.push_str(&format!(" && echo \"{PID_MARKER}$$\" >&2 && exec"));
    for a in argv {
        cmd.push(' ');
        cmd.push_str(&shell_quote(a));
    }
    cmd
}

/// The pid marker line out of stderr: (pid, the rest of stderr).
fn split_pid(stderr: &str) -> (Option<u32>, String) {
    let mut pid = None;
    let mut rest = String::with_capacity(stderr.len());
    for line in stderr.split_inclusive('\n') {
        if pid.is_none() {
            if let Some(p) = line.trim_end().strip_prefix(PID_MARKER) {
                if let Ok(n) = p.trim().parse() {
                    pid = Some(n);
                    continue;
                }
            }
        }
        rest.push_str(line);
    }
    (pid, rest)
}

/// Stages, runs the turn, records it, writes its file changes back and keeps the CLI's state.
#[allow(clippy::too_many_arguments)]
async fn turn_in(
    ctx: &NodeCtx,
    spec: &ExternalAgent,
    adapter: &dyn AgentAdapter,
    records: &InstanceRecords,
    sandbox: &RunnerSession,
    workspace: &str,
    argv: &[String],
    resumed: bool,
    turn: &Turn,
    request: &str,
    ran: &mut Option<TurnRecord>,
) -> Result<TurnDone, NodeError> {
    let state = adapter.state_dir();
    // The project directory, then the CLI's kept state.
    let files = ctx
        .store()
        .list(&ctx.project, workspace, true)
        .await
        .map_err(status_error(&format!("listing {workspace}/")))?;
    let files: Vec<String> = files
        .into_iter()
        .filter(|e| e.kind == cairn_proto::v1::EntryKind::File as i32)
        .map(|e| e.path)
        .collect();
    if files.len() > MAX_STAGED_FILES {
        return Err(NodeError::refused(format!(
            "{workspace}/ holds {} files; at most {MAX_STAGED_FILES} are staged: point `workspace` at a smaller directory",
            files.len()
        )));
    }
    let mut total = 0u64;
    for path in &files {
        let Some(rel) = path
            .strip_prefix(workspace)
            .and_then(|r| r.strip_prefix('/'))
        else {
            continue;
        };
        let bytes = ctx
            .store()
            .get(&ctx.project, path)
            .await
            .map_err(status_error(&format!("reading {path}")))?
            .unwrap_or_default();
        total += bytes.len() as u64;
        if total > MAX_STAGED_BYTES {
            return Err(NodeError::refused(format!(
                "{workspace}/ holds more than {} MiB; point `workspace` at a smaller directory",
                MAX_STAGED_BYTES >> 20
            )));
        }
        sandbox
            .write(&format!("{PROJECT_DIR}/{rel}"), bytes, WriteMode::Overwrite)
            .await
            .map_err(status_error(&format!("staging {path}")))?;
    }
    let kept_prefix = records.path(state.name);
    let kept_files = ctx
        .store()
        .list(&ctx.project, &kept_prefix, true)
        .await
        .map_err(status_error(&format!("listing {kept_prefix}/")))?;
    for e in kept_files
        .into_iter()
        .filter(|e| e.kind == cairn_proto::v1::EntryKind::File as i32)
    {
        let Some(rel) = e
            .path
            .strip_prefix(&format!("{kept_prefix}/"))
            .map(str::to_owned)
        else {
            continue;
        };
        let bytes = ctx
            .store()
            .get(&ctx.project, &e.path)
            .await
            .map_err(status_error(&format!("reading {}", e.path)))?
            .unwrap_or_default();
        sandbox
            .write(
                &format!("{STATE_ROOT}/{}/{rel}", state.name),
                bytes,
                WriteMode::Overwrite,
            )
            .await
            .map_err(status_error("restoring the agent's state"))?;
    }

    let timeout_s = spec
        .turn_timeout_s
        .unwrap_or(crate::report::DEFAULT_TURN_TIMEOUT_S);
    let dir = turns::TurnDir::of(ctx);
    dir.put_request(records, request).await?;
    records
        .append(
            REQUESTS,
            &json!({
                "ts": now(),
                "node": ctx.node_id,
                "turn": ctx.turn,
                "attempt": ctx.attempt,
                "kind": if resumed { "resume" } else { "start" },
                "approved": turn.approved,
                "argv": argv,
                "env": spec.env,
                "sandbox": {"runner": sandbox.runner, "session_id": sandbox.id()},
                "staged_files": files.len(),
                "timeout_s": timeout_s,
            })
            .to_string(),
        )
        .await
        .map_err(status_error("recording the request"))?;
    let command = turn_command(argv, &spec.env, state.env, state.name);
    let result = sandbox
        .exec(&command, timeout_s.saturating_mul(1000), "")
        .await
        .map_err(status_error("running the agent's turn"))?;
    let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
    let (pid, stderr) = split_pid(&String::from_utf8_lossy(&result.stderr));
    // The turn's record, before anything else can fail: a replay answers the turn from it.
    let ended = turns::Ended {
        exit_code: result.exit_code,
        timed_out: result.timed_out,
        stdout_truncated: result.stdout_truncated,
    };
    let (mut record, report) = turns::record_output(
        ctx, records, adapter, &dir, request, &stdout, &stderr, ended,
    )
    .await?;
    *ran = Some(record.clone());
    if let Some(pid) = pid {
        records
            .put(PID, Bytes::from(format!("{pid}\n")))
            .await
            .map_err(status_error("recording the agent's pid"))?;
    }

    // File changes go back to the project, beneath `workspace` only.
    let mut written = Vec::new();
    let mut deleted = Vec::new();
    let opts = PutOptions {
        overwrite: spec.overwrite || ctx.reset || resumed,
        run_id: ctx.run_id.clone(),
        allowed_prefixes: vec![workspace.to_owned()],
        ..Default::default()
    };
    for (rel, kind) in plan_changes(adapter, &report, workspace)? {
        let path = format!("{workspace}/{rel}");
        let file = match kind {
            ChangeKind::Delete => None,
            // Gone again by the end of the turn (removed by a command): mirrored as deleted.
            _ => match sandbox.read(&format!("{PROJECT_DIR}/{rel}"), 0).await {
                Ok(f) => Some(f),
                Err(s) if s.code() == tonic::Code::NotFound => None,
                Err(s) => {
                    return Err(NodeError::from_status(
                        &format!("reading the changed file {rel}"),
                        &s,
                    ))
                }
            },
        };
        let Some(file) = file else {
            record.removed.push(turns::mark(&path, &ctx.run_id));
            if ctx
                .store()
                .delete(&ctx.project, &path, &ctx.run_id)
                .await
                .map_err(status_error(&format!("deleting {path}")))?
            {
                record.deleted.push(turns::mark(&path, &ctx.run_id));
                deleted.push(path);
            }
            continue;
        };
        if file.truncated {
            return Err(NodeError::new(
                ErrorKind::Failed,
                format!(
                    "the changed file {rel} is {} bytes, more than the runner's read cap; nothing of it was written back",
                    file.size_bytes
                ),
            ));
        }
        let sha256 = dir.put_file(records, &file.content).await?;
        record.files.push(turns::RecordedFile {
            path: turns::mark(&path, &ctx.run_id),
            sha256,
            size: file.content.len() as u64,
        });
        let put = ctx
            .store()
            .put(&ctx.project, &path, file.content, &opts)
            .await
            .map_err(|s| cairn_node::write_error(&path, &s))?;
        written.push(put);
    }

    // The CLI's resumable state, for the next attempt (maybe in another session).
    let base = format!("{STATE_ROOT}/{}", state.name);
    let listed = sandbox
        .glob("**", &base)
        .await
        .map_err(status_error("listing the agent's state"))?;
    let (paths, truncated) = (listed.paths, listed.truncated);
    if truncated {
        tracing::warn!(run_id = %ctx.run_id, node = %ctx.node_id, "the agent's state directory has more files than one Glob returns; some are not kept");
    }
    let mut kept = Vec::new();
    for p in paths {
        let Some(rel) = p.strip_prefix(&format!("{base}/")).map(str::to_owned) else {
            continue;
        };
        if !state
            .keep
            .iter()
            .any(|k| rel == *k || (k.ends_with('/') && rel.starts_with(k)))
        {
            continue;
        }
        let file = sandbox
            .read(&p, 0)
            .await
            .map_err(status_error("reading the agent's state"))?;
        if file.truncated {
            tracing::warn!(run_id = %ctx.run_id, node = %ctx.node_id, file = %rel, "an agent state file is larger than the runner's read cap; not kept");
            continue;
        }
        records
            .put(&format!("{}/{rel}", state.name), file.content)
            .await
            .map_err(status_error("keeping the agent's state"))?;
        kept.push(rel);
    }

    let done = TurnDone {
        report,
        exit_code: result.exit_code,
        timed_out: result.timed_out,
        timeout_s,
        written,
        deleted,
        kept,
    };
    turns::finish(ctx, records, &dir, record, done).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_turn_command_quotes_everything() {
        let env = BTreeMap::from([("MODE".to_owned(), "a b".to_owned())]);
        let cmd = turn_command(
            &["codex".into(), "exec".into(), "it's".into()],
            &env,
            "CODEX_HOME",
            "codex_home",
        );
        assert_eq!(
            cmd,
            "mkdir -p /workspace/project /workspace/.cairn-agent/codex_home && cd /workspace/project && export CODEX_HOME=/workspace/.cairn-agent/codex_home MODE='a b' && echo \"cairn-agent-pid $$\" >&2 && exec codex exec 'it'\\''s'"
        );
    }

    #[test]
    fn the_pid_marker_is_taken_out_of_stderr() {
        assert_eq!(
            split_pid("cairn-agent-pid 42\nwarn: x\n"),
            (Some(42), "warn: x\n".to_owned())
        );
        assert_eq!(split_pid("no marker\n"), (None, "no marker\n".to_owned()));
    }
}
