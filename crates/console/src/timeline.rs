//! The run's timeline from its events: per node every attempt as a bar (node.started to its
//! node.completed / failed / skipped / canceled), attempts and retries, drawn as a Gantt strip
//! (server-rendered SVG) and listed in a table; the critical path (the chain of needs that
//! finished last, ending with the node that finished last) is marked in both.

use std::collections::HashMap;

use cairn_proto::v1::Event;
use maud::{html, Markup};
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::dag::GraphNode;

/// One attempt of a node.
pub(super) struct Span {
    pub start: OffsetDateTime,
    pub start_ts: String,
    /// None while it runs.
    pub end: Option<(OffsetDateTime, String)>,
    /// completed | failed | skipped | canceled | running
    pub outcome: &'static str,
    /// Waiting for a person (a gate's attempt), not work.
    pub wait: bool,
}

impl Span {
    /// How long it took (until `now` while it runs).
    pub fn took(&self, now: OffsetDateTime) -> time::Duration {
        self.end.as_ref().map_or(now, |(t, _)| *t) - self.start
    }
}

/// A node's row of the timeline.
pub(super) struct Row {
    pub id: String,
    pub spans: Vec<Span>,
    pub attempts: u32,
    pub retries: u32,
    pub critical: bool,
}

impl Row {
    fn first_start(&self) -> Option<&Span> {
        self.spans.first()
    }

    /// Time spent working (`wait` false) or waiting (`wait` true), summed over attempts.
    pub fn total(&self, wait: bool, now: OffsetDateTime) -> time::Duration {
        self.spans
            .iter()
            .filter(|s| s.wait == wait)
            .map(|s| s.took(now))
            .sum()
    }

    fn last_end(&self) -> Option<(OffsetDateTime, &str)> {
        self.spans
            .iter()
            .filter_map(|s| s.end.as_ref().map(|(t, ts)| (*t, ts.as_str())))
            .max_by_key(|(t, _)| *t)
    }
}

fn parse(ts: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(ts, &Rfc3339).ok()
}

/// The timeline's rows, in the graph's order, from the events.
pub(super) fn rows(nodes: &[GraphNode], events: &[Event]) -> Vec<Row> {
    let mut rows: Vec<Row> = nodes
        .iter()
        .map(|n| Row {
            id: n.id.clone(),
            spans: Vec::new(),
            attempts: 0,
            retries: 0,
            critical: false,
        })
        .collect();
    let waits: Vec<bool> = nodes.iter().map(|n| n.kind == "gate").collect();
    let index: HashMap<String, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.clone(), i))
        .collect();
    for e in events {
        let Some(&i) = index.get(&e.node_id) else {
            continue;
        };
        let Some(t) = parse(&e.ts) else { continue };
        let row = &mut rows[i];
        let outcome = match e.r#type.as_str() {
            "node.started" => {
                row.attempts += 1;
                row.spans.push(Span {
                    start: t,
                    start_ts: e.ts.clone(),
                    end: None,
                    outcome: "running",
                    wait: waits[i],
                });
                continue;
            }
            "node.completed" => "completed",
            "node.failed" => {
                let d: Value = serde_json::from_str(&e.data_json).unwrap_or_default();
                if d.get("will_retry").and_then(Value::as_bool) == Some(true) {
                    row.retries += 1;
                }
                "failed"
            }
            "node.skipped" => "skipped",
            "node.canceled" => "canceled",
            _ => continue,
        };
        match row.spans.last_mut() {
            Some(s) if s.end.is_none() => {
                s.end = Some((t, e.ts.clone()));
                s.outcome = outcome;
            }
            // Skipped (or canceled) without having started: a point in time.
            _ => row.spans.push(Span {
                start: t,
                start_ts: e.ts.clone(),
                end: Some((t, e.ts.clone())),
                outcome,
                wait: waits[i],
            }),
        }
    }
    mark_critical(nodes, &mut rows);
    rows
}

/// Marks the critical path: from the node that finished last, back through the need of each
/// that finished last.
fn mark_critical(nodes: &[GraphNode], rows: &mut [Row]) {
    let end_of = |rows: &[Row], i: usize| rows[i].last_end().map(|(t, _)| t);
    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id.as_str(), i))
        .collect();
    let Some(mut at) = (0..rows.len())
        .filter(|&i| end_of(rows, i).is_some())
        .max_by_key(|&i| end_of(rows, i))
    else {
        return;
    };
    // At most one step per node: a cycle (never in a validated graph) cannot loop.
    for _ in 0..rows.len() {
        rows[at].critical = true;
        let next = nodes[at]
            .needs
            .iter()
            .filter_map(|n| index.get(n.as_str()).copied())
            .filter(|&j| !rows[j].critical && end_of(rows, j).is_some())
            .max_by_key(|&j| end_of(rows, j));
        match next {
            Some(j) => at = j,
            None => break,
        }
    }
}

/// `850 ms`, `2.4 s`, `3m 05s`, `1h 02m`.
pub(super) fn span_text(d: time::Duration) -> String {
    let ms = d.whole_milliseconds().max(0);
    match ms {
        m if m < 1000 => format!("{m} ms"),
        m if m < 60_000 => format!("{:.1} s", m as f64 / 1000.0),
        m if m < 3_600_000 => format!("{}m {:02}s", m / 60_000, (m / 1000) % 60),
        m => format!("{}h {:02}m", m / 3_600_000, (m / 60_000) % 60),
    }
}

/// An outcome as a class of the stylesheet (fixed set); a wait at a gate has its own.
fn bar_class(outcome: &str, critical: bool, wait: bool) -> &'static str {
    if wait {
        return if outcome == "running" {
            "bar wait st-blocked"
        } else {
            "bar wait"
        };
    }
    match (outcome, critical) {
        ("completed", false) => "bar st-succeeded",
        ("completed", true) => "bar st-succeeded critical",
        ("failed", false) => "bar st-failed",
        ("failed", true) => "bar st-failed critical",
        ("skipped", _) => "bar st-skipped",
        ("canceled", _) => "bar st-canceled",
        (_, false) => "bar st-running",
        (_, true) => "bar st-running critical",
    }
}

const LABEL_W: f64 = 170.0;
const CHART_W: f64 = 760.0;
const BAR_H: f64 = 16.0;
const ROW_H: f64 = 24.0;

/// The Gantt strip and the table. `now`: where running attempts end (the run's last update
/// when it is over).
pub(super) fn render(rows: &[Row], now: OffsetDateTime) -> Markup {
    let starts = rows.iter().flat_map(|r| r.spans.iter().map(|s| s.start));
    let Some(t0) = starts.min() else {
        return html! { p.hint #timeline-none { "No node has started yet." } };
    };
    let t1 = rows
        .iter()
        .flat_map(|r| {
            r.spans
                .iter()
                .map(|s| s.end.as_ref().map_or(now, |(t, _)| *t))
        })
        .max()
        .unwrap_or(now)
        .max(t0);
    let total = (t1 - t0).as_seconds_f64().max(0.001);
    let x =
        |t: OffsetDateTime| LABEL_W + ((t - t0).as_seconds_f64() / total).clamp(0.0, 1.0) * CHART_W;
    let height = ROW_H * rows.len() as f64 + 28.0;
    let width = LABEL_W + CHART_W + 10.0;
    let critical: Vec<&str> = rows
        .iter()
        .filter(|r| r.critical)
        .map(|r| r.id.as_str())
        .collect();
    // The critical path's work (its attempts, not the time between them) and its waits.
    let on_path = || rows.iter().filter(|r| r.critical);
    let work: time::Duration = on_path().map(|r| r.total(false, now)).sum();
    let waiting: time::Duration = on_path().map(|r| r.total(true, now)).sum();
    html! {
        @if !critical.is_empty() {
            p #critical-path {
                "Critical path: " strong { (critical.join(" → ")) } " · work " span #critical-work { (span_text(work)) }
                @if waiting > time::Duration::ZERO { " · waiting at gates " span #critical-wait { (span_text(waiting)) } }
            }
        }
        svg id="gantt" class="gantt" xmlns="http://www.w3.org/2000/svg" role="img" aria-label="When each node ran"
            width=(width) height=(height) viewBox=(format!("0 0 {width} {height}")) {
            @for q in 0..=4 {
                @let gx = LABEL_W + CHART_W * q as f64 / 4.0;
                line.grid x1=(gx) y1="0" x2=(gx) y2=(height - 16.0) {}
                text.axis x=(gx) y=(height - 4.0) text-anchor=(if q == 4 { "end" } else if q == 0 { "start" } else { "middle" }) {
                    (span_text(time::Duration::seconds_f64(total * q as f64 / 4.0)))
                }
            }
            @for (i, r) in rows.iter().enumerate() {
                @let y = ROW_H * i as f64 + 4.0;
                g class=(if r.critical { "lane critical" } else { "lane" }) data-node=(r.id) {
                    text.label x="4" y=(y + BAR_H - 3.0) { (r.id) }
                    @for (a, s) in r.spans.iter().enumerate() {
                        @let x1 = x(s.start);
                        @let x2 = x(s.end.as_ref().map_or(now, |(t, _)| *t));
                        rect class=(bar_class(s.outcome, r.critical, s.wait)) data-attempt=(a + 1) x=(x1) y=(y) width=((x2 - x1).max(2.0)) height=(BAR_H) rx="3" {
                            title { (r.id) " attempt " (a + 1) ": " @if s.wait { "waiting, " } (s.outcome) " · " (span_text(s.took(now))) }
                        }
                    }
                }
            }
        }
        table.timeline #timeline-table {
            thead { tr { th { "node" } th { "start" } th { "end" } th.num { "work" } th.num { "waiting" } th.num { "attempts" } th.num { "retries" } th { "critical" } } }
            tbody {
                @for r in rows {
                    @let start = r.first_start();
                    @let end = r.last_end();
                    @let running = r.spans.last().is_some_and(|s| s.end.is_none());
                    tr id=(format!("tl-{}", r.id)) class=(if r.critical { "critical" } else { "" })
                        data-node=(r.id) data-start=(start.map(|s| s.start_ts.as_str()).unwrap_or(""))
                        data-end=(if running { "" } else { end.map(|(_, ts)| ts).unwrap_or("") })
                        data-attempts=(r.attempts) data-retries=(r.retries) {
                        td data-label="node" { code { (r.id) } }
                        td.nowrap data-label="start" { (start.map(|s| time_of(&s.start_ts)).unwrap_or_default()) }
                        td.nowrap data-label="end" { @if running { "running" } @else { (end.map(|(_, ts)| time_of(ts)).unwrap_or_default()) } }
                        td.num data-label="work" { @if start.is_some() { (span_text(r.total(false, now))) } }
                        td.num data-label="waiting" { @if r.spans.iter().any(|s| s.wait) { (span_text(r.total(true, now))) } }
                        td.num data-label="attempts" { (r.attempts) }
                        td.num data-label="retries" { (r.retries) }
                        td data-label="critical" { @if r.critical { "yes" } }
                    }
                }
            }
        }
    }
}

/// The time of day of an RFC 3339 timestamp, with milliseconds.
fn time_of(ts: &str) -> String {
    ts.get(11..23)
        .unwrap_or(ts)
        .trim_end_matches('Z')
        .to_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn node(id: &str, kind: &str, needs: &[&str]) -> GraphNode {
        GraphNode {
            id: id.into(),
            kind: kind.into(),
            needs: needs.iter().map(|s| (*s).to_owned()).collect(),
            then: Vec::new(),
            otherwise: Vec::new(),
        }
    }

    fn ev(kind: &str, node: &str, ts: &str) -> Event {
        Event {
            r#type: kind.into(),
            node_id: node.into(),
            ts: format!("2026-01-01T00:{ts}Z"),
            data_json: "{}".into(),
            ..Default::default()
        }
    }

    /// A draft reworked after a gate approved it: each attempt is a bar of its own, the work
    /// is the attempts' time summed (not the span from the first start to the last end),
    /// and the gate's attempts are waiting, never work.
    #[test]
    fn attempts_are_bars_of_their_own_and_work_leaves_waiting_out() {
        let nodes = [
            node("draft", "write_file", &[]),
            node("review", "gate", &["draft"]),
        ];
        let events = [
            ev("node.started", "draft", "00:00"),
            ev("node.completed", "draft", "00:01"),
            ev("node.started", "review", "00:01"),
            ev("node.completed", "review", "01:01"),
            ev("node.started", "draft", "02:00"),
            ev("node.completed", "draft", "02:02"),
            ev("node.started", "review", "02:02"),
            ev("node.completed", "review", "02:32"),
        ];
        let rows = rows(&nodes, &events);
        let now = OffsetDateTime::now_utc();
        let (draft, review) = (&rows[0], &rows[1]);
        assert_eq!((draft.spans.len(), draft.attempts), (2, 2));
        assert_eq!(draft.total(false, now), time::Duration::seconds(3));
        assert_eq!(draft.total(true, now), time::Duration::ZERO);
        assert!(review.spans.iter().all(|s| s.wait));
        assert_eq!(review.total(false, now), time::Duration::ZERO);
        assert_eq!(review.total(true, now), time::Duration::seconds(90));
        // The review finished last; the critical path goes back through the draft.
        assert!(review.critical && draft.critical);
    }
}
