//! The `plan` node's spec (plan_type tasks/auto/idle) and its limits file: auto tasks with
//! daily limits, in execution order. Reading the files and selecting tasks happen in the
//! orchestrator.
//!
//! Limits file (YAML or JSON; a mapping keeps its order, which is the execution order):
//! ```yaml
//! max_per_run: 2
//! tasks:
//!   shurangama: {name: 楞嚴經研究, daily_limit: 5, prompt_file: prompts/todoist-auto-shurangama.md}
//!   tech-research: {daily_limit: 3}     # key normalised to tech_research
//! ```

use std::fmt;

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::contract::normalize_key;
use crate::Template;

/// Most tasks one plan may select.
pub const MAX_PER_RUN_LIMIT: u32 = 64;
/// "selected_tasks 由 round-robin 演算法選出（1-4 個）".
pub const DEFAULT_MAX_PER_RUN: u32 = 4;
/// Most auto tasks in one limits file.
const MAX_TASKS: usize = 1000;

/// One auto task of the limits file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitTask {
    /// The task key (normalised to `_` form when loaded).
    #[serde(default)]
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Successful runs allowed per day (0 = disabled).
    pub daily_limit: u32,
    /// Position in the rotation (1-based; default the order in the file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_order: Option<u32>,
    /// The task's prompt file, relative to the limits file (default
    /// `prompts/todoist-auto-<key>.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_file: Option<String>,
    /// The prompt text (inline, or loaded from `prompt_file` at submit; when both are set, as
    /// in graph.resolved.json, this is what was read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The name of the task's result file under results/, when it is not the one the
    /// `assemble` node's `auto_results` gives (`todoist-auto-<key>.json`): e.g. the key
    /// `git_push` with `todoist-auto-gitpush.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
}

/// The frequency limits: task key -> daily limit and prompt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_run: Option<u32>,
    /// In execution order (serialised as a list, so the order survives graph.resolved.json).
    #[serde(deserialize_with = "tasks_in_order")]
    pub tasks: Vec<LimitTask>,
}

/// Tasks as a list (each with `key`) or a mapping key -> task, in document order.
fn tasks_in_order<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<LimitTask>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<LimitTask>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a mapping of task key -> {daily_limit, prompt_file, ...} or a list of tasks with `key`")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(t) = seq.next_element::<LimitTask>()? {
                out.push(t);
            }
            Ok(out)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((key, mut t)) = map.next_entry::<String, LimitTask>()? {
                if !t.key.is_empty() && t.key != key {
                    return Err(serde::de::Error::custom(format!(
                        "task `{key}` has a different `key: {}`",
                        t.key
                    )));
                }
                t.key = key;
                out.push(t);
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

impl Limits {
    /// Parses a limits file's text (YAML or JSON).
    pub fn parse(text: &str) -> Result<Limits, String> {
        serde_saphyr::from_str::<Limits>(text).map_err(|e| e.to_string())
    }

    /// Normalises keys, orders by `execution_order`, checks everything.
    pub fn normalise(&mut self) -> Result<(), String> {
        if self.tasks.is_empty() {
            return Err("`tasks` is empty: list at least one auto task".into());
        }
        if self.tasks.len() > MAX_TASKS {
            return Err(format!("more than {MAX_TASKS} tasks"));
        }
        if let Some(m) = self.max_per_run {
            if !(1..=MAX_PER_RUN_LIMIT).contains(&m) {
                return Err(format!("max_per_run must be 1 to {MAX_PER_RUN_LIMIT}"));
            }
        }
        let mut seen = std::collections::BTreeMap::new();
        for t in &mut self.tasks {
            if !crate::valid_node_id(&t.key) {
                return Err(format!(
                    "task key `{}` must be 1-64 letters, digits, `_` or `-`",
                    t.key
                ));
            }
            if let Some(result) = &t.result {
                crate::contract::check_result_name(result)
                    .map_err(|m| format!("task `{}`: result {m}", t.key))?;
            }
            let raw = std::mem::take(&mut t.key);
            t.key = normalize_key(&raw);
            if let Some(other) = seen.insert(t.key.clone(), raw.clone()) {
                return Err(format!(
                    "task keys `{other}` and `{raw}` are the same key `{}` (`-` reads as `_`)",
                    t.key
                ));
            }
        }
        // Stable: tasks without an order keep their place after those with one.
        self.tasks
            .sort_by_key(|t| t.execution_order.unwrap_or(u32::MAX));
        Ok(())
    }

    pub fn total_limit(&self) -> u64 {
        self.tasks.iter().map(|t| u64::from(t.daily_limit)).sum()
    }
}

/// The `plan` node (docs/phases.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    /// The agent name the plan document records as `agent` (default the node id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The frequency-limits file, relative to the graph's directory (read at submit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits_file: Option<String>,
    /// The limits (inline, or loaded from `limits_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// Project path of the counters document (default `context/auto-tasks-today.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Template>,
    /// Tasks per run (default the limits file's, else 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_run: Option<u32>,
    /// Processable tasks (a JSON array); when non-empty the plan is `tasks`, not `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Template>,
    /// The day the limits count for, `YYYY-MM-DD` (default: today at `utc_offset`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<Template>,
    /// The offset of the local day, `+08:00` (default UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utc_offset: Option<String>,
}

impl PlanSpec {
    /// Graph-time checks (files are checked when loaded).
    pub fn check(&self) -> Result<(), (String, String)> {
        match (&self.limits, &self.limits_file) {
            (None, None) => {
                return Err((
                    "limits_file".into(),
                    "set `limits_file` (relative to the graph) or inline `limits`".into(),
                ))
            }
            (Some(l), _) => {
                let mut l = l.clone();
                l.normalise().map_err(|m| ("limits".into(), m))?;
            }
            (None, Some(f)) => {
                pathguard::validate(f)
                    .map_err(|rej| ("limits_file".into(), format!("`{f}`: {rej}")))?;
            }
        }
        if let Some(m) = self.max_per_run {
            if !(1..=MAX_PER_RUN_LIMIT).contains(&m) {
                return Err((
                    "max_per_run".into(),
                    format!("must be 1 to {MAX_PER_RUN_LIMIT}"),
                ));
            }
        }
        if let Some(o) = &self.utc_offset {
            parse_offset(o).map_err(|m| ("utc_offset".into(), m))?;
        }
        Ok(())
    }

    pub fn templates_mut(&mut self) -> Vec<(String, &mut Template)> {
        let mut out: Vec<(String, &mut Template)> = Vec::new();
        if let Some(t) = &mut self.counters {
            out.push(("counters".into(), t));
        }
        if let Some(t) = &mut self.tasks {
            out.push(("tasks".into(), t));
        }
        if let Some(t) = &mut self.date {
            out.push(("date".into(), t));
        }
        out
    }
}

/// `+08:00`, `-05:30`, `Z`.
pub fn parse_offset(s: &str) -> Result<time::UtcOffset, String> {
    if s == "Z" || s.is_empty() {
        return Ok(time::UtcOffset::UTC);
    }
    let fmt = time::macros::format_description!("[offset_hour sign:mandatory]:[offset_minute]");
    time::UtcOffset::parse(s, &fmt).map_err(|_| format!("`{s}` is not an offset like +08:00"))
}

/// A date `YYYY-MM-DD`.
pub fn check_date(s: &str) -> Result<(), String> {
    let fmt = time::macros::format_description!("[year]-[month]-[day]");
    time::Date::parse(s, &fmt)
        .map(|_| ())
        .map_err(|_| format!("`{s}` is not a date like 2026-02-28"))
}
