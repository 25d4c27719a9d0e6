//! Human intervention on the files it lives in: shared/human-notes.md (notes,
//! approval/rejection comments, rework instructions; given to later agents as high-priority
//! context) and shared/context-manifest.yaml (what is explicitly shared).
//! Each action is also an event with `by` and `ts`; the callers record those.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::events::now;
use crate::rundir::RunDir;
use crate::store::{PutOptions, Store};

/// Most bytes of one note.
pub const MAX_NOTE_BYTES: usize = 64 << 10;
/// Most bytes of a context manifest.
pub const MAX_MANIFEST_BYTES: usize = 256 << 10;

/// Appends a note; returns its anchor ref (`shared/human-notes.md#note-3`).
pub async fn append_note(
    store: &Store,
    project: &str,
    run_id: &str,
    by: &str,
    heading: &str,
    text: &str,
) -> Result<String> {
    if text.len() > MAX_NOTE_BYTES {
        return Err(Error::InvalidArgument(format!(
            "the note is {} bytes; at most {MAX_NOTE_BYTES}",
            text.len()
        )));
    }
    let path = RunDir::new(run_id).human_notes();
    let current = store
        .get(project, &path)
        .await
        .map_err(Error::store(format!("reading {path}")))?
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let n = current.matches("<a id=\"note-").count() + 1;
    let by = if by.is_empty() { "human" } else { by };
    let mut next = current;
    if !next.ends_with('\n') && !next.is_empty() {
        next.push('\n');
    }
    next.push_str(&format!(
        "\n<a id=\"note-{n}\"></a>\n### Note {n}: {heading} (by {by}, {})\n\n{}\n",
        now(),
        text.trim_end()
    ));
    let opts = PutOptions {
        overwrite: true,
        ..Default::default()
    };
    store
        .put(project, &path, Bytes::from(next), &opts)
        .await
        .map_err(Error::store(format!("writing {path}")))?;
    Ok(format!("shared/human-notes.md#note-{n}"))
}

/// The part of human-notes.md agents are given: everything but the front matter and the
/// file's own header; None when no human wrote anything yet.
pub fn notes_for_agents(text: &str) -> Option<String> {
    let mut body = text;
    if let Some(rest) = body.strip_prefix("---\n") {
        if let Some(end) = rest.find("\n---\n") {
            body = &rest[end + 5..];
        }
    }
    let kept: Vec<&str> = body
        .lines()
        .filter(|l| {
            !(l.starts_with("# Human notes for run")
                || l.starts_with("Write guidance, corrections and constraints here")
                || l.starts_with("Agents of this run read this file"))
        })
        .collect();
    let out = kept.join("\n").trim().to_owned();
    (!out.is_empty()).then_some(out)
}

/// shared/context-manifest.yaml.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    #[serde(default)]
    pub attachments: Vec<Attachment>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attachment {
    pub id: String,
    /// file | snippet
    pub kind: String,
    /// `./...` relative to the run directory, otherwise relative to the project.
    pub path: String,
    /// Snippets: `startLine:endLine`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<String>,
    #[serde(default)]
    pub reason: String,
}

impl Attachment {
    /// The project path the attachment points at.
    pub fn resolved_path(&self, run_id: &str) -> String {
        match self.path.strip_prefix("./") {
            Some(rel) => RunDir::new(run_id).path(rel),
            None => self.path.clone(),
        }
    }
}

impl Manifest {
    /// Parses and checks a manifest; the error says which attachment is wrong and why.
    pub fn parse(yaml: &str) -> std::result::Result<Manifest, String> {
        if yaml.len() > MAX_MANIFEST_BYTES {
            return Err(format!(
                "the manifest is larger than {} KiB",
                MAX_MANIFEST_BYTES >> 10
            ));
        }
        let m: Manifest = if yaml.trim().is_empty() {
            Manifest::default()
        } else {
            serde_saphyr::from_str(yaml).map_err(|e| format!("not a context manifest: {e}"))?
        };
        let mut ids = std::collections::HashSet::new();
        for (i, a) in m.attachments.iter().enumerate() {
            let at = format!("attachments[{i}] (`{}`)", a.id);
            if a.id.trim().is_empty() {
                return Err(format!("attachments[{i}]: `id` is empty"));
            }
            if !ids.insert(a.id.clone()) {
                return Err(format!("{at}: two attachments have this id"));
            }
            match a.kind.as_str() {
                "file" => {}
                "snippet" => {
                    let ok = a.range.as_deref().and_then(|r| r.split_once(':')).is_some_and(|(x, y)| {
                        matches!((x.trim().parse::<u64>(), y.trim().parse::<u64>()), (Ok(x), Ok(y)) if x >= 1 && x <= y)
                    });
                    if !ok {
                        return Err(format!("{at}: a snippet needs `range: \"start:end\"` (1-based lines, start <= end)"));
                    }
                }
                other => return Err(format!("{at}: kind `{other}` is not file or snippet")),
            }
            let p = a.path.strip_prefix("./").unwrap_or(&a.path);
            pathguard::validate(p).map_err(|rej| format!("{at}: path `{}`: {rej}", a.path))?;
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_rules() {
        let m = Manifest::parse("attachments:\n  - {id: a, kind: file, path: ./shared/contracts/x.md, reason: r}\n  - {id: b, kind: snippet, path: src/a.rs, range: '2:5'}\n").unwrap();
        assert_eq!(
            m.attachments[0].resolved_path("r1"),
            ".cairn/runs/r1/shared/contracts/x.md"
        );
        assert_eq!(m.attachments[1].resolved_path("r1"), "src/a.rs");
        assert!(
            Manifest::parse("attachments: [{id: a, kind: file, path: ../x}]")
                .unwrap_err()
                .contains("attachments[0]")
        );
        assert!(
            Manifest::parse("attachments: [{id: a, kind: snippet, path: x}]")
                .unwrap_err()
                .contains("range")
        );
        assert!(Manifest::parse("attachments: [{id: a, kind: blob, path: x}]").is_err());
        assert!(Manifest::parse(
            "attachments: [{id: a, kind: file, path: x}, {id: a, kind: file, path: y}]"
        )
        .is_err());
        assert!(Manifest::parse("stuff: 1").is_err());
        assert_eq!(Manifest::parse("").unwrap(), Manifest::default());
    }

    #[test]
    fn notes_without_boilerplate() {
        let files = crate::rundir::initial_files(&crate::run::RunState::new(
            "p",
            &crate::graph::Graph::from_yaml(
                "nodes: [{id: g, type: gate}]",
                "r1",
                &Default::default(),
            )
            .unwrap(),
        ));
        let initial = &files[0].1;
        assert_eq!(notes_for_agents(initial), None);
        let with = format!(
            "{initial}\n<a id=\"note-1\"></a>\n### Note 1: note (by ann, t)\n\nUse tabs.\n"
        );
        let got = notes_for_agents(&with).unwrap();
        assert!(
            got.contains("Use tabs.") && !got.contains("task_id"),
            "{got}"
        );
    }
}
