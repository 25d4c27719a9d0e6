//! Auto tasks with frequency limits (plan_type auto/idle): the limits file, the
//! `plan` node's spec, and the round-robin selection. The node itself is nodes/plan.rs.
//!
//! Limits file (YAML or JSON; a mapping keeps its order, which is the execution order):
//! ```yaml
//! max_per_run: 2
//! tasks:
//!   shurangama: {name: 楞嚴經研究, daily_limit: 5, prompt_file: prompts/todoist-auto-shurangama.md}
//!   tech-research: {daily_limit: 3}     # key normalised to tech_research
//! ```

use std::fmt;
use std::path::Path;

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::{normalize_key, read_local};
use crate::graph::Template;

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
            if !crate::graph::valid_node_id(&t.key) {
                return Err(format!(
                    "task key `{}` must be 1-64 letters, digits, `_` or `-`",
                    t.key
                ));
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

    /// Loads every task's prompt file (relative to `dir`) that is not loaded yet.
    fn load_prompts(&mut self, dir: &Path) -> Result<(), String> {
        for t in &mut self.tasks {
            if t.prompt.is_some() {
                continue;
            }
            let file = t
                .prompt_file
                .clone()
                .unwrap_or_else(|| format!("prompts/todoist-auto-{}.md", t.key));
            let text = read_local(dir, &file).map_err(|e| format!("task `{}`: {e}", t.key))?;
            t.prompt_file = Some(file);
            t.prompt = Some(text);
        }
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
    /// Submit time: the limits file and prompt files, relative to `base_dir`. Err = (field,
    /// message).
    pub fn load(&mut self, base_dir: &Path) -> Result<(), (String, String)> {
        let (mut limits, dir) = match (&self.limits, &self.limits_file) {
            (Some(l), _) => (l.clone(), base_dir.to_path_buf()),
            (None, Some(file)) => {
                let text = read_local(base_dir, file).map_err(|m| ("limits_file".into(), m))?;
                let limits = Limits::parse(&text)
                    .map_err(|m| ("limits_file".into(), format!("{file}: {m}")))?;
                let dir = base_dir
                    .join(file)
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| base_dir.to_path_buf());
                (limits, dir)
            }
            (None, None) => return Ok(()),
        };
        let field = if self.limits.is_some() {
            "limits"
        } else {
            "limits_file"
        };
        limits.normalise().map_err(|m| (field.to_owned(), m))?;
        limits
            .load_prompts(&dir)
            .map_err(|m| (field.to_owned(), m))?;
        self.limits = Some(limits);
        Ok(())
    }

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

/// Today at `offset`.
pub fn today(offset: time::UtcOffset) -> String {
    let d = time::OffsetDateTime::now_utc().to_offset(offset).date();
    format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day())
}

/// One task a plan picked.
#[derive(Clone, Debug, PartialEq)]
pub struct Picked {
    /// Index into the limits' tasks.
    pub index: usize,
    pub used: u64,
}

/// The outcome of a round-robin selection.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    pub picked: Vec<Picked>,
    /// Tasks passed over because their limit is reached: (index, used).
    pub exhausted: Vec<(usize, u64)>,
    /// The cursor after this selection (unchanged when nothing was picked).
    pub cursor: u64,
    /// 1-based position the next run starts from (None when nothing was picked).
    pub next_order: Option<usize>,
}

/// Picks up to `max` tasks round-robin starting where `cursor` points, skipping tasks whose
/// `used` reached their daily limit. The cursor is absolute (it only grows), so it can be
/// compared across versions of the counters document.
pub fn select(
    tasks: &[LimitTask],
    used: &dyn Fn(&str) -> u64,
    cursor: u64,
    max: usize,
) -> Selection {
    let n = tasks.len();
    let mut out = Selection {
        picked: Vec::new(),
        exhausted: Vec::new(),
        cursor,
        next_order: None,
    };
    if n == 0 || max == 0 {
        return out;
    }
    let start = (cursor % n as u64) as usize;
    let mut last = None;
    for step in 0..n {
        let index = (start + step) % n;
        let t = &tasks[index];
        let u = used(&t.key);
        if u >= u64::from(t.daily_limit) {
            out.exhausted.push((index, u));
            continue;
        }
        if out.picked.len() < max {
            out.picked.push(Picked { index, used: u });
            last = Some(step);
        }
    }
    if let Some(step) = last {
        out.cursor = cursor + step as u64 + 1;
        out.next_order = Some((start + step + 1) % n + 1);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn tasks(spec: &[(&str, u32)]) -> Vec<LimitTask> {
        spec.iter()
            .map(|(k, l)| LimitTask {
                key: (*k).into(),
                name: None,
                daily_limit: *l,
                execution_order: None,
                prompt_file: None,
                prompt: Some(format!("do {k}")),
            })
            .collect()
    }

    fn keys(t: &[LimitTask], s: &Selection) -> Vec<String> {
        s.picked.iter().map(|p| t[p.index].key.clone()).collect()
    }

    #[test]
    fn round_robin_continues_where_the_last_run_stopped() {
        let t = tasks(&[("a", 9), ("b", 9), ("c", 9)]);
        let none = |_: &str| 0;
        let s1 = select(&t, &none, 0, 2);
        assert_eq!(keys(&t, &s1), ["a", "b"]);
        assert_eq!((s1.cursor, s1.next_order), (2, Some(3)));
        let s2 = select(&t, &none, s1.cursor, 2);
        assert_eq!(keys(&t, &s2), ["c", "a"]);
        assert_eq!((s2.cursor, s2.next_order), (4, Some(2)));
        let s3 = select(&t, &none, s2.cursor, 2);
        assert_eq!(keys(&t, &s3), ["b", "c"]);
    }

    #[test]
    fn exhausted_keys_are_skipped_and_all_exhausted_is_idle() {
        let t = tasks(&[("a", 1), ("b", 2), ("c", 0)]);
        let used = HashMap::from([("a", 1u64), ("b", 1)]);
        let u = |k: &str| used.get(k).copied().unwrap_or(0);
        let s = select(&t, &u, 0, 4);
        assert_eq!(keys(&t, &s), ["b"]);
        assert_eq!(s.exhausted, vec![(0, 1), (2, 0)]);
        assert_eq!(s.cursor, 2);
        let full = |k: &str| if k == "b" { 2 } else { 5 };
        let idle = select(&t, &full, 7, 4);
        assert!(idle.picked.is_empty());
        assert_eq!((idle.cursor, idle.next_order), (7, None));
        assert_eq!(idle.exhausted.len(), 3);
    }

    #[test]
    fn limits_files_keep_their_order_and_normalise_keys() {
        let mut l = Limits::parse(
            "max_per_run: 2\ntasks:\n  zeta: {daily_limit: 1, prompt: z}\n  tech-research: {daily_limit: 3, prompt: t}\n  alpha: {daily_limit: 2, prompt: a}\n",
        )
        .unwrap();
        l.normalise().unwrap();
        let k: Vec<&str> = l.tasks.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(k, ["zeta", "tech_research", "alpha"]);
        assert_eq!(l.total_limit(), 6);
        // execution_order wins over the file's order.
        let mut l = Limits::parse(
            "tasks:\n  - {key: a, daily_limit: 1, execution_order: 2}\n  - {key: b, daily_limit: 1, execution_order: 1}\n",
        )
        .unwrap();
        l.normalise().unwrap();
        assert_eq!(l.tasks[0].key, "b");
    }

    #[test]
    fn bad_limits_say_what_to_fix() {
        let mut dup = Limits::parse(
            "tasks:\n  tech-research: {daily_limit: 1}\n  tech_research: {daily_limit: 1}\n",
        )
        .unwrap();
        let e = dup.normalise().unwrap_err();
        assert!(e.contains("same key `tech_research`"), "{e}");
        let e = Limits::parse("tasks:\n  a: {daily_limit: -1}\n").unwrap_err();
        assert!(!e.is_empty());
        let e = Limits::parse("tasks:\n  a: {limit: 1}\n").unwrap_err();
        assert!(e.contains("limit"), "{e}");
        let mut empty = Limits::parse("tasks: []\n").unwrap();
        assert!(empty.normalise().unwrap_err().contains("empty"));
        let mut bad = Limits::parse("max_per_run: 0\ntasks: {a: {daily_limit: 1}}\n").unwrap();
        assert!(bad.normalise().unwrap_err().contains("max_per_run"));
    }

    #[test]
    fn prompt_files_load_relative_to_the_limits_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("cfg/prompts")).unwrap();
        std::fs::write(
            dir.path().join("cfg/limits.yaml"),
            "tasks:\n  a-b: {daily_limit: 1}\n  c: {daily_limit: 1, prompt_file: prompts/other.md}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("cfg/prompts/todoist-auto-a_b.md"), "do a").unwrap();
        std::fs::write(dir.path().join("cfg/prompts/other.md"), "do c").unwrap();
        let mut spec = PlanSpec {
            limits_file: Some("cfg/limits.yaml".into()),
            limits: None,
            counters: None,
            max_per_run: None,
            tasks: None,
            date: None,
            utc_offset: None,
        };
        spec.load(dir.path()).unwrap();
        let l = spec.limits.as_ref().unwrap();
        assert_eq!(l.tasks[0].prompt.as_deref(), Some("do a"));
        assert_eq!(
            l.tasks[0].prompt_file.as_deref(),
            Some("prompts/todoist-auto-a_b.md")
        );
        assert_eq!(l.tasks[1].prompt.as_deref(), Some("do c"));
        std::fs::remove_file(dir.path().join("cfg/prompts/other.md")).unwrap();
        spec.limits = None;
        let (field, e) = spec.load(dir.path()).unwrap_err();
        assert_eq!(field, "limits_file");
        assert!(e.contains("task `c`") && e.contains("other.md"), "{e}");
    }

    #[test]
    fn offsets_and_dates() {
        assert_eq!(parse_offset("+08:00").unwrap().whole_hours(), 8);
        assert!(parse_offset("8").is_err());
        assert!(check_date("2026-02-28").is_ok());
        assert!(check_date("2026-02-30").is_err());
        assert!(check_date("yesterday").is_err());
        assert_eq!(today(time::UtcOffset::UTC).len(), 10);
    }
}
