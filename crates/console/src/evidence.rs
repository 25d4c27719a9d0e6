//! Evidence a note cites: `evidence:<id>` in a gate note, a human note or a run's Markdown
//! report is shown as a link to the entry of the run's `shared/evidence/index.json` it names:
//! a file to the file, a gate's wait (an event range) to the first of those events on the run
//! page, a command to its node's output at that attempt. An id the index does not hold stays
//! text, marked as not found.

use std::collections::HashMap;

use cairn_evidence::{citations, parse, EvidenceEntry};
use maud::{html, Markup, Render};
use serde_json::Value;

use super::{files, logview, page, run, Console};

/// Largest index.json read (one line per entry).
const INDEX_LIMIT: u64 = 8 << 20;

/// Where a cited entry leads, and what it is (the link's tooltip).
pub(super) struct Cite {
    pub href: String,
    pub title: String,
}

/// The entries of one run's evidence index, by id.
#[derive(Default)]
pub(super) struct Cites {
    by_id: HashMap<String, Cite>,
}

impl Cites {
    pub fn new(project: &str, run: &str, entries: &[EvidenceEntry]) -> Cites {
        let run_url = page::run_url(project, run);
        let by_id = entries
            .iter()
            .map(|e| (e.id.clone(), cite(project, &run_url, e)))
            .collect();
        Cites { by_id }
    }

    pub fn get(&self, id: &str) -> Option<&Cite> {
        self.by_id.get(id)
    }

    /// `text` with each `evidence:<id>` in it as a link to its entry.
    pub fn text<'a>(&'a self, text: &'a str) -> Cited<'a> {
        Cited { cites: self, text }
    }

    /// One citation (`evidence:<id>`, its text) as HTML.
    pub fn one(&self, cited: &str, id: &str) -> Markup {
        match self.get(id) {
            Some(c) => html! {
                a.evidence href=(c.href) title=(c.title) data-evidence=(id) { (cited) }
            },
            None => html! {
                span.evidence-unknown title="not in this run's evidence index" { (cited) }
            },
        }
    }
}

/// Text with its citations linked (see [`Cites::text`]).
pub(super) struct Cited<'a> {
    cites: &'a Cites,
    text: &'a str,
}

impl Render for Cited<'_> {
    fn render(&self) -> Markup {
        let mut parts = Vec::new();
        let mut at = 0;
        for (range, id) in citations(self.text) {
            parts.push((
                &self.text[at..range.start],
                Some((&self.text[range.clone()], id)),
            ));
            at = range.end;
        }
        parts.push((&self.text[at..], None));
        html! {
            @for (before, cited) in parts {
                (before)
                @if let Some((text, id)) = cited { (self.cites.one(text, id)) }
            }
        }
    }
}

fn cite(project: &str, run_url: &str, e: &EvidenceEntry) -> Cite {
    let num = |k: &str| e.detail.get(k).and_then(Value::as_u64);
    let text = |k: &str| e.detail.get(k).and_then(Value::as_str).unwrap_or_default();
    let seq = e.id.strip_prefix('E').unwrap_or(&e.id);
    match e.kind.as_str() {
        "file" => Cite {
            href: page::file_url(project, &e.source),
            title: format!("file {} (sha256 {})", e.source, page::clip(&e.sha256, 13)),
        },
        "event_range" => {
            let from = num("from_seq").map_or_else(|| seq.to_owned(), |n| n.to_string());
            let to = num("to_seq").map_or_else(|| seq.to_owned(), |n| n.to_string());
            Cite {
                href: format!("{run_url}#ev-{from}"),
                title: format!(
                    "events {from}–{to} of events.jsonl: gate {} {} by {}",
                    text("gate"),
                    text("decision"),
                    text("by")
                ),
            }
        }
        "command" => {
            // `step <run>/<node>/<attempt>`: the attempt is the last part.
            let attempt = e
                .source
                .rsplit('/')
                .next()
                .and_then(|a| a.parse::<u32>().ok());
            let mut href = logview::log_url(run_url, &e.node);
            if let Some(a) = attempt {
                href.push_str(&format!("?attempt={a}"));
            }
            let exit = num("exit_code").map_or_else(|| "?".to_owned(), |n| n.to_string());
            Cite {
                href,
                title: format!("command of node {} ({}), exit {exit}", e.node, e.source),
            }
        }
        other => Cite {
            href: format!("{run_url}#ev-{seq}"),
            title: format!("{other} recorded by event {seq}"),
        },
    }
}

/// The evidence index of `run` (empty when it is missing or unreadable: citations then show
/// as not found).
pub(super) async fn load(console: &Console, project: &str, run: &str) -> Cites {
    let path = format!("{}/shared/evidence/index.json", run::run_dir(None, run));
    let entries = match files::read(console, project, &path, INDEX_LIMIT).await {
        Ok(Some(r)) => r.text().and_then(parse),
        _ => None,
    };
    Cites::new(project, run, &entries.unwrap_or_default())
}

/// The run a project path belongs to (`.cairn/runs/<run>/...`), if any.
pub(super) fn run_of(path: &str) -> Option<&str> {
    let rest = path.strip_prefix(".cairn/runs/")?;
    let (run, _) = rest.split_once('/')?;
    (!run.is_empty()).then_some(run)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn entry(id: &str, kind: &str, source: &str, node: &str, detail: Value) -> EvidenceEntry {
        EvidenceEntry {
            id: id.into(),
            kind: kind.into(),
            source: source.into(),
            sha256: "ab".repeat(32),
            run: "r1".into(),
            node: node.into(),
            event: String::new(),
            ts: String::new(),
            detail: detail.as_object().cloned().unwrap_or_default(),
        }
    }

    #[test]
    fn each_kind_of_entry_links_to_what_it_names() {
        let cites = Cites::new(
            "p",
            "r1",
            &[
                entry("E2", "file", "docs/a.md", "draft", Value::Null),
                entry(
                    "E9",
                    "event_range",
                    "events.jsonl#5-9",
                    "review",
                    serde_json::json!({"from_seq": 5, "to_seq": 9, "gate": "review", "decision": "approved", "by": "ann"}),
                ),
                entry(
                    "E7",
                    "command",
                    "step r1/tests/2",
                    "tests",
                    serde_json::json!({"exit_code": 1}),
                ),
            ],
        );
        assert_eq!(
            cites.get("E2").unwrap().href,
            "/projects/p/files?path=docs/a.md"
        );
        assert_eq!(cites.get("E9").unwrap().href, "/projects/p/runs/r1#ev-5");
        assert!(cites.get("E9").unwrap().title.contains("events 5–9"));
        assert_eq!(
            cites.get("E7").unwrap().href,
            "/projects/p/runs/r1/nodes/tests/log?attempt=2"
        );
        let html = cites
            .text("ok <b> per evidence:E2, evidence:E99 and evidence:E7.")
            .render()
            .into_string();
        assert!(
            html.starts_with("ok &lt;b&gt; per <a class=\"evidence\""),
            "{html}"
        );
        assert!(html.contains(">evidence:E2</a>, "), "{html}");
        assert!(
            html.contains("<span class=\"evidence-unknown\" title=\"not in this run's evidence index\">evidence:E99</span>"),
            "{html}"
        );
        assert!(html.ends_with(">evidence:E7</a>."), "{html}");
    }

    #[test]
    fn a_path_under_a_run_names_its_run() {
        assert_eq!(run_of(".cairn/runs/r1/shared/reports/a.md"), Some("r1"));
        assert_eq!(run_of("docs/a.md"), None);
        assert_eq!(run_of(".cairn/runs/r1"), None);
    }
}
