//! Human intervention on the files it lives in: shared/human-notes.md (notes,
//! approval/rejection comments, rework instructions; given to later agents as high-priority
//! context) and shared/context-manifest.yaml (what is explicitly shared).
//! Each action is also an event with `by` and `ts`; the callers record those.

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::rundir::RunDir;
use cairn_store_client::{PutOptions, Store};

/// Most bytes of one note.
pub const MAX_NOTE_BYTES: usize = 64 << 10;

/// Appends a note made at `at` (its heading says when); returns its anchor ref
/// (`shared/human-notes.md#note-3`).
pub async fn append_note(
    store: &Store,
    project: &str,
    run_id: &str,
    by: &str,
    heading: &str,
    text: &str,
    at: &str,
) -> Result<String> {
    if text.len() > MAX_NOTE_BYTES {
        // AddNote sends the note as `text`; gate decisions and reworks as `note`.
        let field = if heading == "note" { "text" } else { "note" };
        return Err(Error::field(
            field,
            format!("the note is {} bytes; at most {MAX_NOTE_BYTES}", text.len()),
        ));
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
        at,
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

pub use cairn_node::context::{notes_for_agents, Attachment, Manifest, MAX_MANIFEST_BYTES};

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
            &cairn_graph::Graph::from_yaml(
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
