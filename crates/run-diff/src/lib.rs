//! Comparing two runs: graph and variables, per-node outputs, files written (path, sha256,
//! unified diff of text), token usage and durations (`cairn runs diff`), and the determinism
//! verdict of a replay against its recorded run (`cairn runs replay`). Pure: it reads the two
//! runs' records through what `Side` holds and never writes. Each run's own id is compared as
//! one mark, so runs under different ids compare equal when they did the same thing; times,
//! sequence numbers and other per-life values (`VOLATILE`) are left out.

use std::collections::BTreeMap;

use cairn_agents::records::{pretty, replace_in, unified_diff, RUN_ID_MARK};
use cairn_proto::v1 as pb;
use cairn_sha256::sha256_hex;
use serde_json::{json, Map, Value};

/// Fields that differ between two lives of the same work: times, sequence numbers, ids of
/// one delivery, the runner that happened to take a step.
const VOLATILE: &[&str] = &[
    "ts",
    "seq",
    "run_id",
    "elapsed_ms",
    "duration_ms",
    "retry_in_ms",
    "traceparent",
    "request_id",
    "redelivery",
    "runner",
    "runner_id",
    "decided_at",
    // A sandbox session's id and its container's name: drawn afresh for each session, like
    // a runner's id (what the session did is in the tool calls and the files).
    "session_id",
    "container_name",
    // Who replayed a recorded gate decision, and from which run.
    "replayed_by",
    "replay_of",
];

/// What a write found (`outcome` of a file write): it depends on what the project held
/// before the run, not on what the run did (a replay rewrites its recorded run's shared
/// workspace files as `unchanged`); the bytes are compared by their hash.
const WRITE_OUTCOMES: &[&str] = &["created", "unchanged", "overwritten", "written"];

/// Run-level events that describe how a run was started, not what it did, or what the
/// project held before it (`store.overwritten`: a write replaced other bytes), not the run.
const START_EVENTS: &[&str] = &[
    "task.created",
    "task.resumed",
    "task.edited",
    "store.overwritten",
];

/// Most bytes of a file read to diff it.
pub const MAX_DIFF_BYTES: usize = 1 << 20;

/// One run as the comparison sees it.
pub struct Side {
    pub run_id: String,
    pub state: String,
    pub error: String,
    /// graph.resolved.json.
    pub graph: Value,
    pub vars: BTreeMap<String, String>,
    pub events: Vec<pb::Event>,
    /// The last bytes each written path got (paths as written, this run's id in them).
    pub files: BTreeMap<String, FileSeen>,
}

/// A file a run wrote, as read back (None when it was gone or too large to diff).
pub struct FileSeen {
    pub sha256: String,
    pub bytes: Option<Vec<u8>>,
}

/// The paths of `artifact.written` events, last write first wins per path.
pub fn written_paths(events: &[pb::Event]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in events.iter().filter(|e| e.r#type == "artifact.written") {
        let d = data(e);
        if let Some(path) = d.get("path").and_then(Value::as_str) {
            let sha = d.get("sha256").and_then(Value::as_str).unwrap_or_default();
            out.insert(path.to_owned(), sha.to_owned());
        }
    }
    out
}

fn data(e: &pb::Event) -> Map<String, Value> {
    match serde_json::from_str(&e.data_json) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// How one run's records are made comparable: its id marked, and the sha256 of each file it
/// wrote (which changes with the id when the file names it) replaced by the sha256 of the
/// file with the id marked.
struct Norm {
    run: String,
    shas: Vec<(String, String)>,
}

impl Norm {
    fn of(s: &Side) -> Norm {
        let mut n = Norm {
            run: s.run_id.clone(),
            shas: Vec::new(),
        };
        // Twice: a file may name the hash of another file that names the run (a report of
        // the documents' hashes).
        for _ in 0..2 {
            let shas = s
                .files
                .values()
                .filter_map(|f| {
                    let text = n.text(std::str::from_utf8(f.bytes.as_deref()?).ok()?);
                    let sha = sha256_hex(text.as_bytes());
                    (sha != f.sha256).then(|| (f.sha256.clone(), format!("sha256:{sha}")))
                })
                .collect();
            n.shas = shas;
        }
        n
    }

    fn text(&self, t: &str) -> String {
        let mut t = t.replace(&self.run, RUN_ID_MARK);
        for (raw, marked) in &self.shas {
            if t.contains(raw.as_str()) {
                t = t.replace(raw.as_str(), marked);
            }
        }
        t
    }

    fn value(&self, v: Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.text(&s)),
            Value::Array(a) => Value::Array(a.into_iter().map(|x| self.value(x)).collect()),
            Value::Object(m) => {
                Value::Object(m.into_iter().map(|(k, x)| (k, self.value(x))).collect())
            }
            other => other,
        }
    }

    /// A file's bytes as compared (text normalised; other bytes as they are).
    fn file(&self, f: &FileSeen) -> (String, Option<String>) {
        match f.bytes.as_deref() {
            Some(b) => match std::str::from_utf8(b) {
                Ok(t) => {
                    let t = self.text(t);
                    (sha256_hex(t.as_bytes()), Some(t))
                }
                Err(_) => (f.sha256.clone(), None),
            },
            None => (f.sha256.clone(), None),
        }
    }
}

/// `v` without volatile fields (at any depth), normalised by `n`.
fn stable(v: Value, n: &Norm) -> Value {
    fn strip(v: Value) -> Value {
        match v {
            Value::Object(m) => {
                // A size beside a sha256 says nothing the (normalised) hash does not, and it
                // changes with the length of a run id the file names.
                let hashed = m.contains_key("sha256");
                Value::Object(
                    m.into_iter()
                        .filter(|(k, x)| {
                            let write_outcome = k == "outcome"
                                && x.as_str().is_some_and(|w| WRITE_OUTCOMES.contains(&w));
                            let size = hashed && matches!(k.as_str(), "bytes" | "size_bytes");
                            !VOLATILE.contains(&k.as_str()) && !write_outcome && !size
                        })
                        .map(|(k, x)| (k, strip(x)))
                        .collect(),
                )
            }
            Value::Array(a) => Value::Array(a.into_iter().map(strip).collect()),
            other => other,
        }
    }
    n.value(strip(v))
}

/// Each node's events (map items by their own id), in order, as compared.
fn node_events(s: &Side, n: &Norm) -> BTreeMap<String, Vec<Value>> {
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for e in &s.events {
        if e.node_id.is_empty() {
            continue;
        }
        let v = json!({"type": e.r#type, "data": Value::Object(data(e))});
        out.entry(e.node_id.clone()).or_default().push(stable(v, n));
    }
    // The ingest service appends its own events while the orchestrator appends the node's:
    // each writer's events keep their order, but how the two interleave is timing.
    for events in out.values_mut() {
        events.sort_by_key(|v| v["type"].as_str().is_some_and(|t| t.starts_with("ingest.")));
    }
    out
}

/// Node ids in the order they first started in `s`.
fn node_order(s: &Side) -> Vec<String> {
    let mut seen = Vec::new();
    for e in &s.events {
        if !e.node_id.is_empty() && !seen.contains(&e.node_id) {
            seen.push(e.node_id.clone());
        }
    }
    seen
}

/// The last outputs and the attempts of a node.
fn node_summary(s: &Side, node: &str) -> (Value, u32, Option<u64>, Value) {
    let mut outputs = Value::Null;
    let mut attempts = 0;
    let mut started: Option<time::OffsetDateTime> = None;
    let mut duration = None;
    let mut usage = json!({"prompt_tokens": 0, "completion_tokens": 0});
    for e in s.events.iter().filter(|e| e.node_id == node) {
        let d = data(e);
        let ts =
            time::OffsetDateTime::parse(&e.ts, &time::format_description::well_known::Rfc3339).ok();
        match e.r#type.as_str() {
            "node.started" => {
                attempts = d.get("attempt").and_then(Value::as_u64).unwrap_or(1) as u32;
                started = ts;
            }
            "node.completed" | "node.failed" => {
                if let Some(o) = d.get("outputs") {
                    outputs = o.clone();
                }
                if let (Some(a), Some(b)) = (started, ts) {
                    duration = u64::try_from((b - a).whole_milliseconds()).ok();
                }
            }
            "agent.completed" => {
                for k in ["prompt_tokens", "completion_tokens"] {
                    let add = d
                        .get("usage")
                        .and_then(|u| u.get(k))
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                    let sum = usage[k].as_u64().unwrap_or(0) + add;
                    usage[k] = sum.into();
                }
            }
            _ => {}
        }
    }
    (outputs, attempts, duration, usage)
}

fn total_usage(nodes: &[Value], side: &str) -> Value {
    let mut p = 0;
    let mut c = 0;
    for n in nodes {
        p += n["usage"][side]["prompt_tokens"].as_u64().unwrap_or(0);
        c += n["usage"][side]["completion_tokens"].as_u64().unwrap_or(0);
    }
    json!({"prompt_tokens": p, "completion_tokens": c})
}

fn graph_without_vars(s: &Side) -> Value {
    let mut g = s.graph.clone();
    if let Value::Object(m) = &mut g {
        m.remove("vars");
        m.remove("run_id");
    }
    replace_in(g, &s.run_id, RUN_ID_MARK)
}

fn run_span_ms(s: &Side) -> Option<u64> {
    let parse = |t: &str| {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
    };
    let first = s.events.first().and_then(|e| parse(&e.ts))?;
    let last = s.events.last().and_then(|e| parse(&e.ts))?;
    u64::try_from((last - first).whole_milliseconds()).ok()
}

/// The comparison of two runs as one JSON object (`cairn runs diff --json`).
pub fn diff(a: &Side, b: &Side) -> Value {
    let (na, nb) = (Norm::of(a), Norm::of(b));
    let (ga, gb) = (graph_without_vars(a), graph_without_vars(b));
    let graph = if ga == gb {
        json!({"same": true})
    } else {
        json!({"same": false, "diff": unified_diff(&pretty(&ga), &pretty(&gb), &a.run_id, &b.run_id)})
    };
    let mut vars = Vec::new();
    let names: std::collections::BTreeSet<&String> = a.vars.keys().chain(b.vars.keys()).collect();
    for k in names {
        let (va, vb) = (a.vars.get(k), b.vars.get(k));
        if va != vb {
            vars.push(json!({"name": k, "a": va, "b": vb}));
        }
    }
    let mut order = node_order(a);
    for n in node_order(b) {
        if !order.contains(&n) {
            order.push(n);
        }
    }
    let mut nodes = Vec::new();
    for id in &order {
        let (oa, ta, da, ua) = node_summary(a, id);
        let (ob, tb, db, ub) = node_summary(b, id);
        let (sa, sb) = (stable(oa, &na), stable(ob, &nb));
        let mut n = json!({
            "node": id,
            "attempts": {"a": ta, "b": tb},
            "outputs_same": sa == sb,
            "usage": {"a": ua, "b": ub},
            "duration_ms": {"a": da, "b": db},
        });
        if sa != sb {
            n["outputs_diff"] =
                unified_diff(&pretty(&sa), &pretty(&sb), &a.run_id, &b.run_id).into();
        }
        nodes.push(n);
    }
    let mut files = Vec::new();
    let fa: BTreeMap<String, &FileSeen> = a.files.iter().map(|(p, f)| (na.text(p), f)).collect();
    let fb: BTreeMap<String, &FileSeen> = b.files.iter().map(|(p, f)| (nb.text(p), f)).collect();
    let paths: std::collections::BTreeSet<&String> = fa.keys().chain(fb.keys()).collect();
    for p in paths {
        let (xa, xb) = (fa.get(p).map(|f| na.file(f)), fb.get(p).map(|f| nb.file(f)));
        let same = matches!((&xa, &xb), (Some(x), Some(y)) if x.0 == y.0);
        let mut f = json!({
            "path": p,
            "sha256": {"a": fa.get(p).map(|x| x.sha256.clone()), "b": fb.get(p).map(|x| x.sha256.clone())},
            "same": same,
        });
        if !same {
            let text = |x: &Option<(String, Option<String>)>| match x {
                None => Some(String::new()),
                Some((_, t)) => t.clone(),
            };
            if let (Some(ta), Some(tb)) = (text(&xa), text(&xb)) {
                f["diff"] = unified_diff(&ta, &tb, &format!("a/{p}"), &format!("b/{p}")).into();
            }
        }
        files.push(f);
    }
    json!({
        "run_a": a.run_id,
        "run_b": b.run_id,
        "state": {"a": a.state, "b": b.state},
        "graph": graph,
        "vars": vars,
        "nodes": nodes,
        "files": files,
        "usage": {"a": total_usage(&nodes, "a"), "b": total_usage(&nodes, "b")},
        "duration_ms": {"a": run_span_ms(a), "b": run_span_ms(b)},
    })
}

/// The determinism verdict of `b`, a replay of `a` (`cairn runs replay --json`).
pub fn verdict(a: &Side, b: &Side, report: &Value) -> Value {
    let out = |verdict: &str, divergence: Value| json!({"run_id": b.run_id, "replay_of": a.run_id, "verdict": verdict, "divergence": divergence});
    let div = |node: &str, attempt: u64, what: String, diff: String| json!({"node": node, "attempt": attempt, "what": what, "diff": diff});
    if !["completed", "failed", "canceled"].contains(&b.state.as_str()) {
        return out("running", Value::Null);
    }
    // A request that differs from the recorded one failed its node, or (`live_after`) went
    // on live with a `replay.live` event: the first such is the divergence (the message or
    // the event carries the request diff).
    const DIVERGED: &str = "replay diverged at node";
    let first = b.events.iter().find(|e| {
        e.r#type == "replay.live"
            || e.r#type == "node.failed"
                && data(e)
                    .get("error")
                    .and_then(Value::as_str)
                    .is_some_and(|t| t.contains(DIVERGED))
    });
    if let Some(e) = first.filter(|e| e.r#type == "replay.live") {
        let d = data(e);
        let text = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or_default();
        let what = match text("why") {
            "missing" => "request (no record; went on live)",
            "sandbox" => "sandbox request (went on live)",
            "agent" => "external agent request (went on live)",
            _ => "request (went on live)",
        };
        return out(
            "diverged",
            div(
                &e.node_id,
                d.get("attempt").and_then(Value::as_u64).unwrap_or(1),
                what.into(),
                text("diff").to_owned(),
            ),
        );
    }
    if let Some(e) = first {
        let d = data(e);
        let text = d.get("error").and_then(Value::as_str).unwrap_or_default();
        let from = text.find(DIVERGED).unwrap_or(0);
        let (_, diff) = text[from..].split_once('\n').unwrap_or((text, ""));
        let attempt = d.get("attempt").and_then(Value::as_u64).unwrap_or(1);
        return out(
            "diverged",
            div(&e.node_id, attempt, "request".into(), diff.to_owned()),
        );
    }
    if a.state != b.state {
        let node = b
            .events
            .iter()
            .rfind(|e| e.r#type == "node.failed")
            .map(|e| (e.node_id.clone(), data(e)));
        return out(
            "failed",
            match node {
                Some((n, d)) => div(
                    &n,
                    d.get("attempt").and_then(Value::as_u64).unwrap_or(1),
                    format!("run state: {} (recorded: {})", b.state, a.state),
                    d.get("error")
                        .and_then(Value::as_str)
                        .unwrap_or(&b.error)
                        .to_owned(),
                ),
                None => {
                    json!({"what": format!("run state: {} (recorded: {})", b.state, a.state), "diff": b.error})
                }
            },
        );
    }
    // Same end: the first node (in the recorded order) whose outputs or events differ.
    let (ea, eb) = (node_events(a, &Norm::of(a)), node_events(b, &Norm::of(b)));
    let empty = Vec::new();
    for n in report["nodes"].as_array().unwrap_or(&empty) {
        let id = n["node"].as_str().unwrap_or_default();
        let attempt = n["attempts"]["b"].as_u64().unwrap_or(1);
        if n["outputs_same"] == false {
            return out(
                "diverged",
                div(
                    id,
                    attempt,
                    "outputs".into(),
                    n["outputs_diff"].as_str().unwrap_or_default().into(),
                ),
            );
        }
        let (xa, xb) = (ea.get(id).unwrap_or(&empty), eb.get(id).unwrap_or(&empty));
        if xa != xb {
            let lines = |x: &Vec<Value>| x.iter().map(|v| format!("{v}\n")).collect::<String>();
            return out(
                "diverged",
                div(
                    id,
                    attempt,
                    "events".into(),
                    unified_diff(&lines(xa), &lines(xb), "recorded", "replay"),
                ),
            );
        }
    }
    for f in report["files"].as_array().unwrap_or(&empty) {
        if f["same"] == false {
            let path = f["path"].as_str().unwrap_or_default();
            // The node that wrote it, for the report.
            let writer = b
                .events
                .iter()
                .chain(a.events.iter())
                .find(|e| {
                    e.r#type == "artifact.written"
                        && data(e)
                            .get("path")
                            .and_then(Value::as_str)
                            .is_some_and(|p| {
                                p.replace(&b.run_id, RUN_ID_MARK) == path
                                    || p.replace(&a.run_id, RUN_ID_MARK) == path
                            })
                })
                .map(|e| e.node_id.clone())
                .unwrap_or_default();
            return out(
                "diverged",
                div(
                    &writer,
                    1,
                    format!("file {path}"),
                    f["diff"].as_str().unwrap_or_default().into(),
                ),
            );
        }
    }
    let run_level = |s: &Side| -> Vec<String> {
        s.events
            .iter()
            .filter(|e| e.node_id.is_empty() && !START_EVENTS.contains(&e.r#type.as_str()))
            .map(|e| e.r#type.clone())
            .collect()
    };
    if run_level(a) != run_level(b) {
        let lines = |x: Vec<String>| x.join("\n") + "\n";
        return out(
            "diverged",
            json!({"node": "", "attempt": 0, "what": "run events", "diff": unified_diff(&lines(run_level(a)), &lines(run_level(b)), "recorded", "replay")}),
        );
    }
    out("identical", Value::Null)
}

#[cfg(test)]
mod tests;
