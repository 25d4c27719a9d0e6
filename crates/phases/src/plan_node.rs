//! `plan`: decides what a scheduled run does. Processable tasks given in `tasks`
//! make a `tasks` plan; otherwise up to `max_per_run` auto tasks are picked round-robin from
//! where the last run stopped, skipping keys whose daily limit is reached (`auto`); when every
//! key is exhausted the plan is `idle` and the run has nothing to do. The decision is recorded
//! in the counters document by compare-and-swap (phases/counters.rs), so concurrent runs pick
//! different tasks.

use serde_json::{json, Map, Value};

use crate::counters::{self, Counters};
use crate::plan::{
    check_date, parse_offset, select, today, PlanSpec, Selection, DEFAULT_MAX_PER_RUN,
};
use crate::{Limits, PLAN_SELECTED};
use cairn_node::events::{now, Ev};
use cairn_node::{project_path, Access, NodeCtx, NodeError, NodeSuccess};

pub async fn run(ctx: &NodeCtx, spec: &PlanSpec) -> Result<NodeSuccess, NodeError> {
    // A replay takes the recorded decision and claims nothing (replayed.rs).
    if let Some(r) = ctx.replay() {
        return crate::replayed::plan(ctx, &r.source).await;
    }
    let limits = spec.limits.as_ref().ok_or_else(|| {
        NodeError::refused(
            "field `limits_file`: the limits were not loaded at submit (submit the graph through the orchestrator's SubmitRun)",
        )
    })?;
    let offset = parse_offset(spec.utc_offset.as_deref().unwrap_or("Z"))
        .map_err(|m| NodeError::refused(format!("field `utc_offset`: {m}")))?;
    let date = match &spec.date {
        Some(t) => {
            let d = ctx.scope.render("date", t)?.trim().to_owned();
            if d.is_empty() {
                today(offset)
            } else {
                check_date(&d).map_err(|m| NodeError::refused(format!("field `date`: {m}")))?;
                d
            }
        }
        None => today(offset),
    };
    let counters_path = match &spec.counters {
        Some(t) => project_path(&ctx.scope, "counters", t, Access::Write)?,
        None => counters::DEFAULT_PATH.to_owned(),
    };
    let max = spec
        .max_per_run
        .or(limits.max_per_run)
        .unwrap_or(DEFAULT_MAX_PER_RUN) as usize;

    // The document names the agent as the phase contract knows it.
    let agent = spec.agent.as_deref().unwrap_or(&ctx.node_id);
    if let Some(t) = &spec.tasks {
        let tasks = task_list(ctx.scope.render_value("tasks", t)?)?;
        if !tasks.is_empty() {
            return Ok(tasks_plan(ctx, agent, &date, &counters_path, tasks));
        }
    }

    let run_id = ctx.run_id.clone();
    let (sel, before, version) = counters::compare_and_swap(
        ctx.store(),
        &ctx.project,
        &counters_path,
        &run_id,
        |c: &Counters| {
            let used = |k: &str| c.used(&date, k);
            let sel = select(&limits.tasks, &used, c.cursor(), max);
            if sel.picked.is_empty() {
                return (sel, None);
            }
            let keys: Vec<String> = sel
                .picked
                .iter()
                .map(|p| limits.tasks[p.index].key.clone())
                .collect();
            let patch = counters::claim_patch(c, &date, &run_id, &keys, sel.cursor);
            (sel, Some(patch))
        },
    )
    .await?;
    Ok(auto_plan(
        ctx,
        agent,
        limits,
        &date,
        &counters_path,
        max,
        &sel,
        &before,
        version,
    ))
}

/// `tasks` rendered: a JSON array (or JSON text of one; empty text or null = none).
fn task_list(v: Value) -> Result<Vec<Value>, NodeError> {
    match v {
        Value::Array(a) => Ok(a),
        Value::Null => Ok(Vec::new()),
        Value::String(s) if s.trim().is_empty() => Ok(Vec::new()),
        Value::String(s) => match serde_json::from_str::<Value>(&s) {
            Ok(Value::Array(a)) => Ok(a),
            _ => Err(NodeError::refused(
                "field `tasks`: not a JSON array of tasks",
            )),
        },
        other => Err(NodeError::refused(format!(
            "field `tasks`: {other} is not a list of tasks"
        ))),
    }
}

fn base_doc(agent: &str, date: &str, counters_path: &str, plan_type: &str) -> Map<String, Value> {
    let mut doc = Map::new();
    doc.insert("agent".into(), agent.into());
    doc.insert("status".into(), "success".into());
    doc.insert("fetched_at".into(), now().into());
    doc.insert("plan_type".into(), plan_type.into());
    doc.insert("date".into(), date.into());
    doc.insert("counters".into(), counters_path.into());
    doc
}

fn finish(mut doc: Map<String, Value>, extra: Map<String, Value>, event: Ev) -> NodeSuccess {
    for (k, v) in [
        (
            "sync_warnings",
            json!({"unmatched_labels": [], "suggestion": null}),
        ),
        ("skills_used", json!([])),
        ("error", Value::Null),
    ] {
        doc.entry(k).or_insert(v);
    }
    let doc = Value::Object(doc);
    let mut outputs = extra;
    for k in ["plan_type", "date", "tasks", "counters"] {
        outputs.insert(k.into(), doc.get(k).cloned().unwrap_or(Value::Null));
    }
    outputs.insert("result".into(), doc);
    NodeSuccess {
        outputs,
        events: vec![event],
    }
}

fn tasks_plan(
    ctx: &NodeCtx,
    agent: &str,
    date: &str,
    counters_path: &str,
    tasks: Vec<Value>,
) -> NodeSuccess {
    let n = tasks.len();
    let ranked: Vec<Value> = tasks
        .into_iter()
        .enumerate()
        .map(|(i, t)| match t {
            Value::Object(mut m) => {
                m.entry("rank").or_insert(json!(i + 1));
                Value::Object(m)
            }
            other => json!({"rank": i + 1, "content": other}),
        })
        .collect();
    let mut doc = base_doc(agent, date, counters_path, "tasks");
    doc.insert("tasks".into(), Value::Array(ranked));
    doc.insert("auto_tasks".into(), Value::Null);
    doc.insert(
        "filter_summary".into(),
        json!({"processable": n, "skipped": 0}),
    );
    doc.insert("skipped_tasks".into(), json!([]));
    let mut extra = Map::new();
    extra.insert("selected_tasks".into(), json!([]));
    extra.insert("selected".into(), json!({}));
    extra.insert("prompts".into(), json!({}));
    extra.insert("all_exhausted".into(), false.into());
    let event = Ev::new(PLAN_SELECTED, &ctx.node_id)
        .with("plan_type", "tasks")
        .with("date", date)
        .with("tasks", n);
    finish(doc, extra, event)
}

#[allow(clippy::too_many_arguments)]
fn auto_plan(
    ctx: &NodeCtx,
    agent: &str,
    limits: &Limits,
    date: &str,
    counters_path: &str,
    max: usize,
    sel: &Selection,
    before: &Counters,
    version: Option<u64>,
) -> NodeSuccess {
    let idle = sel.picked.is_empty();
    let plan_type = if idle { "idle" } else { "auto" };
    let selected_tasks: Vec<Value> = sel
        .picked
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let t = &limits.tasks[p.index];
            json!({
                "key": t.key,
                "name": t.name.clone().unwrap_or_else(|| t.key.clone()),
                "current_count": p.used,
                "limit": t.daily_limit,
                "execution_order": p.index + 1,
                "selection_order": i + 1,
                "prompt_file": t.prompt_file,
                "result_file": t.result,
                "prompt": t.prompt,
            })
        })
        .collect();
    let total_used: u64 = limits
        .tasks
        .iter()
        .map(|t| before.used(date, &t.key).min(u64::from(t.daily_limit)))
        .sum();
    let total_limit = limits.total_limit();
    let skipped: Vec<Value> = sel
        .exhausted
        .iter()
        .map(|(i, used)| {
            let t = &limits.tasks[*i];
            json!({"key": t.key, "current_count": used, "limit": t.daily_limit, "reason": "daily limit reached"})
        })
        .collect();
    let mut doc = base_doc(agent, date, counters_path, plan_type);
    doc.insert("tasks".into(), json!([]));
    doc.insert(
        "auto_tasks".into(),
        json!({
            "selected_tasks": selected_tasks,
            "next_execution_order_after": sel.next_order,
            "all_exhausted": idle,
            "summary": {
                "total_limit": total_limit,
                "total_used": total_used,
                "remaining": total_limit.saturating_sub(total_used),
                "selected_count": sel.picked.len(),
                "max_per_run": max,
            },
        }),
    );
    doc.insert(
        "filter_summary".into(),
        json!({"processable": 0, "skipped": 0}),
    );
    doc.insert("skipped_tasks".into(), Value::Array(skipped));
    let picked: Vec<&str> = sel
        .picked
        .iter()
        .map(|p| limits.tasks[p.index].key.as_str())
        .collect();
    let mut extra = Map::new();
    extra.insert("selected_tasks".into(), Value::Array(selected_tasks));
    extra.insert(
        "selected".into(),
        Value::Object(
            limits
                .tasks
                .iter()
                .map(|t| (t.key.clone(), picked.contains(&t.key.as_str()).into()))
                .collect(),
        ),
    );
    extra.insert(
        "prompts".into(),
        Value::Object(
            limits
                .tasks
                .iter()
                .map(|t| (t.key.clone(), t.prompt.clone().unwrap_or_default().into()))
                .collect(),
        ),
    );
    extra.insert("all_exhausted".into(), idle.into());
    let event = Ev::new(PLAN_SELECTED, &ctx.node_id)
        .with("plan_type", plan_type)
        .with("date", date)
        .with("keys", json!(picked))
        .with("cursor", sel.cursor)
        .with("counters", counters_path)
        .with("counters_version", json!(version));
    finish(doc, extra, event)
}

cairn_node::unit_kind!(
    /// The `plan` kind.
    PlanKind,
    "plan",
    cairn_graph::NodeKind::Plan,
    run
);
