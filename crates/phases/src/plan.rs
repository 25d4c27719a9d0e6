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

use pathguard::SafePath;

use crate::inputs::{self, GraphFiles};

pub use cairn_graph::plan::*;

/// Submit time: the limits file and prompt files (a prompt file relative to the limits file's
/// directory). Err = (field, message).
pub async fn load<F: GraphFiles>(spec: &mut PlanSpec, files: &F) -> Result<(), (String, String)> {
    let (mut limits, dir) = match (&spec.limits, &spec.limits_file) {
        (Some(l), _) => (l.clone(), None),
        (None, Some(file)) => {
            let err = |m| ("limits_file".to_owned(), m);
            let path = inputs::resolve(None, file).map_err(err)?;
            let text = files.read(&path).await.map_err(err)?;
            let limits = Limits::parse(&text).map_err(|m| err(format!("{file}: {m}")))?;
            (limits, path.parent())
        }
        (None, None) => return Ok(()),
    };
    let field = if spec.limits.is_some() {
        "limits"
    } else {
        "limits_file"
    };
    limits.normalise().map_err(|m| (field.to_owned(), m))?;
    load_prompts(&mut limits, dir.as_ref(), files)
        .await
        .map_err(|(key, m)| match spec.limits {
            // An inline task names its own prompt file; a limits file's tasks are in that file.
            Some(_) => (format!("limits.tasks.{key}.prompt_file"), m),
            None => (field.to_owned(), m),
        })?;
    spec.limits = Some(limits);
    Ok(())
}

/// Loads every task's prompt file (relative to `dir`) that is not loaded yet. Err = (task
/// key, message).
async fn load_prompts<F: GraphFiles>(
    limits: &mut Limits,
    dir: Option<&SafePath>,
    files: &F,
) -> Result<(), (String, String)> {
    for t in &mut limits.tasks {
        if t.prompt.is_some() {
            continue;
        }
        let file = t
            .prompt_file
            .clone()
            .unwrap_or_else(|| format!("prompts/todoist-auto-{}.md", t.key));
        let err = |e| (t.key.clone(), format!("task `{}`: {e}", t.key));
        let path = inputs::resolve(dir, &file).map_err(err)?;
        let text = files.read(&path).await.map_err(err)?;
        t.prompt_file = Some(file);
        t.prompt = Some(text);
    }
    Ok(())
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
                result: None,
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

    #[tokio::test]
    async fn prompt_files_load_relative_to_the_limits_file() {
        let mut files = crate::inputs::Mem(
            [
                (
                    "cfg/limits.yaml",
                    "tasks:\n  a-b: {daily_limit: 1}\n  c: {daily_limit: 1, prompt_file: prompts/other.md}\n",
                ),
                ("cfg/prompts/todoist-auto-a_b.md", "do a"),
                ("cfg/prompts/other.md", "do c"),
            ]
            .into(),
        );
        let mut spec = PlanSpec {
            agent: None,
            limits_file: Some("cfg/limits.yaml".into()),
            limits: None,
            counters: None,
            max_per_run: None,
            tasks: None,
            date: None,
            utc_offset: None,
        };
        load(&mut spec, &files).await.unwrap();
        let l = spec.limits.as_ref().unwrap();
        assert_eq!(l.tasks[0].prompt.as_deref(), Some("do a"));
        assert_eq!(
            l.tasks[0].prompt_file.as_deref(),
            Some("prompts/todoist-auto-a_b.md")
        );
        assert_eq!(l.tasks[1].prompt.as_deref(), Some("do c"));
        files.0.remove("cfg/prompts/other.md");
        spec.limits = None;
        let (field, e) = load(&mut spec, &files).await.unwrap_err();
        assert_eq!(field, "limits_file");
        assert!(e.contains("task `c`") && e.contains("other.md"), "{e}");
        // Out of the graph's files: refused before anything is read.
        for bad in ["../x.md", "/etc/passwd"] {
            let mut spec = spec.clone();
            spec.limits = Some(
                Limits::parse(&format!(
                    "tasks:\n  t: {{daily_limit: 1, prompt_file: \"{bad}\"}}\n"
                ))
                .unwrap(),
            );
            let (field, e) = load(&mut spec, &files).await.unwrap_err();
            assert_eq!(field, "limits.tasks.t.prompt_file", "{bad}");
            assert!(e.contains("task `t`"), "{e}");
        }
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
