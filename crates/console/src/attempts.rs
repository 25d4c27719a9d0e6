//! Two attempts of one node compared (after a rework, a retry or a resume), on the node's
//! panel: its outputs and its events in each attempt, as unified line diffs. Times, sequence
//! numbers and other values of one life are left out, as in a comparison of two runs.

use std::collections::BTreeMap;

use cairn_proto::v1::Event;
use maud::{html, Markup};
use serde_json::Value;
use similar::TextDiff;

use super::diff;
use super::history;

/// Fields that differ between two attempts that did the same thing.
const VOLATILE: &[&str] = &[
    "ts",
    "seq",
    "attempt",
    "elapsed_ms",
    "duration_ms",
    "retry_in_ms",
    "request_id",
    "redelivery",
    "runner",
    "runner_id",
    "decided_at",
    "traceparent",
    "started_at",
    "finished_at",
];

/// What one attempt did: its outputs (the last `node.completed` / `node.failed`) and its
/// events, each as a line of stable JSON.
#[derive(Default)]
struct Attempt {
    outputs: Value,
    events: Vec<String>,
}

fn stable(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| !VOLATILE.contains(&k.as_str()))
                .map(|(k, x)| (k, stable(x)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(stable).collect()),
        other => other,
    }
}

/// The attempts of `node`, by number: an attempt starts at its `node.started` (numbered by
/// its `attempt`, else one more than the last); events before the first start belong to 1.
fn attempts(node: &str, events: &[Event]) -> BTreeMap<u32, Attempt> {
    let mut out: BTreeMap<u32, Attempt> = BTreeMap::new();
    let mut current = 0u32;
    for e in events.iter().filter(|e| e.node_id == node) {
        let d = history::data(e);
        if e.r#type == "node.started" {
            current = d
                .get("attempt")
                .and_then(Value::as_u64)
                .and_then(|a| u32::try_from(a).ok())
                .filter(|a| *a > current)
                .unwrap_or(current + 1);
        }
        let a = out.entry(current.max(1)).or_default();
        if matches!(e.r#type.as_str(), "node.completed" | "node.failed") {
            a.outputs = stable(d.get("outputs").cloned().unwrap_or(Value::Null));
        }
        a.events
            .push(format!("{} {}", e.r#type, stable(d)).trim_end().to_owned());
    }
    out
}

/// The pair asked for (`?attempts=A,B`), else the last two; None with fewer than two.
pub(super) fn pick(
    asked: &str,
    node: &str,
    events: &[Event],
) -> Result<Option<(u32, u32)>, String> {
    let all = attempts(node, events);
    let numbers: Vec<u32> = all.keys().copied().collect();
    if asked.trim().is_empty() {
        return Ok(match numbers.as_slice() {
            [.., a, b] => Some((*a, *b)),
            _ => None,
        });
    }
    let parsed: Vec<u32> = asked
        .split(',')
        .map(|x| x.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("attempts `{asked}`: name two attempts like 1,2"))?;
    match parsed.as_slice() {
        [a, b] if a != b && all.contains_key(a) && all.contains_key(b) => Ok(Some((*a, *b))),
        _ => Err(format!(
            "attempts `{asked}`: name two different attempts of `{node}` (it has {})",
            if numbers.is_empty() {
                "none".to_owned()
            } else {
                numbers
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )),
    }
}

/// Links to each pair of consecutive attempts, and the diff of `(a, b)`.
pub(super) fn section(node: &str, here: &str, events: &[Event], (a, b): (u32, u32)) -> Markup {
    let all = attempts(node, events);
    let empty = Attempt::default();
    let (xa, xb) = (all.get(&a).unwrap_or(&empty), all.get(&b).unwrap_or(&empty));
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
    let (oa, ob) = (pretty(&xa.outputs), pretty(&xb.outputs));
    let lines = |x: &Attempt| x.events.join("\n") + "\n";
    let (ea, eb) = (lines(xa), lines(xb));
    let numbers: Vec<u32> = all.keys().copied().collect();
    html! {
        section #attempts-compared {
            h2 { "Attempt " (b) " against attempt " (a) }
            nav.states aria-label="Attempts compared" {
                @for w in numbers.windows(2).rev() {
                    a href=(format!("{here}?attempts={},{}#attempts-compared", w[0], w[1])) { "attempt " (w[1]) " vs " (w[0]) } " "
                }
            }
            h3 { "Outputs" }
            (diff_or_same("attempt-outputs-diff", &oa, &ob, "The outputs are the same."))
            h3 { "Events" }
            (diff_or_same("attempt-events-diff", &ea, &eb, "The same events, times and sequence numbers apart."))
        }
    }
}

fn diff_or_same(id: &str, old: &str, new: &str, same: &str) -> Markup {
    let d = TextDiff::configure()
        .timeout(std::time::Duration::from_secs(2))
        .diff_lines(old, new);
    let (hunks, _, _) = diff::hunks(&d);
    html! {
        @if hunks.is_empty() {
            p.hint id=(format!("{id}-same")) { (same) }
        } @else {
            div.scroll tabindex="0" role="region" aria-label=(id.replace('-', " ")) { (diff::table(id, &hunks)) }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ev(kind: &str, node: &str, data: &str) -> Event {
        Event {
            r#type: kind.into(),
            node_id: node.into(),
            data_json: data.into(),
            ..Default::default()
        }
    }

    #[test]
    fn attempts_are_told_apart_by_their_starts_and_compared_without_times() {
        let events = [
            ev("node.started", "n", r#"{"attempt": 1, "ts": "a"}"#),
            ev(
                "node.completed",
                "n",
                r#"{"outputs": {"x": 1}, "duration_ms": 5}"#,
            ),
            ev("node.started", "other", "{}"),
            ev("node.started", "n", r#"{"attempt": 2, "ts": "b"}"#),
            ev(
                "node.completed",
                "n",
                r#"{"outputs": {"x": 2}, "duration_ms": 9}"#,
            ),
        ];
        let all = attempts("n", &events);
        assert_eq!(all.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(all[&1].outputs, serde_json::json!({"x": 1}));
        assert_eq!(all[&1].events[0], "node.started {}");
        assert_eq!(pick("", "n", &events), Ok(Some((1, 2))));
        assert_eq!(pick("2,1", "n", &events), Ok(Some((2, 1))));
        assert!(pick("1,3", "n", &events)
            .unwrap_err()
            .contains("it has 1, 2"));
        assert!(pick("x", "n", &events).is_err());
        assert_eq!(pick("", "other", &events), Ok(None));
    }
}
