//! `assemble`: the last phase. Reads the plan and every result it implies (plus
//! `results`), judges each with phases/assemble.rs, counts auto-task successes in the
//! counters document (expected_version + max-merge), and writes a Markdown report. A failed
//! result never fails this node; a missing or failed plan does (Phase 3 ends).

use std::collections::BTreeSet;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::assemble::{action, find, index, judge, overall, tally, AssembleSpec, Verdict};
use crate::counters::{self, Counters};
use crate::{
    check_result_name, normalize_key, results_dir, results_path, Contracts, COUNTERS_UPDATED,
};
use cairn_node::events::Ev;
use cairn_node::layout::front_matter;
use cairn_node::{
    artifact_written, file_outputs, project_path, Access, NodeCtx, NodeError, NodeSuccess,
};
use cairn_store_client::PutOptions;

/// One result to read: its name and what the plan says it is.
struct Expected {
    name: String,
    key: Option<String>,
    rank: Option<Value>,
    limit: Option<u64>,
}

pub async fn run(ctx: &NodeCtx, spec: &AssembleSpec) -> Result<NodeSuccess, NodeError> {
    let contracts = Contracts::compile(&ctx.scope.graph.contracts)
        .map_err(|m| NodeError::refused(format!("contracts: {m}")))?;
    let dir = results_dir(&ctx.run_id);
    let listed = ctx
        .store()
        .list(&ctx.project, &dir, true)
        .await
        .map_err(|s| NodeError::from_status(&format!("listing {dir}"), &s))?;
    let prefix = format!("{dir}/");
    let present = index(
        listed
            .into_iter()
            .filter(|e| e.kind == cairn_proto::v1::EntryKind::File as i32)
            .filter_map(|e| e.path.strip_prefix(&prefix).map(str::to_owned)),
    );

    let mut expected: Vec<Expected> = Vec::new();
    let mut plan_type = "none".to_owned();
    let mut plan = Value::Null;
    if let Some(t) = &spec.plan {
        let name = ctx.scope.render("plan", t)?;
        check_result_name(&name).map_err(|m| NodeError::refused(format!("field `plan`: {m}")))?;
        let bytes = read(ctx, find(&name, &present)).await?;
        let (status, reason, _) = judge(&name, bytes.as_deref(), &contracts);
        if status != "success" {
            return Err(NodeError::refused(format!(
                "the plan results/{name} is {status}: {} (without a plan the phase ends)",
                reason.unwrap_or_default()
            )));
        }
        plan = bytes
            .as_deref()
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or(Value::Null);
        plan_type = plan
            .get("plan_type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        expected.extend(plan_results(spec, &plan, &plan_type, &name)?);
    }
    for (i, t) in spec.results.iter().enumerate() {
        let name = ctx.scope.render(&format!("results[{i}]"), t)?;
        check_result_name(&name)
            .map_err(|m| NodeError::refused(format!("field `results[{i}]`: {m}")))?;
        expected.push(Expected {
            name,
            key: None,
            rank: None,
            limit: None,
        });
    }

    let mut seen = BTreeSet::new();
    let mut verdicts = Vec::new();
    for e in expected {
        if !seen.insert(normalize_key(&e.name)) {
            continue;
        }
        let found = find(&e.name, &present).cloned();
        let bytes = read(ctx, found.as_ref()).await?;
        let judged_as = found.clone().unwrap_or_else(|| e.name.clone());
        let (status, reason, summary) = judge(&judged_as, bytes.as_deref(), &contracts);
        let kind = if e.key.is_some() {
            "auto"
        } else if e.rank.is_some() {
            "tasks"
        } else {
            "results"
        };
        verdicts.push((
            Verdict {
                action: action(kind, &status).to_owned(),
                found: found.filter(|f| *f != e.name),
                file: e.name,
                key: e.key,
                rank: e.rank,
                status,
                reason,
                summary,
            },
            e.limit,
        ));
    }

    let mut events = Vec::new();
    let mut counters_out = Value::Null;
    // A replay counts nothing: the counters are reported as the recorded run left them.
    let replay = ctx.replay();
    if let (Some(r), "auto") = (&replay, plan_type.as_str()) {
        if let Some((out, event)) = crate::replayed::counters(ctx, &r.source).await? {
            counters_out = out;
            events.push(event);
        }
    } else if plan_type == "auto" {
        let path = match &spec.counters {
            Some(t) => project_path(&ctx.scope, "counters", t, Access::Write)?,
            None => plan
                .get("counters")
                .and_then(Value::as_str)
                .filter(|p| {
                    pathguard::validate(p).is_ok()
                        && pathguard::records::check_node_write(p).is_ok()
                })
                .unwrap_or(counters::DEFAULT_PATH)
                .to_owned(),
        };
        let date = plan
            .get("date")
            .and_then(Value::as_str)
            .filter(|d| crate::plan::check_date(d).is_ok())
            .map(str::to_owned)
            .unwrap_or_else(|| crate::plan::today(time::UtcOffset::UTC));
        let counted: Vec<(String, u64)> = verdicts
            .iter()
            .filter(|(v, _)| v.action == "count")
            .filter_map(|(v, _)| v.key.clone().map(|k| (k, 1)))
            .collect();
        let rec = counters::record(
            ctx.store(),
            &ctx.project,
            &path,
            &ctx.run_id,
            &date,
            &counted,
        )
        .await?;
        let after =
            Counters::parse(&path, Some(rec.document.to_string().as_bytes())).unwrap_or_default();
        let used: Map<String, Value> = verdicts
            .iter()
            .filter_map(|(v, _)| v.key.clone())
            .map(|k| {
                let n = after.used(&date, &k);
                (k, n.into())
            })
            .collect();
        let counted_keys: Vec<&String> = counted.iter().map(|(k, _)| k).collect();
        events.push(
            Ev::new(COUNTERS_UPDATED, &ctx.node_id)
                .with("path", path.as_str())
                .with("date", date.as_str())
                .with("counted", json!(counted_keys))
                .with("version", rec.version)
                .with("merged_conflict", rec.merged_conflict),
        );
        counters_out = json!({
            "path": path,
            "date": date,
            "version": rec.version,
            "merged_conflict": rec.merged_conflict,
            "counted": counted_keys,
            "used": used,
        });
    }

    let only: Vec<Verdict> = verdicts.iter().map(|(v, _)| v.clone()).collect();
    let status = overall(&only);
    let counts = tally(&only);
    let summary_doc = json!({
        "agent": ctx.node_id,
        "status": status,
        "plan_type": plan_type,
        "results": only,
        "counts": counts,
        "counters": counters_out,
        "error": null,
    });

    let report_path = match &spec.report {
        Some(t) => project_path(&ctx.scope, "report", t, Access::Write)?,
        None => format!("docs/{}/{}.md", ctx.run_id, ctx.node_id),
    };
    let body = report(ctx, &plan_type, status, &verdicts, &counts, &counters_out);
    let opts = PutOptions {
        overwrite: ctx.reset,
        run_id: ctx.run_id.clone(),
        ..Default::default()
    };
    let put = ctx
        .store()
        .put(&ctx.project, &report_path, Bytes::from(body), &opts)
        .await
        .map_err(|s| cairn_node::write_error(&report_path, &s))?;
    events.push(artifact_written(&ctx.node_id, &put, None));

    let mut outputs = file_outputs(&put);
    outputs.insert("plan_type".into(), plan_type.clone().into());
    outputs.insert("status".into(), status.into());
    outputs.insert("results".into(), json!(only));
    for k in ["partial", "failed", "no_changes"] {
        outputs.insert(k.into(), counts[k].clone());
    }
    let ok = counts["success"].as_u64().unwrap_or(0) + counts["no_changes"].as_u64().unwrap_or(0);
    outputs.insert("succeeded".into(), ok.into());
    outputs.insert("counters".into(), counters_out);
    outputs.insert("result".into(), summary_doc);
    Ok(NodeSuccess { outputs, events })
}

/// What the plan expects.
fn plan_results(
    spec: &AssembleSpec,
    plan: &Value,
    plan_type: &str,
    plan_name: &str,
) -> Result<Vec<Expected>, NodeError> {
    let mut out = Vec::new();
    match plan_type {
        "tasks" => {
            let tasks = plan.get("tasks").and_then(Value::as_array);
            for (i, t) in tasks.into_iter().flatten().enumerate() {
                let rank = t.get("rank").cloned().unwrap_or(json!(i + 1));
                let text = match &rank {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let name = spec.task_results.replace("{rank}", &text);
                check_result_name(&name).map_err(|m| {
                    NodeError::refused(format!("{plan_name}: task rank {text}: {m}"))
                })?;
                out.push(Expected {
                    name,
                    key: None,
                    rank: Some(rank),
                    limit: None,
                });
            }
        }
        "auto" => {
            let selected = plan
                .pointer("/auto_tasks/selected_tasks")
                .and_then(Value::as_array);
            for t in selected.into_iter().flatten() {
                let Some(raw) = t.get("key").and_then(Value::as_str) else {
                    return Err(NodeError::refused(format!(
                        "{plan_name}: a selected task has no `key`"
                    )));
                };
                let key = normalize_key(raw);
                // A task whose result file is named otherwise says so in the limits file.
                let name = match t.get("result_file").and_then(Value::as_str) {
                    Some(file) => file.to_owned(),
                    None => spec.auto_results.replace("{key}", &key),
                };
                check_result_name(&name)
                    .map_err(|m| NodeError::refused(format!("{plan_name}: key `{raw}`: {m}")))?;
                out.push(Expected {
                    name,
                    key: Some(key),
                    rank: None,
                    limit: t.get("limit").and_then(Value::as_u64),
                });
            }
        }
        "idle" => {}
        other => {
            return Err(NodeError::refused(format!(
                "{plan_name}: plan_type `{other}` is unknown; expected tasks, auto or idle"
            )))
        }
    }
    Ok(out)
}

async fn read(ctx: &NodeCtx, name: Option<&String>) -> Result<Option<Bytes>, NodeError> {
    let Some(name) = name else {
        return Ok(None);
    };
    let path = results_path(&ctx.run_id, name);
    ctx.store()
        .get(&ctx.project, &path)
        .await
        .map_err(|s| NodeError::from_status(&format!("reading {path}"), &s))
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

fn report(
    ctx: &NodeCtx,
    plan_type: &str,
    status: &str,
    verdicts: &[(Verdict, Option<u64>)],
    counts: &Value,
    counters: &Value,
) -> String {
    let title = ctx
        .node
        .title
        .clone()
        .unwrap_or_else(|| format!("Phase results of run {}", ctx.run_id));
    let mut out = front_matter(
        &title,
        &format!("Phase results of run {}", ctx.run_id),
        &["phase-results", "assemble"],
        &ctx.run_id,
        None,
        None,
    );
    out.push_str(&format!("# {title}\n\n"));
    out.push_str(&format!(
        "Plan: `{plan_type}`. Overall: **{status}** ({} success, {} partial, {} failed, {} no_changes).\n\n",
        counts["success"], counts["partial"], counts["failed"], counts["no_changes"]
    ));
    if plan_type == "idle" {
        out.push_str("Every auto task reached its daily limit: nothing to do in this run.\n\n");
    }
    if !verdicts.is_empty() {
        out.push_str("| result | status | action | reason / summary |\n|---|---|---|---|\n");
        for (v, _) in verdicts {
            let mut note = v.reason.clone().unwrap_or_default();
            if let Some(s) = &v.summary {
                if !note.is_empty() {
                    note.push_str(" — ");
                }
                note.push_str(s);
            }
            let file = match &v.found {
                Some(f) => format!("{} (read {f})", v.file),
                None => v.file.clone(),
            };
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                cell(&file),
                v.status,
                v.action,
                cell(&note)
            ));
        }
        out.push('\n');
    }
    if let Some(path) = counters.get("path").and_then(Value::as_str) {
        let used: Vec<String> = verdicts
            .iter()
            .filter_map(|(v, limit)| {
                let k = v.key.as_ref()?;
                let n = counters.pointer(&format!("/used/{k}"))?.as_u64()?;
                Some(match limit {
                    Some(l) => format!("`{k}` {n}/{l}"),
                    None => format!("`{k}` {n}"),
                })
            })
            .collect();
        out.push_str(&format!(
            "Counters `{path}` for {} (version {}{}): {}.\n",
            counters["date"].as_str().unwrap_or(""),
            counters["version"],
            if counters["merged_conflict"].as_bool() == Some(true) {
                ", merged with a concurrent update"
            } else {
                ""
            },
            if used.is_empty() {
                "nothing counted".to_owned()
            } else {
                used.join(", ")
            }
        ));
    }
    out
}

cairn_node::unit_kind!(
    /// The `assemble` kind.
    AssembleKind,
    "assemble",
    cairn_graph::NodeKind::Assemble,
    run
);
