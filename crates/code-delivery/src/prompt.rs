//! What the code delivery agent is told: the system prompt (tools, rules, suggested excludes
//! and the documentation rule) and the task message, which always states
//! where the workspace came from, so the model never loses that context.

/// Where the workspace starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Empty,
    Git { url: String, git_ref: String },
}

impl Source {
    /// `source_type=git, git_url=..., git_ref=...` or `source_type=empty`.
    pub fn line(&self) -> String {
        match self {
            Source::Empty => "source_type=empty".into(),
            Source::Git { url, git_ref } => {
                let r = if git_ref.is_empty() {
                    "(default branch)"
                } else {
                    git_ref
                };
                format!("source_type=git, git_url={url}, git_ref={r}")
            }
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            Source::Empty => "empty",
            Source::Git { .. } => "git",
        }
    }
}

/// Excludes suggested to the model (not enforced).
pub const SUGGESTED_EXCLUDES: [&str; 7] = [
    ".git/**",
    ".venv/**",
    "__pycache__/**",
    ".pytest_cache/**",
    "node_modules/**",
    ".mypy_cache/**",
    ".ruff_cache/**",
];

pub fn system(source: &Source, max_iterations: u32, target: &str) -> String {
    let docs = match source {
        Source::Empty => "The workspace starts EMPTY, so you must also write a non-empty README.md at the workspace root and documentation of how to install, use and run the project (a docs/ directory, or a usage/running section in README.md). `end` is refused until both exist.",
        Source::Git { .. } => "Keep the project's documentation current with your changes (at least how to use and run it).",
    };
    format!(
        "You are a code delivery agent. You write code in a sandboxed Linux container, run it to verify it works, and deliver the result as an archive.\n\
         \n\
         The project lives in /workspace (your tools take paths relative to it); /tmpfs is scratch space. Tools:\n\
         - read, write, glob, grep: files of /workspace.\n\
         - run_bash_command: runs `bash -lc <command>` in the container (build, test, run). Check exit_code.\n\
         - todo: your to-do board (add, list, update, remove, clear); use it to plan and track longer tasks.\n\
         - end: when the work is complete, packs /workspace, leaving out what exclude_patterns match, and delivers it to {target}. Suggested exclude_patterns: {excludes}.\n\
         \n\
         Rules:\n\
         - Verify your work with run_bash_command before calling end.\n\
         - {docs}\n\
         - The delivery must contain code and documentation, not code alone.\n\
         - You have at most {max_iterations} turns; call `end` exactly once, before they run out.\n\
         - A tool error is a message for you: read it, fix the call, go on.",
        excludes = SUGGESTED_EXCLUDES.join(", "),
    )
}

/// The task message: the source first, then the task. `commit` is the
/// checked-out commit of a git source.
pub fn task(source: &Source, commit: &str, prompt: &str) -> String {
    let start = match source {
        Source::Empty => {
            "The workspace /workspace is empty: create the project from scratch.".to_owned()
        }
        Source::Git { .. } => {
            format!("The repository is cloned into /workspace, commit {commit} checked out.")
        }
    };
    format!(
        "Initial source: {}\n{start}\n\nTask:\n{prompt}",
        source.line()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_is_stated_explicitly() {
        let git = Source::Git {
            url: "/srv/repo.git".into(),
            git_ref: "feature".into(),
        };
        let t = task(&git, "abc123", "add a CLI");
        assert!(t.contains("commit abc123 checked out"), "{t}");
        assert!(
            t.starts_with(
                "Initial source: source_type=git, git_url=/srv/repo.git, git_ref=feature\n"
            ),
            "{t}"
        );
        assert!(t.ends_with("Task:\nadd a CLI"));
        assert!(task(&Source::Empty, "", "x").starts_with("Initial source: source_type=empty\n"));
        assert!(system(&Source::Empty, 9, "group:1").contains("README.md"));
        assert!(system(&git, 9, "group:1").contains(".git/**"));
    }
}
