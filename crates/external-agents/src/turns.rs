//! The record of each external agent turn, and a replay's turn answered from it.
//!
//! `agents/<instance>/turns/<attempt>-<turn>/` holds, per CLI turn:
//! - `request.json`: the turn as a replay compares it (adapter, start or resume, approved,
//!   argv with the prompt, env, workspace, network, timeout; the run's id written as a mark);
//! - `transcript.jsonl`: the CLI's stdout, its JSONL event stream, as it printed it;
//! - `stderr.log`: its stderr (the pid marker taken out);
//! - `files/<sha256>`: the bytes of each file the turn wrote back into the workspace;
//! - `turn.json`: exit code, timeout, the sha256 of the request and the transcript, the files
//!   written back (project path, sha256, size), the paths mirrored as deleted, the CLI state
//!   files kept, whether the turn got that far (`complete`) and, for a turn that failed (its
//!   CLI run or not: no runner, staging refused), the node's `error`.
//!
//! A replay (`--sandbox recorded`) takes the record of the same attempt and turn of the
//! recorded run, checks its request against the one it would send, feeds the transcript
//! through the adapter's parser and writes the recorded bytes back, each checked against its
//! sha256. No runner session is opened and no CLI runs.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::report::{plan_changes, status_error, write_messages, TurnDone, TurnReport};
use crate::session::{InstanceRecords, EVENTS, REQUESTS, STDERR};
use crate::AgentAdapter;
use cairn_agents::records::{pretty, replace_in, unified_diff, RUN_ID_MARK};
use cairn_node::events::now;
use cairn_node::layout::AGENT_TURNS_DIR;
use cairn_node::{NodeCtx, NodeError, RunDir};
use cairn_sha256::sha256_hex;
use cairn_store_client::PutOptions;

pub const REQUEST: &str = "request.json";
pub const TRANSCRIPT: &str = "transcript.jsonl";
pub const TURN_STDERR: &str = "stderr.log";
pub const TURN: &str = "turn.json";
pub const FILES: &str = "files";
/// turn.json's `version`.
pub const VERSION: u32 = 1;

/// One file a turn wrote back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedFile {
    /// Project path, the run's id written as a mark.
    pub path: String,
    /// sha256 of its bytes, kept as `files/<sha256>`.
    pub sha256: String,
    pub size: u64,
}

/// turn.json, field for field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub version: u32,
    pub node: String,
    pub attempt: u32,
    pub turn: u32,
    pub adapter: String,
    pub request_sha256: String,
    pub transcript_sha256: String,
    pub stderr_sha256: String,
    pub exit_code: i32,
    pub timed_out: bool,
    /// The runner cut the CLI's stdout at its output cap.
    pub stdout_truncated: bool,
    /// Files written back, in order.
    pub files: Vec<RecordedFile>,
    /// Project paths mirrored as deleted (reported deleted, or gone by the end of the turn).
    pub removed: Vec<String>,
    /// Those of them the project had (the node's `deleted_files`).
    pub deleted: Vec<String>,
    /// The CLI's state files kept (relative to its state directory).
    pub kept: Vec<String>,
    /// The turn's changes went back and its state was kept (false: it failed in between).
    pub complete: bool,
    /// Why the turn failed, as the node failed (absent: it did not, or it was recorded before
    /// failures were); a replay fails the turn with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RecordedError>,
}

/// A turn's failure: the node error's kind and message (the run's id written as a mark).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedError {
    pub kind: cairn_graph::ErrorKind,
    pub message: String,
}

impl TurnRecord {
    pub fn new(
        ctx: &NodeCtx,
        adapter: &str,
        request: &str,
        transcript: &str,
        stderr: &str,
    ) -> TurnRecord {
        TurnRecord {
            version: VERSION,
            node: ctx.node_id.clone(),
            attempt: ctx.attempt,
            turn: ctx.turn,
            adapter: adapter.to_owned(),
            request_sha256: sha256_hex(request.as_bytes()),
            transcript_sha256: sha256_hex(transcript.as_bytes()),
            stderr_sha256: sha256_hex(stderr.as_bytes()),
            exit_code: 0,
            timed_out: false,
            stdout_truncated: false,
            files: Vec::new(),
            removed: Vec::new(),
            deleted: Vec::new(),
            kept: Vec::new(),
            complete: false,
            error: None,
        }
    }
}

/// How a turn's CLI ended: its exit code, whether it timed out, whether the runner cut its
/// stdout at the output cap.
pub(crate) struct Ended {
    pub exit_code: i32,
    pub timed_out: bool,
    pub stdout_truncated: bool,
}

/// What a turn's CLI printed, run live or answered from its record: its event lines and
/// stderr appended to the instance's logs, the turn's transcript and record written, and the
/// event lines read as the turn's report.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn record_output(
    ctx: &NodeCtx,
    records: &InstanceRecords,
    adapter: &dyn AgentAdapter,
    dir: &TurnDir,
    request: &str,
    stdout: &str,
    stderr: &str,
    ended: Ended,
) -> Result<(TurnRecord, TurnReport), NodeError> {
    records
        .append(EVENTS, stdout)
        .await
        .map_err(status_error("recording the agent's events"))?;
    records
        .append(STDERR, stderr)
        .await
        .map_err(status_error("recording the agent's stderr"))?;
    let mut record = TurnRecord::new(ctx, adapter.name(), request, stdout, stderr);
    record.exit_code = ended.exit_code;
    record.timed_out = ended.timed_out;
    record.stdout_truncated = ended.stdout_truncated;
    dir.put_exec(records, stdout, stderr, &record).await?;
    let report = TurnReport::read(adapter, stdout, ended.stdout_truncated);
    Ok((record, report))
}

/// `s` with the run's id written as the mark.
pub fn mark(s: &str, run_id: &str) -> String {
    if run_id.is_empty() {
        return s.to_owned();
    }
    s.replace(run_id, RUN_ID_MARK)
}

/// The request of a turn as recorded and compared: `v` with the run's id marked, pretty.
pub fn request_json(run_id: &str, v: Value) -> String {
    pretty(&replace_in(v, run_id, RUN_ID_MARK))
}

/// The turn directory of this attempt, relative to the instance directory.
pub struct TurnDir(String);

impl TurnDir {
    pub fn of(ctx: &NodeCtx) -> TurnDir {
        TurnDir(format!("{AGENT_TURNS_DIR}/{}-{}", ctx.attempt, ctx.turn))
    }

    fn rel(&self, name: &str) -> String {
        format!("{}/{name}", self.0)
    }

    pub async fn put_request(
        &self,
        records: &InstanceRecords,
        request: &str,
    ) -> Result<(), NodeError> {
        records
            .put(&self.rel(REQUEST), Bytes::from(request.to_owned()))
            .await
            .map_err(status_error("recording the turn's request"))
    }

    /// The transcript, stderr and turn.json as the CLI's turn ended.
    pub async fn put_exec(
        &self,
        records: &InstanceRecords,
        transcript: &str,
        stderr: &str,
        record: &TurnRecord,
    ) -> Result<(), NodeError> {
        records
            .put(&self.rel(TRANSCRIPT), Bytes::from(transcript.to_owned()))
            .await
            .map_err(status_error("recording the turn's transcript"))?;
        records
            .put(&self.rel(TURN_STDERR), Bytes::from(stderr.to_owned()))
            .await
            .map_err(status_error("recording the turn's stderr"))?;
        self.put_record(records, record).await
    }

    pub async fn put_record(
        &self,
        records: &InstanceRecords,
        record: &TurnRecord,
    ) -> Result<(), NodeError> {
        let text = serde_json::to_string_pretty(record).unwrap_or_default();
        records
            .put(&self.rel(TURN), Bytes::from(format!("{text}\n")))
            .await
            .map_err(status_error("recording turn.json"))
    }

    /// Keeps the bytes of a file the turn wrote back; returns their sha256.
    pub async fn put_file(
        &self,
        records: &InstanceRecords,
        bytes: &Bytes,
    ) -> Result<String, NodeError> {
        let sha = sha256_hex(bytes);
        records
            .put(&self.rel(&format!("{FILES}/{sha}")), bytes.clone())
            .await
            .map_err(status_error("recording a changed file of the turn"))?;
        Ok(sha)
    }
}

/// Ends a turn that got through, run live or answered from its record: its record is
/// complete with the kept state, and the agent's words of the attempt are written.
pub(crate) async fn finish(
    ctx: &NodeCtx,
    records: &InstanceRecords,
    dir: &TurnDir,
    mut record: TurnRecord,
    done: TurnDone,
) -> Result<TurnDone, NodeError> {
    record.kept = done.kept.clone();
    record.complete = true;
    dir.put_record(records, &record).await?;
    write_messages(ctx, records, &done.report).await?;
    Ok(done)
}

/// Records why a live turn failed, so a replay fails it the same way: `error` in turn.json,
/// added to the record of `ran` (the turn's CLI ran in this attempt) or, when it never ran,
/// in a record of its own with the request and an empty transcript. Best effort: a record
/// that cannot be written is logged, and the turn's own error stands.
pub(crate) async fn record_failure(
    ctx: &NodeCtx,
    records: &InstanceRecords,
    adapter: &str,
    request: &str,
    ran: Option<TurnRecord>,
    e: &NodeError,
) {
    let dir = TurnDir::of(ctx);
    let error = Some(RecordedError {
        kind: e.kind,
        message: mark(&e.message, &ctx.run_id),
    });
    let written = match ran {
        Some(mut record) => {
            record.error = error;
            dir.put_record(records, &record).await
        }
        None => {
            let mut record = TurnRecord::new(ctx, adapter, request, "", "");
            record.error = error;
            match dir.put_request(records, request).await {
                Ok(()) => dir.put_exec(records, "", "", &record).await,
                Err(e) => Err(e),
            }
        }
    };
    if let Err(w) = written {
        tracing::warn!(run_id = %ctx.run_id, node = %ctx.node_id, attempt = ctx.attempt, error = %w.message, "the failed turn's record could not be written; a replay of this run cannot answer the turn");
    }
}

/// A recorded turn a replay answers its turn from.
pub(crate) struct RecordedTurn {
    /// The recorded run.
    source: String,
    /// The recorded instance directory's turn directory (project path).
    dir: String,
    /// The recorded instance directory (project path).
    instance_dir: String,
    record: TurnRecord,
    request: String,
    transcript: String,
    stderr: String,
}

fn missing(path: &str, ctx: &NodeCtx) -> NodeError {
    NodeError::refused(format!(
        "replay record missing: {path} (node `{}`, attempt {}, turn {}) is not in the recorded run; a run recorded before external agent turns were recorded (or with this turn lost) cannot answer the turn: replay with --sandbox live to run the agent again",
        ctx.node_id, ctx.attempt, ctx.turn
    ))
}

fn damaged(path: &str, why: &str) -> NodeError {
    NodeError::refused(format!(
        "replay record {path} is damaged: {why}; restore the file from a backup or replay with --sandbox live"
    ))
}

/// Reads `path` of the recorded run, checked against `sha256`.
async fn checked(ctx: &NodeCtx, path: &str, sha256: &str) -> Result<Bytes, NodeError> {
    let bytes = ctx
        .store()
        .get(&ctx.project, path)
        .await
        .map_err(status_error(&format!("reading {path}")))?
        .ok_or_else(|| damaged(path, "the file is gone"))?;
    let got = sha256_hex(&bytes);
    if got != sha256 {
        return Err(damaged(
            path,
            &format!("its sha256 is {got}, the turn's record says {sha256}"),
        ));
    }
    Ok(bytes)
}

/// The recorded turn of this attempt in run `source`, when its request is the one this
/// replay would send (`request`). A divergence fails the node with the request diff, or,
/// with `live_after`, is told as `replay.live` and the turn runs live (None); so does a
/// missing record with `live_after`.
pub(crate) async fn lookup(
    ctx: &NodeCtx,
    source: &str,
    instance: &str,
    request: &str,
    live_after: bool,
) -> Result<Option<RecordedTurn>, NodeError> {
    let from = RunDir::new(source);
    let dir = from.agent_turn(instance, ctx.attempt, ctx.turn, "");
    let dir = dir.trim_end_matches('/').to_owned();
    let turn_path = format!("{dir}/{TURN}");
    let went_live = |why: &'static str, diff: String| {
        ctx.progress.emit(cairn_node::went_live_event(
            &cairn_agents::recorded::WentLive {
                node: ctx.node_id.clone(),
                attempt: ctx.attempt,
                turn: ctx.turn,
                step: 0,
                why,
                diff,
            },
        ));
    };
    let Some(bytes) = ctx
        .store()
        .get(&ctx.project, &turn_path)
        .await
        .map_err(status_error(&format!("reading {turn_path}")))?
    else {
        if live_after {
            went_live("missing", String::new());
            return Ok(None);
        }
        return Err(missing(&turn_path, ctx));
    };
    let record: TurnRecord = serde_json::from_slice(&bytes).map_err(|e| {
        damaged(
            &turn_path,
            &format!("line {}, column {}: {e}", e.line(), e.column()),
        )
    })?;
    if record.version != VERSION {
        return Err(damaged(
            &turn_path,
            &format!("version {} (this build reads {VERSION})", record.version),
        ));
    }
    let request_path = format!("{dir}/{REQUEST}");
    let recorded_request = checked(ctx, &request_path, &record.request_sha256).await?;
    let recorded_request = String::from_utf8_lossy(&recorded_request).into_owned();
    if recorded_request != request {
        let diff = unified_diff(&recorded_request, request, "recorded", "replay");
        if live_after {
            went_live("agent", diff);
            return Ok(None);
        }
        return Err(NodeError::failed(format!(
            "replay diverged at node `{}` attempt {} (turn {}): the external agent's request differs from the recorded one (replay with --live-after to run it, or --sandbox live)\n{diff}",
            ctx.node_id, ctx.attempt, ctx.turn
        )));
    }
    let transcript = checked(
        ctx,
        &format!("{dir}/{TRANSCRIPT}"),
        &record.transcript_sha256,
    )
    .await?;
    let stderr = checked(ctx, &format!("{dir}/{TURN_STDERR}"), &record.stderr_sha256).await?;
    Ok(Some(RecordedTurn {
        source: source.to_owned(),
        instance_dir: from.agent(instance, ""),
        dir,
        record,
        request: recorded_request,
        transcript: String::from_utf8_lossy(&transcript).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }))
}

/// Answers this attempt's turn from `rec`: the recorded transcript through the adapter's
/// parser, the recorded bytes of each changed file written back (checked against their
/// sha256 first, all of them before any is written), the deletions mirrored, the CLI's kept
/// state copied. The replay records the turn as its own, so it can be replayed in turn.
pub(crate) async fn replay_turn(
    ctx: &NodeCtx,
    adapter: &dyn AgentAdapter,
    records: &InstanceRecords,
    workspace: &str,
    request: &str,
    rec: RecordedTurn,
) -> Result<TurnDone, NodeError> {
    let source = rec.source.as_str();
    // The recorded run's id in what the CLI printed becomes this run's.
    let ours = |s: &str| s.replace(source, &ctx.run_id);
    let (transcript, stderr) = (ours(&rec.transcript), ours(&rec.stderr));
    let timeout_s = serde_json::from_str::<Value>(&rec.request)
        .ok()
        .and_then(|v| v.get("timeout_s").and_then(Value::as_u64))
        .unwrap_or(crate::report::DEFAULT_TURN_TIMEOUT_S);
    records
        .append(
            REQUESTS,
            &json!({
                "ts": now(),
                "node": ctx.node_id,
                "turn": ctx.turn,
                "attempt": ctx.attempt,
                "request": serde_json::from_str::<Value>(request).unwrap_or(Value::Null),
                "replay_of": source,
                "record": rec.dir,
            })
            .to_string(),
        )
        .await
        .map_err(status_error("recording the request"))?;
    let dir = TurnDir::of(ctx);
    dir.put_request(records, request).await?;
    let ended = Ended {
        exit_code: rec.record.exit_code,
        timed_out: rec.record.timed_out,
        stdout_truncated: rec.record.stdout_truncated,
    };
    let (mut record, report) = record_output(
        ctx,
        records,
        adapter,
        &dir,
        request,
        &transcript,
        &stderr,
        ended,
    )
    .await?;

    // A turn that failed fails again, as it did.
    if let Some(error) = rec.record.error {
        let failed = NodeError::new(error.kind, error.message.replace(RUN_ID_MARK, &ctx.run_id));
        record.error = Some(error);
        dir.put_record(records, &record).await?;
        return Err(failed);
    }
    // What goes back, every recorded byte checked before anything is written.
    let planned = plan_changes(adapter, &report, workspace)?;
    if !rec.record.complete {
        return Err(NodeError::failed(format!(
            "the recorded turn ended before its changes went back ({}/{TURN} says `complete: false`); replay with --sandbox live to run the agent again",
            rec.dir
        )));
    }
    let mut writes = Vec::new();
    for (rel, _) in &planned {
        let path = format!("{workspace}/{rel}");
        let marked = mark(&path, &ctx.run_id);
        if let Some(f) = rec.record.files.iter().find(|f| f.path == marked) {
            let from = format!("{}/{FILES}/{}", rec.dir, f.sha256);
            let bytes = ctx
                .store()
                .get(&ctx.project, &from)
                .await
                .map_err(status_error(&format!("reading {from}")))?
                .ok_or_else(|| damaged(&from, &format!("the recorded bytes of {path} are gone")))?;
            let got = sha256_hex(&bytes);
            if got != f.sha256 {
                return Err(damaged(
                    &from,
                    &format!(
                        "the recorded bytes of {path} changed: their sha256 is {got}, the turn's record says {}",
                        f.sha256
                    ),
                ));
            }
            writes.push((path, Some((bytes, f.clone()))));
        } else if rec.record.removed.contains(&marked) {
            writes.push((path, None));
        } else {
            return Err(damaged(
                &format!("{}/{TURN}", rec.dir),
                &format!("the transcript reports a change of {path}, which the record neither wrote back nor deleted"),
            ));
        }
    }
    let opts = PutOptions {
        // The recorded run wrote these very files: the replay writes them again.
        overwrite: true,
        run_id: ctx.run_id.clone(),
        allowed_prefixes: vec![workspace.to_owned()],
        ..Default::default()
    };
    let (mut written, mut deleted) = (Vec::new(), Vec::new());
    for (path, file) in writes {
        let Some((bytes, f)) = file else {
            let marked = mark(&path, &ctx.run_id);
            ctx.store()
                .delete(&ctx.project, &path, &ctx.run_id)
                .await
                .map_err(status_error(&format!("deleting {path}")))?;
            // Deleted as the recorded run found it (a replay in the same project may find
            // the file gone already).
            if rec.record.deleted.contains(&marked) {
                record.deleted.push(marked.clone());
                deleted.push(path);
            }
            record.removed.push(marked);
            continue;
        };
        dir.put_file(records, &bytes).await?;
        record.files.push(f);
        let put = ctx
            .store()
            .put(&ctx.project, &path, bytes, &opts)
            .await
            .map_err(|s| cairn_node::write_error(&path, &s))?;
        written.push(put);
    }

    // The CLI's kept state as the recorded run left it, so a later live turn can resume.
    let state = adapter.state_dir().name;
    let mut kept = Vec::new();
    for rel in &rec.record.kept {
        let from = format!("{}{state}/{rel}", rec.instance_dir);
        if let Some(bytes) = ctx
            .store()
            .get(&ctx.project, &from)
            .await
            .map_err(status_error(&format!("reading {from}")))?
        {
            records
                .put(&format!("{state}/{rel}"), bytes)
                .await
                .map_err(status_error("keeping the agent's state"))?;
        }
        kept.push(rel.clone());
    }
    let done = TurnDone {
        report,
        exit_code: rec.record.exit_code,
        timed_out: rec.record.timed_out,
        timeout_s,
        written,
        deleted,
        kept,
    };
    finish(ctx, records, &dir, record, done).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_never_holds_the_run_id() {
        let r = request_json(
            "01RUN",
            json!({"argv": ["codex", "write runs/01RUN/x"], "workspace": "runs/01RUN"}),
        );
        assert!(!r.contains("01RUN"), "{r}");
        assert!(r.contains("runs/⟨run_id⟩/x"), "{r}");
        assert_eq!(mark("a/01RUN/b", "01RUN"), "a/⟨run_id⟩/b");
        assert_eq!(mark("a", ""), "a");
    }

    #[test]
    fn turn_json_reads_back() {
        let r = TurnRecord {
            version: VERSION,
            node: "coder".into(),
            attempt: 2,
            turn: 1,
            adapter: "codex-exec".into(),
            request_sha256: "a".into(),
            transcript_sha256: "b".into(),
            stderr_sha256: "c".into(),
            exit_code: 1,
            timed_out: true,
            stdout_truncated: false,
            files: vec![RecordedFile {
                path: "app/x".into(),
                sha256: "d".into(),
                size: 3,
            }],
            removed: vec!["app/y".into(), "app/z".into()],
            deleted: vec!["app/y".into()],
            kept: vec!["sessions/r.jsonl".into()],
            complete: true,
            error: None,
        };
        let text = serde_json::to_string_pretty(&r).unwrap();
        assert!(!text.contains("\"error\""), "{text}");
        assert_eq!(serde_json::from_str::<TurnRecord>(&text).unwrap(), r);
        // A failed turn keeps its error, kind and message.
        let failed = TurnRecord {
            complete: false,
            error: Some(RecordedError {
                kind: cairn_graph::ErrorKind::Unavailable,
                message: "opening the agent's sandbox session: no runner".into(),
            }),
            ..r
        };
        let text = serde_json::to_string_pretty(&failed).unwrap();
        assert!(text.contains("\"kind\": \"unavailable\""), "{text}");
        assert_eq!(serde_json::from_str::<TurnRecord>(&text).unwrap(), failed);
    }
}
