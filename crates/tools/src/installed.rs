//! Installed tools in a `tool_call` node: stage the files under the tool's
//! `allowed_paths` from the store, run its program on the legacy backend (a subprocess,
//! host.rs) or, with `sandbox.runner.features.use_for_tools`, on a sandbox runner
//! (sandboxed.rs), then check what came back the same way for both and write its output
//! files under `output_prefix` through the store.
//!
//! The protocol a tool speaks, identical on both backends: arguments as JSON in
//! `$CAIRN_TOOL_ARGS`; inputs at `$CAIRN_INPUT_DIR/<project path>` (read-only); files written
//! to `$CAIRN_OUTPUT_DIR` become outputs; stdout is its result, one JSON object (or nothing);
//! logs go to stderr; exit 0 means success.

use std::time::Duration;

use bytes::Bytes;
use cairn_proto::v1::Level;
use serde_json::{json, Map, Value};

use super::manifest::{self, InstalledTool};
use cairn_graph::{under_prefix, ErrorKind};
use cairn_node::events::{Ev, SANDBOX_COMPLETE, SANDBOX_FAILED, SANDBOX_START};
use cairn_node::{artifact_written, NodeCtx, NodeError, NodeSuccess};
use cairn_store_client::PutOptions;

/// Largest `$CAIRN_TOOL_ARGS` (the runner's cap on one environment value).
pub const MAX_ARGS_BYTES: usize = 32 << 10;
/// stdout/stderr kept in the node's outputs.
const SUMMARY_BYTES: usize = 8 << 10;

/// Caps of one call, the same on both backends (the sandbox runner's defaults).
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    pub max_input_files: u64,
    pub max_input_bytes: u64,
    pub max_output_files: u64,
    pub max_output_bytes: u64,
    pub max_stdout_bytes: u64,
    pub max_stderr_bytes: u64,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            max_input_files: 1000,
            max_input_bytes: 16 << 20,
            max_output_files: 1000,
            max_output_bytes: 16 << 20,
            max_stdout_bytes: 1 << 20,
            max_stderr_bytes: 1 << 20,
        }
    }
}

/// One call, as both backends run it.
#[derive(Clone, Debug)]
pub struct Invocation {
    pub tool: String,
    pub language: String,
    pub code: String,
    /// Staged inputs: project path and bytes.
    pub inputs: Vec<(String, Bytes)>,
    /// `CAIRN_TOOL_ARGS` and friends (not the directories: each backend sets its own).
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
}

/// An output the backend refused to collect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub path: String,
    pub reason: String,
}

/// What a backend reports.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// legacy | sandbox
    pub backend: &'static str,
    pub exit_code: i32,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout: Bytes,
    pub stderr: Bytes,
    pub stdout_truncated: bool,
    /// Output files relative to the output directory, sorted.
    pub outputs: Vec<(String, Bytes)>,
    pub refused: Vec<Refused>,
    pub outputs_truncated: bool,
    /// The sandbox runner that ran it ("" on the legacy backend).
    pub runner: String,
    /// The runner's result.json record.
    pub record: Option<Value>,
}

fn summary(b: &[u8]) -> String {
    let cut = b.len().min(SUMMARY_BYTES);
    let mut s = String::from_utf8_lossy(&b[..cut]).into_owned();
    if b.len() > SUMMARY_BYTES {
        s.push_str("\n[truncated]");
    }
    s
}

fn tail(b: &[u8]) -> String {
    let text = String::from_utf8_lossy(b);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Files under the tool's allowed paths (a prefix ending in `/` or a directory: all beneath;
/// otherwise that one file if it exists).
async fn stage(
    ctx: &NodeCtx,
    tool: &str,
    allowed: &[String],
    caps: &Caps,
) -> Result<Vec<(String, Bytes)>, NodeError> {
    let mut paths: Vec<String> = Vec::new();
    for prefix in allowed {
        let listed = ctx
            .store()
            .list(&ctx.project, prefix, true)
            .await
            .map_err(|s| NodeError::from_status(&format!("listing {prefix}/"), &s))?;
        let files: Vec<String> = listed
            .into_iter()
            .filter(|e| e.kind == cairn_proto::v1::EntryKind::File as i32)
            .map(|e| e.path)
            .collect();
        if files.is_empty() {
            if let Some(info) = ctx
                .store()
                .stat(&ctx.project, prefix, false)
                .await
                .map_err(|s| NodeError::from_status(&format!("stat {prefix}"), &s))?
            {
                if info.kind == cairn_proto::v1::EntryKind::File as i32 {
                    paths.push(prefix.clone());
                }
            }
        }
        paths.extend(files);
    }
    paths.sort();
    paths.dedup();
    if paths.len() as u64 > caps.max_input_files {
        return Err(NodeError::refused(format!(
            "tool `{tool}`: its allowed_paths hold {} files; at most {} are staged: narrow allowed_paths in its tool.toml",
            paths.len(),
            caps.max_input_files
        )));
    }
    let mut out = Vec::with_capacity(paths.len());
    let mut total = 0u64;
    for p in paths {
        let bytes = ctx
            .store()
            .get(&ctx.project, &p)
            .await
            .map_err(|s| NodeError::from_status(&format!("reading {p}"), &s))?
            .unwrap_or_default();
        total += bytes.len() as u64;
        if total > caps.max_input_bytes {
            return Err(NodeError::refused(format!(
                "tool `{tool}`: its allowed_paths hold more than {} MiB; narrow allowed_paths in its tool.toml",
                caps.max_input_bytes >> 20
            )));
        }
        out.push((p, bytes));
    }
    Ok(out)
}

/// The tool's prefixes and output prefix for this node, checked.
fn places(t: &InstalledTool, run_id: &str, node: &str) -> Result<(Vec<String>, String), NodeError> {
    let bad = |what: &str, text: &str, why: String| {
        NodeError::refused(format!(
            "tool `{}`: {what} `{text}` in {}/tool.toml: {why}",
            t.name,
            t.dir.display()
        ))
    };
    let mut allowed = Vec::new();
    for p in &t.manifest.allowed_paths {
        let r = manifest::render(p, run_id, node);
        let r = r.trim_end_matches('/').to_owned();
        pathguard::validate_prefix(&r).map_err(|rej| bad("allowed path", p, rej.to_string()))?;
        pathguard::records::check_node_read(&r, run_id)
            .map_err(|e| bad("allowed path", p, e.to_string()))?;
        if r.is_empty() {
            return Err(bad(
                "allowed path",
                p,
                "the whole project is never staged".into(),
            ));
        }
        allowed.push(r);
    }
    let out = t
        .manifest
        .output_prefix
        .clone()
        .unwrap_or_else(|| "docs/artifacts/{{run_id}}/{{node}}".into());
    let rendered = manifest::render(&out, run_id, node)
        .trim_end_matches('/')
        .to_owned();
    pathguard::validate_prefix(&rendered)
        .map_err(|rej| bad("output_prefix", &out, rej.to_string()))?;
    pathguard::records::check_node_write(&rendered)
        .map_err(|e| bad("output_prefix", &out, e.to_string()))?;
    if !allowed
        .iter()
        .any(|a| under_prefix(&format!("{rendered}/x"), a))
    {
        return Err(bad(
            "output_prefix",
            &out,
            format!("not under its allowed_paths {allowed:?}"),
        ));
    }
    Ok((allowed, rendered))
}

/// Runs installed tool `name` for a `tool_call` node.
pub async fn call(
    ctx: &NodeCtx,
    tools_dir: &str,
    sandboxed: bool,
    name: &str,
    args: &Map<String, Value>,
) -> Result<NodeSuccess, NodeError> {
    let tool = manifest::load(tools_dir, name, &super::builtin_names().join(", "))
        .map_err(|e| NodeError::refused(e.to_string()))?;
    for a in &tool.manifest.args {
        if !args.contains_key(a) {
            return Err(NodeError::refused(format!(
                "tool `{name}` needs argument `{a}`"
            )));
        }
    }
    let args_json = Value::Object(args.clone()).to_string();
    if args_json.len() > MAX_ARGS_BYTES {
        return Err(NodeError::refused(format!(
            "tool `{name}`: its arguments are {} bytes of JSON; at most {MAX_ARGS_BYTES}: pass a project path instead of the content",
            args_json.len()
        )));
    }
    let caps = Caps::default();
    let (allowed, output_prefix) = places(&tool, &ctx.run_id, &ctx.node_id)?;
    let inputs = stage(ctx, name, &allowed, &caps).await?;
    let inv = Invocation {
        tool: name.to_owned(),
        language: tool.manifest.language.clone(),
        code: tool.code.clone(),
        inputs,
        env: vec![
            ("CAIRN_TOOL".into(), name.to_owned()),
            ("CAIRN_TOOL_ARGS".into(), args_json),
            ("CAIRN_RUN_ID".into(), ctx.run_id.clone()),
            ("CAIRN_NODE_ID".into(), ctx.node_id.clone()),
        ],
        timeout: Duration::from_secs(tool.manifest.timeout_s),
    };

    let request_id = format!("{}-{}-{}", ctx.run_id, ctx.node_id, ctx.attempt);
    let outcome = if sandboxed {
        ctx.progress.emit(
            Ev::new(SANDBOX_START, &ctx.node_id)
                .with("request_id", request_id.as_str())
                .with("tool", name)
                .with("language", inv.language.as_str())
                .with("inputs", inv.inputs.len())
                .with("timeout_s", tool.manifest.timeout_s),
        );
        match super::sandboxed::run(
            &ctx.backends.runners,
            &inv,
            &caps,
            &request_id,
            &ctx.run_id,
            &ctx.node_id,
        )
        .await
        {
            Ok(o) => o,
            Err(s) => {
                // a failed sandbox call fails the node, never falls back.
                let e =
                    NodeError::from_status(&format!("tool `{name}` on the sandbox backend"), &s);
                ctx.progress
                    .emit(sandbox_failed(ctx, &request_id, name, &e.message));
                return Err(e);
            }
        }
    } else {
        super::host::run(&inv, &caps)
            .await
            .map_err(|e| NodeError::failed(format!("tool `{name}`: {e}")))?
    };

    match finish(ctx, &tool, &outcome, &allowed, &output_prefix).await {
        Ok(mut success) => {
            if sandboxed {
                let result_path = record(ctx, &request_id, name, &outcome, &success).await?;
                success
                    .outputs
                    .insert("result_path".into(), result_path.clone().into());
                success.events.insert(
                    0,
                    Ev::new(SANDBOX_COMPLETE, &ctx.node_id)
                        .with("request_id", request_id.as_str())
                        .with("tool", name)
                        .with("runner", outcome.runner.as_str())
                        .with("exit_code", outcome.exit_code)
                        .with("timed_out", outcome.timed_out)
                        .with("duration_ms", outcome.duration_ms)
                        .with(
                            "written_files",
                            success
                                .outputs
                                .get("written_files")
                                .cloned()
                                .unwrap_or(Value::Null),
                        )
                        .with("result_path", result_path),
                );
            }
            Ok(success)
        }
        Err(e) => {
            if sandboxed {
                ctx.progress
                    .emit(sandbox_failed(ctx, &request_id, name, &e.message));
            }
            Err(e)
        }
    }
}

fn sandbox_failed(ctx: &NodeCtx, request_id: &str, tool: &str, error: &str) -> Ev {
    Ev::new(SANDBOX_FAILED, &ctx.node_id)
        .level(Level::Error)
        .with("request_id", request_id)
        .with("tool", tool)
        .with("error", error)
}

/// Checks an outcome (the same rules for both backends) and writes the outputs back.
async fn finish(
    ctx: &NodeCtx,
    tool: &InstalledTool,
    o: &Outcome,
    allowed: &[String],
    output_prefix: &str,
) -> Result<NodeSuccess, NodeError> {
    let name = &tool.name;
    if o.timed_out {
        return Err(NodeError::new(
            ErrorKind::Timeout,
            format!(
                "tool `{name}` timed out after {}s on the {} backend (timeout_s in its tool.toml)",
                tool.manifest.timeout_s, o.backend
            ),
        ));
    }
    if o.exit_code != 0 {
        return Err(NodeError::failed(format!(
            "tool `{name}` exited with code {} on the {} backend\n{}",
            o.exit_code,
            o.backend,
            tail(&o.stderr)
        )));
    }
    if o.stdout_truncated {
        return Err(NodeError::failed(format!(
            "tool `{name}`: its stdout (the result) is longer than {} bytes; write large results to $CAIRN_OUTPUT_DIR",
            Caps::default().max_stdout_bytes
        )));
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let result = match text.trim() {
        "" => Value::Object(Map::new()),
        t => match serde_json::from_str::<Value>(t) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return Err(NodeError::failed(format!(
                    "tool `{name}` printed something other than one JSON object on stdout (its result; logs belong on stderr): {}",
                    summary(t.as_bytes()).lines().next().unwrap_or_default()
                )))
            }
        },
    };
    // outputs over the limits or refused are not written, and the node fails.
    if let Some(r) = o.refused.first() {
        return Err(NodeError::refused(format!(
            "tool `{name}`: output `{}` refused ({}); outputs must be regular files with valid names",
            r.path, r.reason
        )));
    }
    if o.outputs_truncated {
        return Err(NodeError::refused(format!(
            "tool `{name}`: more output than {} files / {} MiB; nothing was written",
            Caps::default().max_output_files,
            Caps::default().max_output_bytes >> 20
        )));
    }
    let opts = PutOptions {
        overwrite: tool.manifest.overwrite || ctx.reset,
        run_id: ctx.run_id.clone(),
        allowed_prefixes: allowed.to_vec(),
        ..Default::default()
    };
    let mut written = Vec::new();
    let mut events = Vec::new();
    for (rel, bytes) in &o.outputs {
        let path = format!("{output_prefix}/{rel}");
        pathguard::validate(&path)
            .map_err(|rej| NodeError::refused(format!("tool `{name}`: output `{rel}`: {rej}")))?;
        cairn_node::check_access(&ctx.run_id, "output", &path, cairn_node::Access::Write)?;
        let put = ctx
            .store()
            .put(&ctx.project, &path, bytes.clone(), &opts)
            .await
            .map_err(|s| cairn_node::write_error(&path, &s))?;
        events.push(artifact_written(&ctx.node_id, &put, None));
        written.push(put.path);
    }
    let mut outputs = Map::new();
    outputs.insert("result".into(), result);
    outputs.insert("written_files".into(), json!(written));
    outputs.insert("exit_code".into(), o.exit_code.into());
    outputs.insert("duration_ms".into(), o.duration_ms.into());
    outputs.insert("stderr".into(), summary(&o.stderr).into());
    outputs.insert("backend".into(), o.backend.into());
    Ok(NodeSuccess { outputs, events })
}

/// the sandbox run's record at sandbox/<node>/result.json.
async fn record(
    ctx: &NodeCtx,
    request_id: &str,
    tool: &str,
    o: &Outcome,
    success: &NodeSuccess,
) -> Result<String, NodeError> {
    let path = ctx.run_dir().sandbox_result(&ctx.node_id);
    let mut doc = match &o.record {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    doc.entry("request_id").or_insert_with(|| request_id.into());
    doc.insert("runner_addr".into(), o.runner.clone().into());
    doc.insert("tool".into(), tool.into());
    doc.insert(
        "written_files".into(),
        success
            .outputs
            .get("written_files")
            .cloned()
            .unwrap_or(Value::Null),
    );
    let opts = PutOptions {
        overwrite: true,
        ..Default::default()
    };
    ctx.store()
        .put(
            &ctx.project,
            &path,
            Bytes::from(format!("{:#}\n", Value::Object(doc))),
            &opts,
        )
        .await
        .map_err(|s| NodeError::from_status(&format!("writing {path}"), &s))?;
    Ok(path)
}
