//! What a rework changed: an agent's answer of one turn against its previous turn
//! (`agents/<instance>/artifacts/turn-<n>.md` of the run directory), as a unified line diff
//! with line numbers and a few lines of context around each change.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use cairn_proto::v1::{EntryKind, FileInfo};
use maud::{html, Markup};
use serde::Deserialize;
use similar::{ChangeTag, TextDiff};

use super::files;
use super::page::{self, layout};
use super::run::run_dir;
use super::session::Visitor;
use super::{Console, ConsoleError};

/// Largest turn compared (each side).
const TURN_LIMIT: u64 = 1 << 20;
/// Lines of context around each change.
const CONTEXT: usize = 3;
/// Time the diff algorithm may take before it settles for a coarser answer.
const DIFF_TIME: Duration = Duration::from_secs(2);
/// Files of a run's agents/ directory looked through for turns.
const LISTED: u32 = 5000;

/// The turns recorded for each agent instance of a run, in order.
pub(super) type Turns = BTreeMap<String, Vec<u32>>;

/// `agents/<instance>/artifacts/turn-<n>.md` under `dir` → (instance, n).
fn turn_of<'a>(dir: &str, path: &'a str) -> Option<(&'a str, u32)> {
    let rest = path.strip_prefix(dir)?.strip_prefix("/agents/")?;
    let (instance, file) = rest.split_once("/artifacts/")?;
    let n = file.strip_prefix("turn-")?.strip_suffix(".md")?;
    if instance.contains('/') || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((instance, n.parse().ok()?))
}

pub(super) fn turns_in(dir: &str, entries: &[FileInfo]) -> Turns {
    let mut turns = Turns::new();
    for e in entries.iter().filter(|e| e.kind == EntryKind::File as i32) {
        if let Some((instance, n)) = turn_of(dir, &e.path) {
            turns.entry(instance.to_owned()).or_default().push(n);
        }
    }
    for v in turns.values_mut() {
        v.sort_unstable();
        v.dedup();
    }
    turns
}

/// The turns of every agent of the run (empty when they cannot be listed).
pub(super) async fn turns(console: &Console, project: &str, dir: &str) -> Turns {
    match files::list(console, project, &format!("{dir}/agents"), true, LISTED, "").await {
        Ok((entries, _)) => turns_in(dir, &entries),
        Err(_) => Turns::new(),
    }
}

/// Links to the diffs of an agent that answered more than once.
pub(super) fn links(project: &str, run: &str, instance: &str, turns: &[u32]) -> Markup {
    html! {
        @if turns.len() > 1 {
            @for w in turns.windows(2).rev() {
                a.turn-diff href=(diff_url(project, run, instance, w[1])) { "turn " (w[1]) " vs " (w[0]) } " "
            }
        } @else if turns.len() == 1 {
            span.hint { "1 turn" }
        }
    }
}

pub(super) fn diff_url(project: &str, run: &str, instance: &str, turn: u32) -> String {
    format!(
        "{}/agents/{}/diff?turn={turn}",
        page::run_url(project, run),
        page::seg(instance)
    )
}

#[derive(Deserialize)]
pub(super) struct DiffQuery {
    /// The later turn (default: the latest).
    #[serde(default)]
    turn: Option<u32>,
}

/// One line of the diff as shown.
pub(super) struct Line<'a> {
    tag: ChangeTag,
    old: Option<usize>,
    new: Option<usize>,
    text: &'a str,
}

/// Hunks of changed lines with their context; (added, removed) counts.
pub(super) fn hunks<'a>(diff: &'a TextDiff<'a, 'a, 'a, str>) -> (Vec<Vec<Line<'a>>>, usize, usize) {
    let (mut added, mut removed) = (0, 0);
    let hunks = diff
        .grouped_ops(CONTEXT)
        .iter()
        .map(|group| {
            group
                .iter()
                .flat_map(|op| diff.iter_changes(op))
                .map(|c| {
                    match c.tag() {
                        ChangeTag::Insert => added += 1,
                        ChangeTag::Delete => removed += 1,
                        ChangeTag::Equal => {}
                    }
                    Line {
                        tag: c.tag(),
                        old: c.old_index().map(|i| i + 1),
                        new: c.new_index().map(|i| i + 1),
                        text: c.value().trim_end_matches(['\n', '\r']),
                    }
                })
                .collect()
        })
        .collect();
    (hunks, added, removed)
}

/// A unified diff as text (`---`/`+++` header, `@@ -a,b +c,d @@` hunks) back into hunks of
/// numbered lines, at most `max_lines` lines; also how many lines were left out. Lines that
/// are neither context nor change (`\ No newline at end of file`) are dropped.
pub(super) fn parse_unified(text: &str, max_lines: usize) -> (Vec<Vec<Line<'_>>>, usize) {
    let mut hunks: Vec<Vec<Line<'_>>> = Vec::new();
    let (mut old, mut new) = (0usize, 0usize);
    let (mut shown, mut left_out) = (0usize, 0usize);
    for raw in text.lines() {
        // The file names above the first hunk.
        if hunks.is_empty() && (raw.starts_with("--- ") || raw.starts_with("+++ ")) {
            continue;
        }
        if let Some(rest) = raw.strip_prefix("@@ -") {
            // "a,b +c,d @@ ..." (a count may be missing: one line).
            let mut parts = rest.split_whitespace();
            let start = |p: Option<&str>| {
                p.and_then(|x| x.trim_start_matches('+').split(',').next())
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(1)
            };
            old = start(parts.next());
            new = start(parts.next());
            hunks.push(Vec::new());
            continue;
        }
        let Some(hunk) = hunks.last_mut() else {
            continue;
        };
        let (tag, body) = match raw.chars().next() {
            Some('+') => (ChangeTag::Insert, &raw[1..]),
            Some('-') => (ChangeTag::Delete, &raw[1..]),
            Some(' ') => (ChangeTag::Equal, &raw[1..]),
            None => (ChangeTag::Equal, ""),
            Some(_) => continue,
        };
        let line = Line {
            tag,
            old: (tag != ChangeTag::Insert).then_some(old),
            new: (tag != ChangeTag::Delete).then_some(new),
            text: body.trim_end_matches('\r'),
        };
        if tag != ChangeTag::Insert {
            old += 1;
        }
        if tag != ChangeTag::Delete {
            new += 1;
        }
        if shown < max_lines {
            hunk.push(line);
            shown += 1;
        } else {
            left_out += 1;
        }
    }
    hunks.retain(|h| !h.is_empty());
    (hunks, left_out)
}

/// Hunks as a table with both line numbers (`id`: the table's id).
pub(super) fn table(id: &str, hunks: &[Vec<Line<'_>>]) -> Markup {
    html! {
        table.diff id=(id) {
            thead { tr { th.num { "old" } th.num { "new" } th { span.visually-hidden { "change" } } th { "line" } } }
            @for (i, h) in hunks.iter().enumerate() {
                tbody.hunk {
                    @if i > 0 { tr.gap { td colspan="4" { "⋯" } } }
                    @for l in h {
                        @let (class, sign) = match l.tag {
                            ChangeTag::Insert => ("add", "+"),
                            ChangeTag::Delete => ("del", "−"),
                            ChangeTag::Equal => ("same", " "),
                        };
                        tr class=(class) {
                            td.num { (l.old.map(|n| n.to_string()).unwrap_or_default()) }
                            td.num { (l.new.map(|n| n.to_string()).unwrap_or_default()) }
                            td.sign { (sign) }
                            td.text { (l.text) }
                        }
                    }
                }
            }
        }
    }
}

async fn read_turn(console: &Console, project: &str, path: &str) -> Result<String, ConsoleError> {
    let r = files::read(console, project, path, TURN_LIMIT)
        .await?
        .ok_or_else(|| ConsoleError::NotFound(format!("{path} is gone")))?;
    if r.truncated {
        return Err(ConsoleError::BadRequest(format!(
            "{path} is larger than {}; download it to compare",
            page::size(TURN_LIMIT)
        )));
    }
    r.text()
        .map(str::to_owned)
        .ok_or_else(|| ConsoleError::BadRequest(format!("{path} is not text")))
}

pub(super) async fn view(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path((project, run, instance)): Path<(String, String, String)>,
    Query(q): Query<DiffQuery>,
) -> Result<Response, ConsoleError> {
    let dir = run_dir(None, &run);
    let all = turns(&console, &project, &dir).await;
    let Some(list) = all.get(&instance) else {
        return Err(ConsoleError::NotFound(format!(
            "run {run} has no answers of an agent `{instance}`"
        )));
    };
    let turn = q.turn.or_else(|| list.last().copied()).unwrap_or_default();
    if !list.contains(&turn) {
        return Err(ConsoleError::NotFound(format!(
            "agent `{instance}` of run {run} has no turn {turn} (turns: {})",
            list.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let earlier = list.iter().copied().filter(|t| *t < turn).max();
    let path_of = |t: u32| format!("{dir}/agents/{instance}/artifacts/turn-{t}.md");
    let new_text = read_turn(&console, &project, &path_of(turn)).await?;
    let old_text = match earlier {
        Some(t) => Some(read_turn(&console, &project, &path_of(t)).await?),
        None => None,
    };
    let run_url = page::run_url(&project, &run);
    let title = format!("{instance}: turn {turn}");
    let body = html! {
        h1 { "Agent " code { (instance) } ", turn " (turn) }
        p.meta {
            "run " a href=(run_url) { code { (run) } } " · "
            a href=(page::file_url(&project, &path_of(turn))) { "turn " (turn) " as written" }
            @if let Some(t) = earlier {
                " · " a href=(page::file_url(&project, &path_of(t))) { "turn " (t) }
            }
        }
        nav.states aria-label="Turns" { (links(&project, &run, &instance, list)) }
        @match (&old_text, earlier) {
            (Some(old), Some(t)) => {
                @let diff = TextDiff::configure().timeout(DIFF_TIME).diff_lines(old.as_str(), new_text.as_str());
                @let (parts, added, removed) = hunks(&diff);
                h2 #diff-summary { "Turn " (turn) " against turn " (t) ": "
                    span.added { "+" (added) } " " span.removed { "−" (removed) } " lines" }
                @if parts.is_empty() {
                    p.hint #no-change { "The two turns are the same, line for line." }
                } @else {
                    div.scroll { (table("turn-diff", &parts)) }
                }
            }
            _ => {
                p.hint #no-earlier { "This is the agent's first turn: there is nothing earlier to compare with." }
                pre.code { (new_text) }
            }
        }
    };
    Ok(layout(&title, Some(&visitor), None, body).into_response())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn file(path: &str) -> FileInfo {
        FileInfo {
            path: path.into(),
            kind: EntryKind::File as i32,
            ..Default::default()
        }
    }

    #[test]
    fn turns_are_found_per_agent_in_number_order() {
        let dir = ".cairn/runs/r1";
        let entries = [
            file(".cairn/runs/r1/agents/author/artifacts/turn-10.md"),
            file(".cairn/runs/r1/agents/author/artifacts/turn-2.md"),
            file(".cairn/runs/r1/agents/author/artifacts/turn-1.md"),
            file(".cairn/runs/r1/agents/author/session.json"),
            file(".cairn/runs/r1/agents/ext/artifacts/turn-1-attempt-1.md"),
            file(".cairn/runs/r1/agents/a/b/artifacts/turn-1.md"),
            file(".cairn/runs/r2/agents/other/artifacts/turn-1.md"),
        ];
        let t = turns_in(dir, &entries);
        assert_eq!(t.len(), 1, "{t:?}");
        assert_eq!(t["author"], vec![1, 2, 10]);
    }

    #[test]
    fn a_changed_line_is_one_removal_and_one_addition_with_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n";
        let new = "a\nb\nc\nd\ne\nF\ng\nh\ni\nj\nk\n";
        let diff = TextDiff::configure().diff_lines(old, new);
        let (h, added, removed) = hunks(&diff);
        assert_eq!((added, removed), (2, 1));
        assert_eq!(h.len(), 1, "changes 5 lines apart share a hunk");
        let del = h[0].iter().find(|l| l.tag == ChangeTag::Delete).unwrap();
        assert_eq!((del.old, del.new, del.text), (Some(6), None, "f"));
        let first = &h[0][0];
        assert_eq!(
            (first.old, first.text),
            (Some(3), "c"),
            "3 lines of context"
        );
        let same = TextDiff::configure().diff_lines(old, old);
        assert!(hunks(&same).0.is_empty());
    }

    #[test]
    fn a_unified_diff_is_read_back_with_line_numbers() {
        let text = "--- a/x\n+++ b/x\n@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n\\ No newline at end of file\n@@ -10 +10,2 @@\n j\n+k\n";
        let (hunks, left_out) = parse_unified(text, 100);
        assert_eq!((hunks.len(), left_out), (2, 0));
        let del = &hunks[0][1];
        assert_eq!((del.old, del.new, del.text), (Some(3), None, "c"));
        let add = &hunks[0][2];
        assert_eq!((add.old, add.new, add.text), (None, Some(3), "C"));
        let k = &hunks[1][1];
        assert_eq!((k.old, k.new, k.text), (None, Some(11), "k"));
        let (cut, left_out) = parse_unified(text, 3);
        assert_eq!((cut.iter().map(Vec::len).sum::<usize>(), left_out), (3, 3));
    }
}
