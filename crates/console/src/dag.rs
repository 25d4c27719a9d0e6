//! The run's graph as a server-rendered SVG: nodes in columns by depth, edges from each need,
//! condition branches labelled `then` / `else`, a map drawn once with its item counts, each
//! node coloured by its state and linking to its row of the milestones table. The graph comes
//! from the run's `graph.resolved.json`, the states from GetRun. The SVG holds no script and no
//! style attribute: colours are classes of the console's stylesheet, chosen from a fixed set.
//! Every SVG element is closed explicitly (`{}`): in an HTML page `<rect>` is not a void
//! element, and an unclosed one would swallow what follows it.

use std::collections::{BTreeMap, HashMap};

use cairn_proto::v1::{Event, RunInfo};
use maud::{html, Markup};
use serde_json::Value;

use super::page;

/// One node of the graph as the page draws it.
pub(super) struct GraphNode {
    pub id: String,
    pub kind: String,
    /// Everything it waits for (explicit needs, references, condition branches).
    pub needs: Vec<String>,
    /// A condition's branches.
    pub then: Vec<String>,
    pub otherwise: Vec<String>,
}

/// The nodes of `graph.resolved.json` (ids, types, needs, branches); an error says why not.
pub(super) fn parse_graph(text: &str) -> Result<Vec<GraphNode>, String> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| format!("graph.resolved.json is not JSON: {e}"))?;
    let nodes = v
        .get("nodes")
        .and_then(Value::as_array)
        .ok_or("graph.resolved.json has no node list")?;
    let strings = |n: &Value, k: &str| -> Vec<String> {
        n.get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(nodes
        .iter()
        .filter_map(|n| {
            Some(GraphNode {
                id: n.get("id")?.as_str()?.to_owned(),
                kind: n
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_owned(),
                needs: strings(n, "needs"),
                then: strings(n, "then"),
                otherwise: strings(n, "else"),
            })
        })
        .collect())
}

/// The graph's nodes, or the run's (without edges) when the graph could not be read.
pub(super) fn nodes_or_run(
    graph: &Result<Vec<GraphNode>, String>,
    info: &RunInfo,
) -> Vec<GraphNode> {
    match graph {
        Ok(g) if !g.is_empty() => g
            .iter()
            .map(|n| GraphNode {
                id: n.id.clone(),
                kind: n.kind.clone(),
                needs: n.needs.clone(),
                then: n.then.clone(),
                otherwise: n.otherwise.clone(),
            })
            .collect(),
        _ => info
            .nodes
            .iter()
            .map(|n| GraphNode {
                id: n.id.clone(),
                kind: n.r#type.clone(),
                needs: Vec::new(),
                then: Vec::new(),
                otherwise: Vec::new(),
            })
            .collect(),
    }
}

/// Depth of every node: 0 without needs, else one more than its deepest need. Needs outside
/// the graph are ignored; a cycle (never in a validated graph) stops after `n` rounds.
pub(super) fn depths(nodes: &[GraphNode]) -> Vec<usize> {
    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id.as_str(), i))
        .collect();
    let mut depth = vec![0usize; nodes.len()];
    for _ in 0..nodes.len() {
        let mut changed = false;
        for (i, n) in nodes.iter().enumerate() {
            let d = n
                .needs
                .iter()
                .filter_map(|x| index.get(x.as_str()))
                .map(|&j| depth[j] + 1)
                .max()
                .unwrap_or(0);
            if d != depth[i] && d <= nodes.len() {
                depth[i] = d;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    depth
}

/// A node state as a class of the stylesheet (fixed set).
pub(super) fn state_class(state: &str) -> &'static str {
    match state {
        "succeeded" => "st-succeeded",
        "running" => "st-running",
        "failed" => "st-failed",
        "blocked" => "st-blocked",
        "skipped" => "st-skipped",
        "canceled" => "st-canceled",
        _ => "st-pending",
    }
}

/// The state of each item of map `map` (`<map>.<index>`), from its items' events, in index
/// order; items announced (`map.items`) but not started yet are pending.
pub(super) fn item_states(map: &str, events: &[Event]) -> Vec<(String, &'static str)> {
    let prefix = format!("{map}.");
    let mut announced = 0u64;
    let mut seen: BTreeMap<u64, &'static str> = BTreeMap::new();
    for e in events {
        if e.node_id == map && e.r#type == "map.items" {
            let d: Value = serde_json::from_str(&e.data_json).unwrap_or_default();
            announced = d.get("count").and_then(Value::as_u64).unwrap_or(announced);
        }
        let Some(index) = e
            .node_id
            .strip_prefix(&prefix)
            .and_then(|i| i.parse::<u64>().ok())
        else {
            continue;
        };
        let st = match e.r#type.as_str() {
            "node.started" => "running",
            "node.completed" => "succeeded",
            "node.failed" => {
                let d: Value = serde_json::from_str(&e.data_json).unwrap_or_default();
                if d.get("will_retry").and_then(Value::as_bool) == Some(true) {
                    "running"
                } else {
                    "failed"
                }
            }
            "node.skipped" => "skipped",
            "node.canceled" => "canceled",
            _ => continue,
        };
        seen.insert(index, st);
    }
    let total = announced
        .max(seen.keys().next_back().map_or(0, |i| i + 1))
        .min(MAX_ITEMS);
    (0..total)
        .map(|i| {
            (
                format!("{map}.{i}"),
                seen.get(&i).copied().unwrap_or("pending"),
            )
        })
        .collect()
}

/// Most items of one map listed (a count beyond it in an event is not believed).
const MAX_ITEMS: u64 = 100_000;

/// States in the order a map's bar draws them.
const BAR_ORDER: [&str; 6] = [
    "succeeded",
    "running",
    "failed",
    "blocked",
    "canceled",
    "skipped",
];

/// A map's items: how many, and how many in each state.
type MapCounts = (u64, Vec<(&'static str, u64)>);

/// Items of each map node by state: (total, [(state, count)] in [`BAR_ORDER`], pending last).
fn map_counts(nodes: &[GraphNode], events: &[Event]) -> HashMap<String, MapCounts> {
    let mut out = HashMap::new();
    for n in nodes.iter().filter(|n| n.kind == "map") {
        let items = item_states(&n.id, events);
        let by: Vec<(&'static str, u64)> = BAR_ORDER
            .iter()
            .chain(["pending"].iter())
            .map(|s| (*s, items.iter().filter(|(_, st)| st == s).count() as u64))
            .filter(|(_, k)| *k > 0)
            .collect();
        out.insert(n.id.clone(), (items.len() as u64, by));
    }
    out
}

/// The segments of a map's bar: (state, count, x, width), `width` shared by count.
fn segments(
    by: &[(&'static str, u64)],
    total: u64,
    x0: i64,
    width: i64,
) -> Vec<(&'static str, u64, f64, f64)> {
    let mut left = x0 as f64;
    by.iter()
        .map(|(s, k)| {
            let w = width as f64 * *k as f64 / total.max(1) as f64;
            left += w;
            (*s, *k, left - w, w)
        })
        .collect()
}

/// A short text cue for a state, so it is not told by colour alone.
pub(super) fn state_glyph(state: &str) -> &'static str {
    match state {
        "succeeded" | "completed" => "✓",
        "running" => "▶",
        "failed" => "✗",
        "blocked" => "⏸",
        "skipped" => "↷",
        "canceled" => "⊘",
        _ => "○",
    }
}

const BOX_W: i64 = 168;
const BOX_H: i64 = 50;
const COL: i64 = 220;
const ROW: i64 = 72;
const PAD: i64 = 16;
/// Characters of a node id drawn in its box (the tooltip has all of it).
const ID_CHARS: usize = 20;

/// The SVG of the run's graph; each node links to its panel (`{node_url}/<node>`).
pub(super) fn render(
    graph: &Result<Vec<GraphNode>, String>,
    info: &RunInfo,
    events: &[Event],
    node_url: &str,
) -> Markup {
    let nodes = nodes_or_run(graph, info);
    let depth = depths(&nodes);
    let state: HashMap<&str, &str> = info
        .nodes
        .iter()
        .map(|n| (n.id.as_str(), page::node_state_name(n.state)))
        .collect();
    let counts = map_counts(&nodes, events);
    // Place each node: column by depth, row by order within the column.
    let mut rows_used: Vec<i64> = Vec::new();
    let mut at: HashMap<&str, (i64, i64)> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        let col = depth[i];
        if rows_used.len() <= col {
            rows_used.resize(col + 1, 0);
        }
        let row = rows_used[col];
        rows_used[col] += 1;
        at.insert(n.id.as_str(), (PAD + col as i64 * COL, PAD + row * ROW));
    }
    let cols = rows_used.len().max(1) as i64;
    let rows = rows_used.iter().copied().max().unwrap_or(1).max(1);
    let width = 2 * PAD + (cols - 1) * COL + BOX_W;
    let height = 2 * PAD + (rows - 1) * ROW + BOX_H;
    // Edges: (from, to, branch label).
    let by_id: HashMap<&str, &GraphNode> = nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let mut edges: Vec<(&str, &str, &'static str)> = Vec::new();
    for n in &nodes {
        for need in &n.needs {
            if !at.contains_key(need.as_str()) {
                continue;
            }
            let branch = by_id.get(need.as_str()).map_or("", |c| {
                if c.then.contains(&n.id) {
                    "then"
                } else if c.otherwise.contains(&n.id) {
                    "else"
                } else {
                    ""
                }
            });
            edges.push((need.as_str(), n.id.as_str(), branch));
        }
    }
    html! {
        @if let Err(e) = graph { p.hint { "Drawn from the run's nodes only: " (e) } }
        // A group, not an image: its nodes are links (to their milestone rows), which an image's
        // children could not be for assistive technology.
        svg id="dag" class="dag" xmlns="http://www.w3.org/2000/svg" role="group" aria-label="The run's graph"
            width=(width) height=(height) viewBox=(format!("0 0 {width} {height}")) {
            defs {
                marker #arrow viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse" {
                    path d="M 0 0 L 10 5 L 0 10 z" class="arrow" {}
                }
            }
            @for (from, to, branch) in &edges {
                @let (x1, y1) = at[from];
                @let (x2, y2) = at[to];
                @let (sx, sy, ex, ey) = (x1 + BOX_W, y1 + BOX_H / 2, x2, y2 + BOX_H / 2);
                @let mid = (sx + ex) / 2;
                @let class = match *branch { "then" => "edge then", "else" => "edge else", _ => "edge" };
                g class=(class) data-from=(from) data-to=(to) {
                    path d=(format!("M {sx} {sy} C {mid} {sy}, {mid} {ey}, {ex} {ey}")) marker-end="url(#arrow)" {}
                    @if !branch.is_empty() {
                        text.branch x=(mid) y=((sy + ey) / 2 - 4) text-anchor="middle" { (branch) }
                    }
                }
            }
            @for n in &nodes {
                @let (x, y) = at[n.id.as_str()];
                @let st = state.get(n.id.as_str()).copied().unwrap_or("pending");
                @let map = counts.get(&n.id);
                @let sub = match map {
                    Some((total, by)) => format!("map ×{total} · {} done", by.iter().find(|(s, _)| *s == "succeeded").map_or(0, |(_, k)| *k)),
                    None => format!("{} · {st}", n.kind),
                };
                a.nodelink href=(format!("{node_url}/{}", page::seg(&n.id))) data-node=(n.id) {
                    g class=(format!("node {}", state_class(st))) data-node=(n.id) data-state=(st) {
                        title { (n.id) " (" (n.kind) "): " (st) }
                        // A map is a stack of boxes: one for all its items.
                        @if map.is_some() {
                            rect.stack x=(x + 4) y=(y + 4) width=(BOX_W) height=(BOX_H) rx="6" {}
                        }
                        rect.box x=(x) y=(y) width=(BOX_W) height=(BOX_H) rx="6" {}
                        text.glyph x=(x + BOX_W - 8) y=(y + 20) text-anchor="end" aria-hidden="true" { (state_glyph(st)) }
                        text.id x=(x + 10) y=(y + 20) { (page::clip(&n.id, ID_CHARS)) }
                        text.sub x=(x + 10) y=(y + 38) { (page::clip(&sub, 26)) }
                        // The map's items by state: a bar of segments, one per state.
                        @if let Some((total, by)) = map {
                            g.mapbar data-total=(total) {
                                @for (bs, k, sx, w) in segments(by, *total, x + 10, BOX_W - 20) {
                                    rect class=(format!("seg {}", state_class(bs))) data-state=(bs) data-count=(k) x=(format!("{sx:.1}")) y=(y + BOX_H - 9) width=(format!("{w:.1}")) height="5" {}
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
