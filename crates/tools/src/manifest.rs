//! Installed tools: `<tools_dir>/<name>/tool.toml` plus its program (the legacy
//! tool directory: a subprocess confined to allowed_paths). The directory belongs to the
//! operator of the orchestrator, never to a project: on the legacy backend its programs run on
//! the orchestrator's host.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Largest program file.
const MAX_PROGRAM_BYTES: u64 = 1 << 20;

/// Why a tool cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("unknown tool `{name}`: not built in ({builtin}) and no tools_dir is configured to install it in")]
    NoToolsDir { name: String, builtin: String },
    #[error(
        "unknown tool `{name}`: not built in ({builtin}) and not installed ({path} does not exist)"
    )]
    NotInstalled {
        name: String,
        builtin: String,
        path: String,
    },
    #[error("tool `{name}`: {path}: {message}")]
    Manifest {
        name: String,
        path: String,
        message: String,
    },
}

/// tool.toml.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    #[serde(default)]
    pub description: String,
    /// python | bash | sh (the sandbox runner's languages).
    pub language: String,
    /// Program file next to tool.toml; default tool.py (python) or tool.sh.
    #[serde(default)]
    pub entry: Option<String>,
    /// Arguments every call must give.
    #[serde(default)]
    pub args: Vec<String>,
    /// Project prefixes (or files) the tool may read, all staged as its inputs, and beneath
    /// which its outputs may land. `{{run_id}}` and `{{node}}` are replaced.
    pub allowed_paths: Vec<String>,
    /// Where its output files land; default `docs/artifacts/{{run_id}}/{{node}}`. Must lie
    /// under `allowed_paths`.
    #[serde(default)]
    pub output_prefix: Option<String>,
    /// Longest run.
    #[serde(default = "default_timeout")]
    pub timeout_s: u64,
    /// Replace project files its outputs collide with.
    #[serde(default)]
    pub overwrite: bool,
}

fn default_timeout() -> u64 {
    30
}

/// A loaded tool, ready to run.
#[derive(Clone, Debug)]
pub struct InstalledTool {
    pub name: String,
    pub manifest: Manifest,
    /// The program text (run as `<interpreter> -c <code>` on both backends).
    pub code: String,
    pub dir: PathBuf,
}

pub use cairn_graph::tools::valid_name;

/// The interpreter of a language (the same names the sandbox runner uses).
pub fn interpreter(language: &str) -> Option<&'static str> {
    match language {
        "python" => Some("python3"),
        "bash" => Some("bash"),
        "sh" => Some("sh"),
        _ => None,
    }
}

/// Replaces `{{run_id}}` and `{{node}}`.
pub fn render(text: &str, run_id: &str, node: &str) -> String {
    text.replace("{{run_id}}", run_id).replace("{{node}}", node)
}

/// Loads tool `name` from `tools_dir` ("" = none configured).
pub fn load(tools_dir: &str, name: &str, builtin: &str) -> Result<InstalledTool, ToolError> {
    if tools_dir.trim().is_empty() {
        return Err(ToolError::NoToolsDir {
            name: name.to_owned(),
            builtin: builtin.to_owned(),
        });
    }
    let dir = Path::new(tools_dir).join(name);
    let path = dir.join("tool.toml");
    let bad = |message: String| ToolError::Manifest {
        name: name.to_owned(),
        path: path.display().to_string(),
        message,
    };
    if !valid_name(name) {
        return Err(ToolError::NotInstalled {
            name: name.to_owned(),
            builtin: builtin.to_owned(),
            path: "(names of installed tools are [a-z0-9_-], 1-64 characters)".into(),
        });
    }
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ToolError::NotInstalled {
                name: name.to_owned(),
                builtin: builtin.to_owned(),
                path: path.display().to_string(),
            })
        }
        Err(e) => return Err(bad(e.to_string())),
    };
    let manifest: Manifest = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if interpreter(&manifest.language).is_none() {
        return Err(bad(format!(
            "language `{}` is not supported; use python, bash or sh",
            manifest.language
        )));
    }
    if manifest.allowed_paths.is_empty() {
        return Err(bad(
            "allowed_paths is empty: name the project prefixes the tool may read and write".into(),
        ));
    }
    if manifest.timeout_s == 0 {
        return Err(bad("timeout_s must be at least 1".into()));
    }
    let entry = manifest.entry.clone().unwrap_or_else(|| {
        if manifest.language == "python" {
            "tool.py".into()
        } else {
            "tool.sh".into()
        }
    });
    if entry.contains('/') || entry.starts_with('.') || entry.is_empty() {
        return Err(bad(format!(
            "entry `{entry}` must be a file name next to tool.toml"
        )));
    }
    let program = dir.join(&entry);
    let meta = std::fs::metadata(&program)
        .map_err(|e| bad(format!("entry {}: {e}", program.display())))?;
    if !meta.is_file() || meta.len() > MAX_PROGRAM_BYTES {
        return Err(bad(format!(
            "entry {} must be a file of at most {MAX_PROGRAM_BYTES} bytes",
            program.display()
        )));
    }
    let code = std::fs::read_to_string(&program)
        .map_err(|e| bad(format!("entry {}: {e}", program.display())))?;
    Ok(InstalledTool {
        name: name.to_owned(),
        manifest,
        code,
        dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn install(dir: &Path, name: &str, toml: &str, program: Option<(&str, &str)>) {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("tool.toml"), toml).unwrap();
        if let Some((file, text)) = program {
            std::fs::write(d.join(file), text).unwrap();
        }
    }

    #[test]
    fn loads_a_manifest_and_its_program() {
        let dir = tempfile::tempdir().unwrap();
        install(
            dir.path(),
            "wc",
            "language = \"python\"\nargs = [\"prefix\"]\nallowed_paths = [\"docs/\"]\n",
            Some(("tool.py", "print('{}')\n")),
        );
        let root = dir.path().to_str().unwrap();
        let t = load(root, "wc", "echo").unwrap();
        assert_eq!(t.manifest.timeout_s, 30);
        assert_eq!(t.code, "print('{}')\n");
        assert!(!t.manifest.overwrite);
    }

    #[test]
    fn refusals_say_what_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        assert!(load("", "x", "echo")
            .unwrap_err()
            .to_string()
            .contains("no tools_dir"));
        assert!(load(root, "x", "echo")
            .unwrap_err()
            .to_string()
            .contains("not installed"));
        assert!(load(root, "../etc", "echo").is_err());
        install(dir.path(), "nolang", "allowed_paths = [\"docs/\"]\n", None);
        assert!(load(root, "nolang", "")
            .unwrap_err()
            .to_string()
            .contains("language"));
        install(
            dir.path(),
            "ruby",
            "language = \"ruby\"\nallowed_paths = [\"docs/\"]\n",
            None,
        );
        assert!(load(root, "ruby", "")
            .unwrap_err()
            .to_string()
            .contains("not supported"));
        install(
            dir.path(),
            "noprog",
            "language = \"sh\"\nallowed_paths = [\"docs/\"]\n",
            None,
        );
        assert!(load(root, "noprog", "")
            .unwrap_err()
            .to_string()
            .contains("tool.sh"));
        install(
            dir.path(),
            "escape",
            "language = \"sh\"\nentry = \"../x\"\nallowed_paths = [\"docs/\"]\n",
            None,
        );
        assert!(load(root, "escape", "")
            .unwrap_err()
            .to_string()
            .contains("next to tool.toml"));
        install(
            dir.path(),
            "typo",
            "language = \"sh\"\nallowed = []\n",
            None,
        );
        assert!(load(root, "typo", "")
            .unwrap_err()
            .to_string()
            .contains("unknown field"));
    }

    #[test]
    fn names_and_templates() {
        assert!(valid_name("word-count_2"));
        assert!(!valid_name("Word"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(""));
        assert_eq!(
            render("docs/artifacts/{{run_id}}/{{node}}", "r1", "n"),
            "docs/artifacts/r1/n"
        );
    }
}
