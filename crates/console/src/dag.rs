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
pub(super) fn depths(nodes: &[&GraphNode]) -> Vec<usize> {
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
/// Columns side by side before the drawing wraps into another band below (a long chain is
/// a few screen-wide bands, not one row thousands of pixels wide).
const WRAP_COLS: usize = 6;
/// Room between two bands (the edges that go on in the next band cross it).
const BAND_GAP: i64 = 40;
/// Items of one expanded map drawn as nodes; the rest are one "N more" box.
pub(super) const MAX_SHOWN_ITEMS: usize = 24;

/// How the page asks for the graph: which maps are expanded into their items, and the run
/// page's URL (for the links that expand and fold them).
pub(super) struct View<'a> {
    pub expand: &'a [String],
    pub run_url: &'a str,
}

/// The `expand` query value: map ids separated by commas.
pub(super) fn expand_list(q: &str) -> Vec<String> {
    q.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// What a box of the drawing stands for.
enum Role {
    Node,
    /// An item of an expanded map.
    Item,
    /// The items of an expanded map not drawn: how many, and the map.
    More(usize, String),
}

/// One box of the drawing.
struct Drawn {
    node: GraphNode,
    state: &'static str,
    role: Role,
}

/// The items of map `map` drawn as nodes: those that failed, run or wait first, then the
/// rest in index order, at most [`MAX_SHOWN_ITEMS`], shown in index order; and how many
/// are left out.
fn shown_items(items: Vec<(String, &'static str)>) -> (Vec<(String, &'static str)>, usize) {
    let total = items.len();
    if total <= MAX_SHOWN_ITEMS {
        return (items, 0);
    }
    let urgent = |s: &str| matches!(s, "failed" | "running" | "blocked");
    let mut order: Vec<usize> = (0..total).collect();
    order.sort_by_key(|&i| (!urgent(items[i].1), i));
    order.truncate(MAX_SHOWN_ITEMS);
    order.sort_unstable();
    let shown = order.into_iter().map(|i| items[i].clone()).collect();
    (shown, total - MAX_SHOWN_ITEMS)
}

/// The boxes to draw: the graph's nodes, with the items of each expanded map after it (each
/// needing the map, and every node that needs the map needing them instead).
fn boxes(
    nodes: Vec<GraphNode>,
    state: &HashMap<&str, &'static str>,
    events: &[Event],
    expand: &[String],
) -> Vec<Drawn> {
    let mut fanned: HashMap<String, Vec<String>> = HashMap::new();
    let mut out = Vec::new();
    for n in nodes {
        let st = state.get(n.id.as_str()).copied().unwrap_or("pending");
        let open = n.kind == "map" && expand.contains(&n.id);
        let map = n.id.clone();
        out.push(Drawn {
            node: n,
            state: st,
            role: Role::Node,
        });
        if !open {
            continue;
        }
        let (items, more) = shown_items(item_states(&map, events));
        let mut ids = Vec::new();
        for (id, st) in items {
            ids.push(id.clone());
            out.push(Drawn {
                node: leaf(id, "item", &map),
                state: st,
                role: Role::Item,
            });
        }
        if more > 0 {
            let id = format!("{map} ({more} more)");
            ids.push(id.clone());
            out.push(Drawn {
                node: leaf(id, "items", &map),
                state: "pending",
                role: Role::More(more, map.clone()),
            });
        }
        if !ids.is_empty() {
            fanned.insert(map, ids);
        }
    }
    for d in &mut out {
        let needs = std::mem::take(&mut d.node.needs);
        for need in needs {
            match fanned.get(&need) {
                Some(items) if matches!(d.role, Role::Node) => {
                    d.node.needs.extend(items.iter().cloned())
                }
                _ => d.node.needs.push(need),
            }
        }
    }
    out
}

fn leaf(id: String, kind: &str, map: &str) -> GraphNode {
    GraphNode {
        id,
        kind: kind.to_owned(),
        needs: vec![map.to_owned()],
        then: Vec::new(),
        otherwise: Vec::new(),
    }
}

/// Where each box goes: columns by depth, rows by order within a column; past
/// [`WRAP_COLS`] columns the drawing goes on in another band below. Returns the places and
/// the drawing's width and height.
fn place(nodes: &[&GraphNode]) -> (Vec<(i64, i64)>, i64, i64) {
    let depth = depths(nodes);
    let mut rows_used: Vec<i64> = Vec::new();
    let mut cell = Vec::with_capacity(nodes.len());
    for &col in &depth {
        if rows_used.len() <= col {
            rows_used.resize(col + 1, 0);
        }
        cell.push((col, rows_used[col]));
        rows_used[col] += 1;
    }
    let cols = rows_used.len().max(1);
    let per_band = if cols > WRAP_COLS { WRAP_COLS } else { cols };
    // Each band as tall as its tallest column; where each band starts.
    let mut band_top = Vec::new();
    let mut top = PAD;
    for band in rows_used.chunks(per_band) {
        band_top.push(top);
        let rows = band.iter().copied().max().unwrap_or(1).max(1);
        top += (rows - 1) * ROW + BOX_H + BAND_GAP;
    }
    let at = cell
        .into_iter()
        .map(|(col, row)| {
            let (band, c) = (col / per_band, (col % per_band) as i64);
            (PAD + c * COL, band_top[band] + row * ROW)
        })
        .collect();
    let width = 2 * PAD + (per_band as i64 - 1) * COL + BOX_W;
    // Room below the last row for a map's unfold link.
    let height = top - BAND_GAP + 2 * PAD;
    (at, width, height)
}

/// The path of an edge: sideways to a node on the right, else (the next band) down from the
/// bottom of one box to the top of the other.
fn edge_path((x1, y1): (i64, i64), (x2, y2): (i64, i64)) -> (String, i64, i64) {
    if x2 > x1 + BOX_W / 2 {
        let (sx, sy, ex, ey) = (x1 + BOX_W, y1 + BOX_H / 2, x2, y2 + BOX_H / 2);
        let mid = (sx + ex) / 2;
        (
            format!("M {sx} {sy} C {mid} {sy}, {mid} {ey}, {ex} {ey}"),
            mid,
            (sy + ey) / 2 - 4,
        )
    } else {
        let (sx, sy, ex, ey) = (x1 + BOX_W / 2, y1 + BOX_H, x2 + BOX_W / 2, y2);
        let bend = (BAND_GAP + ROW).min((ey - sy).abs().max(20));
        (
            format!(
                "M {sx} {sy} C {sx} {}, {ex} {}, {ex} {ey}",
                sy + bend,
                ey - bend
            ),
            (sx + ex) / 2,
            (sy + ey) / 2 - 4,
        )
    }
}

/// The SVG of the run's graph; each node links to its panel (`{node_url}/<node>`). Maps
/// named in `view.expand` are drawn with their items as nodes.
pub(super) fn render(
    graph: &Result<Vec<GraphNode>, String>,
    info: &RunInfo,
    events: &[Event],
    node_url: &str,
    view: &View<'_>,
) -> Markup {
    let state: HashMap<&str, &'static str> = info
        .nodes
        .iter()
        .map(|n| (n.id.as_str(), page::node_state_name(n.state)))
        .collect();
    let base = nodes_or_run(graph, info);
    let counts = map_counts(&base, events);
    let drawn = boxes(base, &state, events, view.expand);
    let (places, width, height) = place(&drawn.iter().map(|d| &d.node).collect::<Vec<_>>());
    let at: HashMap<&str, (i64, i64)> = drawn
        .iter()
        .zip(&places)
        .map(|(d, p)| (d.node.id.as_str(), *p))
        .collect();
    // Edges: (from, to, branch label).
    let by_id: HashMap<&str, &GraphNode> = drawn
        .iter()
        .map(|d| (d.node.id.as_str(), &d.node))
        .collect();
    let mut edges: Vec<(&str, &str, &'static str)> = Vec::new();
    for d in &drawn {
        let n = &d.node;
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
    let toggle_url = |map: &str| {
        let mut list: Vec<&str> = view
            .expand
            .iter()
            .map(String::as_str)
            .filter(|m| *m != map)
            .collect();
        if !view.expand.iter().any(|m| m == map) {
            list.push(map);
        }
        if list.is_empty() {
            format!("{}#graph", view.run_url)
        } else {
            format!(
                "{}?expand={}#graph",
                view.run_url,
                page::qv(&list.join(","))
            )
        }
    };
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
                @let (d, lx, ly) = edge_path(at[from], at[to]);
                @let class = match *branch { "then" => "edge then", "else" => "edge else", _ => "edge" };
                g class=(class) data-from=(from) data-to=(to) {
                    path d=(d) marker-end="url(#arrow)" {}
                    @if !branch.is_empty() {
                        text.branch x=(lx) y=(ly) text-anchor="middle" { (branch) }
                    }
                }
            }
            @for (d, (x, y)) in drawn.iter().zip(&places) {
                @let (x, y) = (*x, *y);
                @let n = &d.node;
                @let st = d.state;
                @match &d.role {
                    Role::More(more, map) => {
                        // The items not drawn: the map's panel lists them all.
                        a.nodelink.more href=(format!("{node_url}/{}", page::seg(map))) data-node=(map) {
                            g class="node more st-pending" data-more=(more) {
                                title { (more) " more items of " (map) ": its panel lists them all" }
                                rect.box x=(x) y=(y) width=(BOX_W) height=(BOX_H) rx="6" {}
                                text.id x=(x + 10) y=(y + 20) { "+" (more) " more" }
                                text.sub x=(x + 10) y=(y + 38) { "items of " (page::clip(map, 14)) }
                            }
                        }
                    }
                    _ => {
                        @let map = counts.get(&n.id);
                        @let item = matches!(d.role, Role::Item);
                        @let sub = match map {
                            Some((total, by)) => format!("map ×{total} · {} done", by.iter().find(|(s, _)| *s == "succeeded").map_or(0, |(_, k)| *k)),
                            None if item => format!("item · {st}"),
                            None => format!("{} · {st}", n.kind),
                        };
                        a.nodelink href=(format!("{node_url}/{}", page::seg(&n.id))) data-node=(n.id) {
                            g class=(format!("node {}{}", state_class(st), if item { " item" } else { "" })) data-node=(n.id) data-state=(st) {
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
                        // A map unfolds into its items in the drawing (and folds back).
                        @if let Some((total, _)) = map.filter(|(t, _)| *t > 0) {
                            @let open = view.expand.contains(&n.id);
                            a.maptoggle href=(toggle_url(&n.id)) data-map=(n.id) aria-expanded=(open) {
                                text.toggle x=(x + 10) y=(y + BOX_H + 17) {
                                    @if open { "▾ fold the items" } @else { "▸ show the " (total) " items" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
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

    fn event(kind: &str, node: &str, data: &str) -> Event {
        Event {
            r#type: kind.into(),
            node_id: node.into(),
            data_json: data.into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_expanded_map_draws_a_bounded_number_of_items_and_says_how_many_more() {
        let mut events = vec![event("map.items", "fan", r#"{"count": 100}"#)];
        for i in 0..100 {
            events.push(event("node.started", &format!("fan.{i}"), "{}"));
            if i != 70 {
                events.push(event("node.completed", &format!("fan.{i}"), "{}"));
            }
        }
        events.push(event("node.failed", "fan.90", "{}"));
        let nodes = vec![
            node("plan", "agent_task", &[]),
            node("fan", "map", &["plan"]),
            node("join", "write_file", &["fan"]),
        ];
        let drawn = boxes(nodes, &HashMap::new(), &events, &["fan".to_owned()]);
        let items: Vec<&str> = drawn
            .iter()
            .filter(|d| matches!(d.role, Role::Item))
            .map(|d| d.node.id.as_str())
            .collect();
        assert_eq!(items.len(), MAX_SHOWN_ITEMS);
        // What needs attention is drawn even far down the list: the running and the failed.
        assert!(
            items.contains(&"fan.70") && items.contains(&"fan.90"),
            "{items:?}"
        );
        assert_eq!(items[0], "fan.0");
        let more: Vec<usize> = drawn
            .iter()
            .filter_map(|d| match &d.role {
                Role::More(n, map) if map == "fan" => Some(*n),
                _ => None,
            })
            .collect();
        assert_eq!(more, vec![100 - MAX_SHOWN_ITEMS]);
        // Items need the map; what needed the map needs every drawn box of it.
        let join = drawn.iter().find(|d| d.node.id == "join").unwrap();
        assert_eq!(join.node.needs.len(), MAX_SHOWN_ITEMS + 1);
        assert!(!join.node.needs.contains(&"fan".to_owned()));
        let refs: Vec<&GraphNode> = drawn.iter().map(|d| &d.node).collect();
        let depth = depths(&refs);
        let depth_of = |id: &str| depth[drawn.iter().position(|d| d.node.id == id).unwrap()];
        assert_eq!(
            (depth_of("fan"), depth_of("fan.0"), depth_of("join")),
            (1, 2, 3)
        );
        // Folded, the map is one box.
        let folded = boxes(
            vec![
                node("fan", "map", &[]),
                node("join", "write_file", &["fan"]),
            ],
            &HashMap::new(),
            &events,
            &[],
        );
        assert_eq!(folded.len(), 2);
    }

    #[test]
    fn a_long_chain_wraps_into_bands_instead_of_one_wide_row() {
        let ids: Vec<String> = (0..20).map(|i| format!("n{i}")).collect();
        let nodes: Vec<GraphNode> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let need: Vec<&str> = if i == 0 {
                    vec![]
                } else {
                    vec![ids[i - 1].as_str()]
                };
                node(id, "write_file", &need)
            })
            .collect();
        let refs: Vec<&GraphNode> = nodes.iter().collect();
        let (at, width, height) = place(&refs);
        assert_eq!(width, 2 * PAD + (WRAP_COLS as i64 - 1) * COL + BOX_W);
        // 20 columns in bands of 6: four bands, one under the other.
        let tops: std::collections::BTreeSet<i64> = at.iter().map(|p| p.1).collect();
        assert_eq!(tops.len(), 4, "{at:?}");
        assert!(height < 4 * (BOX_H + BAND_GAP) + 3 * PAD, "{height}");
        assert_eq!(at[6], (PAD, at[0].1 + BOX_H + BAND_GAP));
        // The edge into the next band goes down, from the bottom of one box to the top of
        // the next.
        let (d, _, _) = edge_path(at[5], at[6]);
        assert!(
            d.starts_with(&format!("M {} {}", at[5].0 + BOX_W / 2, at[5].1 + BOX_H)),
            "{d}"
        );
        // A short graph keeps one row.
        let (short, _, _) = place(&refs[..4]);
        assert!(short.iter().all(|p| p.1 == PAD), "{short:?}");
    }
}
