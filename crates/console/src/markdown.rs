//! Markdown to HTML for the console, with nothing of the document's own HTML let through: raw
//! HTML blocks are shown as code and inline HTML as text, link targets are limited to http,
//! https, mailto, in-page anchors and other files of the same project (rewritten to the
//! console's file view, where the store validates the path). The one exception is the note
//! anchor the orchestrator writes into human-notes.md (`<a id="note-3"></a>`), rebuilt here
//! from its checked id. A run's documents link what they cite as `evidence:<id>` (as text or
//! as a link's target) to the entry of the run's evidence index (evidence.rs).

use cairn_evidence::{citations, CITE_PREFIX};
use maud::{Markup, PreEscaped, Render};
use percent_encoding::percent_decode_str;
use pulldown_cmark::{CodeBlockKind, CowStr, Event, Options, Parser, Tag, TagEnd};

use super::evidence::Cites;
use super::page;

/// Where a document lives, so its relative links can point at the files next to it.
pub(super) struct Base<'a> {
    pub project: &'a str,
    /// Project-relative path of the document.
    pub path: &'a str,
    /// The evidence index of the run the document belongs to.
    pub cites: Option<&'a Cites>,
}

/// Target of links the console will not follow (`javascript:`, `data:`, paths above the project).
const BLOCKED: &str = "#link-refused";

/// Renders `text`; the result is safe to embed as is.
pub(super) fn render(text: &str, base: &Base<'_>) -> Markup {
    let text = without_front_matter(text);
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_YAML_STYLE_METADATA_BLOCKS;
    let events = sanitise(Parser::new_ext(text, options), base);
    let mut out = String::with_capacity(text.len() * 3 / 2);
    pulldown_cmark::html::push_html(&mut out, events.into_iter());
    PreEscaped(out)
}

/// The text after its YAML front matter (`---` lines around `key: value` lines at the very
/// start): the file's metadata, not something to read.
fn without_front_matter(text: &str) -> &str {
    let Some(rest) = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
    else {
        return text;
    };
    let mut at = 0;
    for line in rest.split_inclusive('\n') {
        at += line.len();
        if matches!(line.trim_end(), "---" | "...") {
            return &rest[at..];
        }
    }
    text
}

fn sanitise<'a>(parser: Parser<'a>, base: &Base<'_>) -> Vec<Event<'a>> {
    let mut out = Vec::new();
    let mut html_block: Option<String> = None;
    let mut skip_close_a = false;
    // Citations in code and in a link's or an image's text stay as written.
    let (mut in_code, mut in_link) = (0u32, 0u32);
    for event in parser {
        if let Some(buf) = html_block.as_mut() {
            match event {
                Event::End(TagEnd::HtmlBlock) => {
                    let block = html_block.take().unwrap_or_default();
                    match note_anchor(&block) {
                        Some(a) => out.push(Event::Html(a.into())),
                        None => {
                            out.push(Event::Start(Tag::CodeBlock(CodeBlockKind::Indented)));
                            out.push(Event::Text(block.into()));
                            out.push(Event::End(TagEnd::CodeBlock));
                        }
                    }
                }
                Event::Html(s) | Event::Text(s) | Event::InlineHtml(s) => buf.push_str(&s),
                _ => {}
            }
            continue;
        }
        let was_anchor = std::mem::take(&mut skip_close_a);
        match event {
            Event::Start(Tag::CodeBlock(_)) => {
                in_code += 1;
                out.push(event);
            }
            Event::End(TagEnd::CodeBlock) => {
                in_code = in_code.saturating_sub(1);
                out.push(event);
            }
            Event::End(TagEnd::Link | TagEnd::Image) => {
                in_link = in_link.saturating_sub(1);
                out.push(event);
            }
            Event::Text(t) if in_code == 0 && in_link == 0 => match base.cites {
                Some(cites) => cite_links(t, cites, &mut out),
                None => out.push(Event::Text(t)),
            },
            Event::Start(Tag::HtmlBlock) => html_block = Some(String::new()),
            Event::Html(s) => out.push(Event::Text(s)),
            Event::InlineHtml(s) => {
                if was_anchor && s.trim() == "</a>" {
                    continue;
                }
                match note_anchor(&s) {
                    Some(a) => {
                        skip_close_a = !s.contains("</a>");
                        out.push(Event::Html(a.into()));
                    }
                    None => out.push(Event::Text(s)),
                }
            }
            Event::Start(Tag::MetadataBlock(_)) => {
                in_code += 1;
                out.push(Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(
                    CowStr::Borrowed("yaml"),
                ))));
            }
            Event::End(TagEnd::MetadataBlock(_)) => {
                in_code = in_code.saturating_sub(1);
                out.push(Event::End(TagEnd::CodeBlock));
            }
            Event::Start(Tag::Link {
                link_type,
                dest_url,
                title,
                id,
            }) => {
                in_link += 1;
                let cited = dest_url
                    .strip_prefix(CITE_PREFIX)
                    .and_then(|id| base.cites?.get(id));
                let dest_url = match cited {
                    Some(c) => c.href.clone(),
                    None => link_target(&dest_url, base, false),
                }
                .into();
                out.push(Event::Start(Tag::Link {
                    link_type,
                    dest_url,
                    title,
                    id,
                }));
            }
            Event::Start(Tag::Image {
                link_type,
                dest_url,
                title,
                id,
            }) => {
                in_link += 1;
                let dest_url = link_target(&dest_url, base, true).into();
                out.push(Event::Start(Tag::Image {
                    link_type,
                    dest_url,
                    title,
                    id,
                }));
            }
            other => out.push(other),
        }
    }
    out
}

/// `text` with its `evidence:<id>` citations as links (see [`Cites::one`]).
fn cite_links<'a>(text: CowStr<'a>, cites: &Cites, out: &mut Vec<Event<'a>>) {
    if citations(&text).is_empty() {
        out.push(Event::Text(text));
        return;
    }
    let html = cites.text(&text).render().into_string();
    out.push(Event::InlineHtml(html.into()));
}

/// `<a id="note-3">` or `<a id="note-3"></a>` as written by the orchestrator, rebuilt.
fn note_anchor(html: &str) -> Option<String> {
    let s = html.trim();
    let s = s.strip_suffix("</a>").unwrap_or(s);
    let id = s.strip_prefix("<a id=\"")?.strip_suffix("\">")?;
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ok.then(|| format!("<a id=\"{id}\"></a>"))
}

/// The URL a Markdown link or image may point at.
fn link_target(dest: &str, base: &Base<'_>, image: bool) -> String {
    let dest = dest.trim();
    if dest.is_empty() || dest.starts_with('#') {
        return dest.to_owned();
    }
    let end = dest.find(['/', '?', '#']).unwrap_or(dest.len());
    if let Some(colon) = dest[..end].find(':') {
        let scheme = dest[..colon].to_ascii_lowercase();
        let allowed = if image {
            ["http", "https"].as_slice()
        } else {
            ["http", "https", "mailto"].as_slice()
        };
        return if allowed.contains(&scheme.as_str()) {
            dest.to_owned()
        } else {
            BLOCKED.to_owned()
        };
    }
    if dest.starts_with("//") {
        return BLOCKED.to_owned();
    }
    let (rest, fragment) = match dest.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (dest, None),
    };
    let rest = rest.split_once('?').map_or(rest, |(p, _)| p);
    let decoded = percent_decode_str(rest).decode_utf8_lossy();
    let Some(path) = join(base.path, &decoded) else {
        return BLOCKED.to_owned();
    };
    if path.is_empty() {
        return page::tree_url(base.project, "");
    }
    if image {
        return format!("{}&inline=1", page::download_url(base.project, &path));
    }
    let mut url = page::file_url(base.project, &path);
    if let Some(f) = fragment {
        url.push('#');
        url.push_str(&page::qv(f));
    }
    url
}

/// `link` taken relative to the directory of `doc` (or to the project root when it starts with
/// `/`), with `.` and `..` folded; None when it climbs above the project. The store still checks
/// the result: this only builds a link.
fn join(doc: &str, link: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    if !link.starts_with('/') {
        parts.extend(doc.split('/').filter(|p| !p.is_empty()));
        parts.pop();
    }
    for p in link.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn front_matter_is_not_shown() {
        let base = Base {
            project: "p",
            path: "r/shared/human-notes.md",
            cites: None,
        };
        let html = render(
            "---\ntitle: \"Human notes\"\ntags: [\"human-notes\"]\n---\n# Human notes\n\nhello\n",
            &base,
        )
        .into_string();
        assert!(!html.contains("tags"), "{html}");
        assert!(
            html.contains("<h1>Human notes</h1>") && html.contains("hello"),
            "{html}"
        );
        // A rule later in the text is not front matter.
        assert_eq!(without_front_matter("# a\n---\nb"), "# a\n---\nb");
        assert_eq!(without_front_matter("---\nno end"), "---\nno end");
    }

    use super::*;

    fn md(text: &str) -> String {
        render(
            text,
            &Base {
                project: "p",
                path: "docs/run/report.md",
                cites: None,
            },
        )
        .into_string()
    }

    #[test]
    fn raw_html_is_shown_not_run() {
        let out = md("hi <img src=x onerror=alert(1)> there\n\n<script>alert(2)</script>\n\n<div onclick=\"x()\">\nblock\n</div>\n");
        assert!(!out.contains("<img"), "{out}");
        assert!(!out.contains("<script"), "{out}");
        assert!(!out.contains("<div"), "{out}");
        assert!(out.contains("&lt;img src=x onerror=alert(1)&gt;"), "{out}");
        assert!(
            out.contains("&lt;script&gt;alert(2)&lt;/script&gt;"),
            "{out}"
        );
    }

    #[test]
    fn links_are_limited() {
        let out = md("[a](javascript:alert(1)) [b](JaVaScRiPt:x) [c](data:text/html,x) [d](https://example.org/x) [e](../other.md#sec) [f](../../../../etc/passwd) [g](//evil.example/)");
        assert!(!out.to_ascii_lowercase().contains("javascript:"), "{out}");
        assert!(!out.contains("data:"), "{out}");
        assert!(out.contains("href=\"https://example.org/x\""), "{out}");
        assert!(
            out.contains("href=\"/projects/p/files?path=docs/other.md#sec\""),
            "{out}"
        );
        assert_eq!(out.matches(BLOCKED).count(), 5, "{out}");
    }

    #[test]
    fn note_anchors_survive_and_front_matter_is_not_shown() {
        let out = md("---\ntitle: \"Human notes\"\n---\n# Notes\n\n<a id=\"note-1\"></a>\n### Note 1: by ann\n\ntext\n");
        assert!(out.contains("<a id=\"note-1\"></a>"), "{out}");
        assert!(!out.contains("title:"), "{out}");
        assert!(!out.contains("&lt;a id"), "{out}");
        let forged = md("<a id=\"x\" onclick=\"y\">z</a>");
        assert!(!forged.contains("<a id"), "{forged}");
    }

    #[test]
    fn citations_link_to_the_evidence_outside_code_and_links() {
        let entry = cairn_evidence::EvidenceEntry {
            id: "E3".into(),
            kind: "file".into(),
            source: "docs/a.md".into(),
            sha256: String::new(),
            run: "r1".into(),
            node: String::new(),
            event: String::new(),
            ts: String::new(),
            detail: Default::default(),
        };
        let cites = Cites::new("p", "r1", &[entry]);
        let base = Base {
            project: "p",
            path: ".cairn/runs/r1/shared/human-notes.md",
            cites: Some(&cites),
        };
        let out = render(
            "Approved per evidence:E3 <b>x</b>.\n\n`evidence:E3` [see](evidence:E3) [evidence:E3](https://e.example)\n\n    evidence:E3\n",
            &base,
        )
        .into_string();
        let link = "<a class=\"evidence\" href=\"/projects/p/files?path=docs/a.md\"";
        assert!(out.contains(&format!("Approved per {link}")), "{out}");
        assert!(out.contains("&lt;b&gt;"), "{out}");
        assert!(out.contains("<code>evidence:E3</code>"), "{out}");
        assert!(
            out.contains("<a href=\"/projects/p/files?path=docs/a.md\">see</a>"),
            "{out}"
        );
        assert!(
            out.contains("<a href=\"https://e.example\">evidence:E3</a>"),
            "{out}"
        );
        assert!(
            out.contains("<pre><code>evidence:E3\n</code></pre>"),
            "{out}"
        );
        assert_eq!(out.matches(link).count(), 1, "{out}");
    }

    #[test]
    fn joins_stay_inside() {
        assert_eq!(join("docs/a/b.md", "c.md").as_deref(), Some("docs/a/c.md"));
        assert_eq!(join("docs/a/b.md", "../c.md").as_deref(), Some("docs/c.md"));
        assert_eq!(
            join("docs/a/b.md", "/workspace/x.rs").as_deref(),
            Some("workspace/x.rs")
        );
        assert_eq!(join("docs/b.md", "../../x"), None);
    }
}
