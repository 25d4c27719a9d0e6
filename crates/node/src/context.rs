//! What people give a run's agents: the part of shared/human-notes.md agents read, and
//! shared/context-manifest.yaml (the files and snippets explicitly shared), parsed and checked.

use serde::{Deserialize, Serialize};

use crate::layout::RunDir;

/// Most bytes of a context manifest.
pub const MAX_MANIFEST_BYTES: usize = 256 << 10;

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
