//! `sandbox_run`: stages project files from the store as the runner's /input,
//! runs the code on a sandbox runner, writes the /output files under `output_prefix` through
//! the store (within `allowed_prefixes`), stores `sandbox/<node>/result.json` and records
//! sandbox_start / sandbox_complete / sandbox_failed. The program's stdout/stderr stream into
//! the node's log as they come (RunStream). Cancelling the run drops the runner call, which
//! stops the job on the runner.

use bytes::Bytes;
use cairn_proto::v1::{
    FileContent, Level, Limits, LogStream, OutputChunk, RunRequest, RunResult, StdStream,
};
use serde_json::{json, Map, Value};

use super::{expand_files, NodeCtx, NodeError, NodeSuccess};
use cairn_graph::{under_prefix, ErrorKind, SandboxRun};
use cairn_node::events::{Ev, SANDBOX_COMPLETE, SANDBOX_FAILED, SANDBOX_START};
use cairn_store_client::PutOptions;

/// Runner timeout when the node sets no `timeout_s` (example).
pub const DEFAULT_TIMEOUT_S: u64 = 30;
/// Most input files / bytes staged (the runner has its own limits too).
const MAX_INPUT_FILES: usize = 2000;
const MAX_INPUT_BYTES: u64 = 256 << 20;
/// stdout/stderr kept in the node outputs and result.json summary.
const SUMMARY_BYTES: usize = 8 << 10;

fn summary(b: &[u8]) -> String {
    let cut = b.len().min(SUMMARY_BYTES);
    let mut s = String::from_utf8_lossy(&b[..cut]).into_owned();
    if b.len() > SUMMARY_BYTES {
        s.push_str("\n[truncated]");
    }
    s
}

fn allowed(path: &str, prefixes: &[String]) -> bool {
    prefixes.iter().any(|p| under_prefix(path, p))
}

/// The rule for where a sandbox run's /output files may land, shared with
/// `cairn sandbox run`: `output_prefix` (without its trailing `/`) is a valid project prefix
/// lying under one of `prefixes`. Err is the reason, naming the field.
pub fn check_output_prefix(output_prefix: &str, prefixes: &[String]) -> Result<(), String> {
    pathguard::validate_prefix(output_prefix)
        .map_err(|rej| format!("field `output_prefix`: `{output_prefix}`: {rej}"))?;
    pathguard::records::check_node_write(output_prefix)
        .map_err(|e| format!("field `output_prefix`: {e}"))?;
    if !allowed(&format!("{output_prefix}/x"), prefixes) {
        return Err(format!(
            "field `output_prefix`: `{output_prefix}` is not under allowed_prefixes {prefixes:?}"
        ));
    }
    Ok(())
}

/// The sha256 of `content` with every `run_id` in it written as the run-id mark (hashed as
/// it is, without a copy, when the id does not occur).
fn marked_sha256(content: &[u8], run_id: &str) -> String {
    use cairn_agents::records::RUN_ID_MARK;
    let finder = memchr::memmem::Finder::new(run_id.as_bytes());
    if run_id.is_empty() || finder.find(content).is_none() {
        return cairn_sha256::sha256_hex(content);
    }
    let mut marked = Vec::with_capacity(content.len());
    let mut at = 0;
    for i in finder.find_iter(content) {
        marked.extend_from_slice(&content[at..i]);
        marked.extend_from_slice(RUN_ID_MARK.as_bytes());
        at = i + run_id.len();
    }
    marked.extend_from_slice(&content[at..]);
    cairn_sha256::sha256_hex(&marked)
}

/// The request as a replay compares it (request.json, hashed into `request_sha256` of
/// sandbox_start): what the program gets, with this run's id written as a mark and each
/// input by the sha256 of its content (the id marked there too), without the ids that
/// differ per run or delivery.
fn request_json(req: &RunRequest, run_id: &str) -> String {
    use cairn_agents::records::{pretty, replace_in, RUN_ID_MARK};
    let inputs: Vec<Value> = req
        .input_files
        .iter()
        .map(|f| json!({"path": f.path, "sha256": marked_sha256(&f.content, run_id)}))
        .collect();
    let v = json!({
        "language": req.language,
        "code": req.code,
        "code_file": req.code_file,
        "inputs": inputs,
        "timeout_ms": req.limits.as_ref().map(|l| l.timeout_ms).unwrap_or_default(),
        "network": req.network,
        "image": req.image,
        "env": req.env.iter().collect::<std::collections::BTreeMap<_, _>>(),
    });
    pretty(&replace_in(v, run_id, RUN_ID_MARK))
}

pub async fn run(ctx: &NodeCtx, spec: &SandboxRun) -> Result<NodeSuccess, NodeError> {
    let scope = &ctx.scope;
    let prefixes: Vec<String> = spec
        .allowed_prefixes
        .iter()
        .enumerate()
        .map(|(i, t)| scope.render(&format!("allowed_prefixes[{i}]"), t))
        .collect::<Result<_, _>>()?;
    let output_prefix = scope
        .render("output_prefix", &spec.output_prefix)?
        .trim_end_matches('/')
        .to_owned();
    check_output_prefix(&output_prefix, &prefixes).map_err(NodeError::refused)?;
    let mut inputs = expand_files(ctx, "input_files", &spec.input_files).await?;
    let code_file = match &spec.code_file {
        Some(t) => {
            let p = super::project_path(scope, "code_file", t, super::Access::Read)?;
            if !inputs.contains(&p) {
                inputs.push(p.clone());
            }
            Some(p)
        }
        None => None,
    };
    // every input passes the prefix check before anything is staged.
    if let Some(bad) = inputs.iter().find(|p| !allowed(p, &prefixes)) {
        return Err(NodeError::refused(format!(
            "input `{bad}` is not under allowed_prefixes {prefixes:?}; add its prefix to allowed_prefixes"
        )));
    }
    if inputs.len() > MAX_INPUT_FILES {
        return Err(NodeError::refused(format!(
            "{} input files; at most {MAX_INPUT_FILES}",
            inputs.len()
        )));
    }
    let mut input_files = Vec::with_capacity(inputs.len());
    let mut total = 0u64;
    for p in &inputs {
        let bytes = ctx
            .store()
            .get(&ctx.project, p)
            .await
            .map_err(|s| NodeError::from_status(&format!("reading input {p}"), &s))?
            .ok_or_else(|| NodeError::refused(format!("input {p} does not exist")))?;
        total += bytes.len() as u64;
        if total > MAX_INPUT_BYTES {
            return Err(NodeError::refused(format!(
                "inputs exceed {} MiB",
                MAX_INPUT_BYTES >> 20
            )));
        }
        input_files.push(FileContent {
            path: p.clone(),
            content: bytes,
        });
    }
    let code = match &spec.code {
        Some(t) => scope.render("code", t)?,
        None => String::new(),
    };
    let timeout_s = ctx.node.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
    let request_id = format!("{}-{}-{}", ctx.run_id, ctx.node_id, ctx.attempt);
    let req = RunRequest {
        request_id: request_id.clone(),
        run_id: ctx.run_id.clone(),
        node_id: ctx.node_id.clone(),
        language: spec.language.clone(),
        code,
        code_file: code_file.clone().unwrap_or_default(),
        input_files,
        limits: Some(Limits {
            timeout_ms: timeout_s * 1000,
            ..Default::default()
        }),
        network: spec.network,
        env: Default::default(),
        image: spec.image.clone().unwrap_or_default(),
        step_key: ctx.step.key.clone(),
        redelivery: ctx.step.redelivery,
    };
    let request = request_json(&req, &ctx.run_id);
    if let Some(r) = ctx.replay().filter(|r| !r.live_sandbox) {
        let events = cairn_node::recorded::events(ctx, &r.source).await?;
        match super::recorded_step::diverges(ctx, &r.source, &events, &request).await? {
            None => {
                put_request(ctx, &request).await?;
                return super::recorded_step::replay(ctx, &r.source, &events).await;
            }
            Some(diff) if r.live_after.is_some() => {
                ctx.progress.emit(cairn_node::went_live_event(
                    &cairn_agents::recorded::WentLive {
                        node: ctx.node_id.clone(),
                        attempt: ctx.attempt,
                        turn: 0,
                        step: 0,
                        why: "sandbox",
                        diff,
                    },
                ));
            }
            Some(diff) => {
                return Err(NodeError::new(
                    ErrorKind::Failed,
                    format!(
                        "replay diverged at node `{}` attempt {}: the sandbox request differs from the recorded one (replay with --live-after to run it, or --sandbox live)\n{diff}",
                        ctx.node_id, ctx.attempt
                    ),
                ));
            }
        }
    }
    put_request(ctx, &request).await?;
    ctx.progress.emit(
        Ev::new(SANDBOX_START, &ctx.node_id)
            .with("request_id", request_id.as_str())
            .with(
                "request_sha256",
                cairn_sha256::sha256_hex(request.as_bytes()),
            )
            .with("step_key", ctx.step.key.as_str())
            .with("redelivery", ctx.step.redelivery)
            .with("language", spec.language.as_str())
            .with("image", spec.image.as_deref().unwrap_or(""))
            .with("network", spec.network)
            .with("inputs", inputs.len())
            .with("timeout_s", timeout_s),
    );
    // stdout/stderr go to the log hub as they come (WatchLogs, the console's node panel).
    let log = ctx.log();
    log.begin();
    let live = |c: OutputChunk| {
        let stream = match StdStream::try_from(c.stream) {
            Ok(StdStream::Stderr) => LogStream::Stderr,
            _ => LogStream::Stdout,
        };
        log.write(stream, c.data);
    };
    let mut redeliveries = 0u32;
    // A runner that stopped heartbeating may still be running the step: the next runner runs
    // it again under the same step key, and the log says so.
    let redelivered = |runner: &str, why: &tonic::Status| {
        redeliveries += 1;
        log.step(&format!(
            "[{}; the step is delivered to the next runner as redelivery {}]",
            why.message(),
            ctx.step.redelivery + redeliveries
        ));
        tracing::warn!(runner, step_key = %ctx.step.key, error = %why.message(), "a sandbox runner went quiet mid-step; delivering the step to the next runner");
    };
    let (result, runner) = match ctx
        .backends
        .runners
        .run_streaming(req, live, redelivered)
        .await
    {
        Ok(r) => r,
        Err(s) => {
            let e = NodeError::from_status("sandbox runner", &s);
            ctx.progress.emit(
                Ev::new(SANDBOX_FAILED, &ctx.node_id)
                    .level(Level::Error)
                    .with("request_id", request_id.as_str())
                    .with("error", e.message.clone()),
            );
            return Err(e);
        }
    };
    for (name, cut) in [
        ("stdout", result.stdout_truncated),
        ("stderr", result.stderr_truncated),
    ] {
        if cut {
            log.step(&format!(
                "[the runner kept only the start of {name}: it reached the runner's size limit]"
            ));
        }
    }
    let written = match write_outputs(ctx, spec, &result, &output_prefix, &prefixes).await {
        Ok(w) => w,
        Err(e) => {
            ctx.progress.emit(
                Ev::new(SANDBOX_FAILED, &ctx.node_id)
                    .level(Level::Error)
                    .with("request_id", request_id.as_str())
                    .with("error", e.message.clone()),
            );
            return Err(e);
        }
    };
    let result_path = ctx.run_dir().sandbox_result(&ctx.node_id);
    let record = result_json(&result, &runner, &written, &output_prefix);
    let opts = PutOptions {
        overwrite: true,
        ..Default::default()
    };
    ctx.store()
        .put(
            &ctx.project,
            &result_path,
            Bytes::from(format!("{record:#}\n")),
            &opts,
        )
        .await
        .map_err(|s| NodeError::from_status(&format!("writing {result_path}"), &s))?;

    let written_paths: Vec<String> = written.iter().map(|w| w.0.clone()).collect();
    // The runner publishes all of a run's outputs or none; none means a limit was hit or a
    // file was cut, and a step whose results did not land has not done its work.
    let withheld = result.outputs_truncated;
    let ok = result.exit_code == 0 && !result.timed_out && !withheld;
    let mut out = NodeSuccess::default();
    let o = &mut out.outputs;
    o.insert("exit_code".into(), result.exit_code.into());
    o.insert("timed_out".into(), result.timed_out.into());
    o.insert("duration_ms".into(), result.duration_ms.into());
    o.insert("written_files".into(), json!(written_paths));
    o.insert("stdout".into(), summary(&result.stdout).into());
    o.insert("stderr".into(), summary(&result.stderr).into());
    o.insert("result_path".into(), result_path.clone().into());
    o.insert("ok".into(), ok.into());
    o.insert("outputs_withheld".into(), withheld.into());
    o.insert("runner_id".into(), result.runner_id.clone().into());
    for (path, put) in &written {
        let _ = path;
        out.events
            .push(super::artifact_written(&ctx.node_id, put, None));
    }
    let complete = Ev::new(SANDBOX_COMPLETE, &ctx.node_id)
        .with("request_id", request_id.as_str())
        .with("step_key", ctx.step.key.as_str())
        .with("redelivery", ctx.step.redelivery + redeliveries)
        .with("runner", runner.as_str())
        .with("exit_code", result.exit_code)
        .with("timed_out", result.timed_out)
        .with("duration_ms", result.duration_ms)
        .with("written_files", json!(written_paths))
        .with("result_path", result_path.as_str());
    if !ok && !spec.allow_failure {
        ctx.progress.emit(complete.level(Level::Warning));
        let why = if result.timed_out {
            format!("timed out after {timeout_s}s")
        } else if withheld {
            format!(
                "left outputs the runner would not publish ({} listed with reasons: a count or size limit, or a file cut off), so none was written",
                result.rejected_outputs.len()
            )
        } else {
            format!("exited with code {}", result.exit_code)
        };
        let tail = summary(&result.stderr);
        let tail = tail
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        let kind = if result.timed_out {
            ErrorKind::Timeout
        } else {
            ErrorKind::Failed
        };
        return Err(NodeError::new(
            kind,
            format!("the sandbox program {why} (set `allow_failure: true` to continue anyway); see {result_path}\n{tail}"),
        ));
    }
    out.events.insert(0, complete);
    Ok(out)
}

/// Keeps this attempt's request (`request_json`) in the run directory, for a replay's diff.
async fn put_request(ctx: &NodeCtx, request: &str) -> Result<(), NodeError> {
    let path = ctx.run_dir().sandbox_request(&ctx.node_id);
    let opts = PutOptions {
        overwrite: true,
        ..Default::default()
    };
    ctx.store()
        .put(&ctx.project, &path, Bytes::from(request.to_owned()), &opts)
        .await
        .map(|_| ())
        .map_err(|s| NodeError::from_status(&format!("writing {path}"), &s))
}

/// Writes /output files under the prefix; any refusal fails the node.
async fn write_outputs(
    ctx: &NodeCtx,
    spec: &SandboxRun,
    result: &RunResult,
    output_prefix: &str,
    prefixes: &[String],
) -> Result<Vec<(String, cairn_proto::v1::PutResponse)>, NodeError> {
    let mut written = Vec::new();
    for f in &result.output_files {
        let path = format!("{output_prefix}/{}", f.path);
        pathguard::validate(&path)
            .map_err(|rej| NodeError::refused(format!("output `{}`: {rej}", f.path)))?;
        super::check_access(&ctx.run_id, "output", &path, super::Access::Write)?;
        if !allowed(&path, prefixes) {
            return Err(NodeError::refused(format!(
                "output `{path}` is not under allowed_prefixes {prefixes:?}"
            )));
        }
        let opts = PutOptions {
            overwrite: spec.overwrite || ctx.reset,
            run_id: ctx.run_id.clone(),
            allowed_prefixes: prefixes
                .iter()
                .map(|p| p.trim_end_matches('/').to_owned())
                .collect(),
            ..Default::default()
        };
        let put = ctx
            .store()
            .put(&ctx.project, &path, f.content.clone(), &opts)
            .await
            .map_err(|s| super::write_file::write_error(&path, &s))?;
        written.push((put.path.clone(), put));
    }
    Ok(written)
}

/// result.json: the runner's record plus what was written where.
fn result_json(
    r: &RunResult,
    runner: &str,
    written: &[(String, cairn_proto::v1::PutResponse)],
    output_prefix: &str,
) -> Value {
    let mut doc: Map<String, Value> = serde_json::from_str(&r.result_json).unwrap_or_default();
    let defaults = json!({
        "request_id": r.request_id,
        "job_id": r.job_id,
        "runner_id": r.runner_id,
        "backend": r.backend,
        "exit_code": r.exit_code,
        "timed_out": r.timed_out,
        "oom_killed": r.oom_killed,
        "duration_ms": r.duration_ms,
        "stdout": summary(&r.stdout),
        "stderr": summary(&r.stderr),
        "stdout_truncated": r.stdout_truncated,
        "stderr_truncated": r.stderr_truncated,
        "output_files": r.output_files.iter().map(|f| json!({"path": f.path, "size": f.size_bytes, "sha256": f.sha256})).collect::<Vec<_>>(),
        "rejected_outputs": r.rejected_outputs.iter().map(|x| json!({"path": x.path, "reason": x.reason})).collect::<Vec<_>>(),
        "outputs_truncated": r.outputs_truncated,
    });
    if let Value::Object(d) = defaults {
        for (k, v) in d {
            doc.entry(k).or_insert(v);
        }
    }
    doc.insert("runner_addr".into(), runner.into());
    doc.insert("output_prefix".into(), output_prefix.into());
    doc.insert(
        "written_files".into(),
        written
            .iter()
            .map(|(p, put)| {
                let d = put.digest.clone().unwrap_or_default();
                json!({"path": p, "size": d.size_bytes, "sha256": d.sha256, "outcome": super::outcome_word(put.outcome)})
            })
            .collect(),
    );
    Value::Object(doc)
}

cairn_node::unit_kind!(
    /// The `sandbox_run` kind.
    SandboxRunKind,
    "sandbox_run",
    cairn_graph::NodeKind::SandboxRun,
    run
);
