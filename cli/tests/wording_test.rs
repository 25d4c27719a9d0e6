//! What users and models read never cites documents they do not have (planning documents,
//! their section numbers): the help of every command, the docs, protos and examples, the run
//! directory of a real run, and every source file (comments included; tests may say where a
//! rule came from).
#![allow(clippy::unwrap_used)]

mod common;

use common::cairn;

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The first citation in `text`, if any: a planning document by name or number, or a bare
/// section sign (public standards keep theirs: `RFC 9110 §10.2.3`).
fn citation(text: &str) -> Option<String> {
    let lower = text.to_lowercase();
    for (i, _) in lower.match_indices("seed") {
        let rest = &lower[i + 4..];
        let cites = rest.starts_with("'s ")
            || rest.trim_start().starts_with(|c: char| c.is_ascii_digit())
            || lower[..i].ends_with("shared/");
        if cites {
            return Some(text[i..(i + 30).min(text.len())].to_owned());
        }
    }
    if let Some(i) = text.find("DESIGN.md") {
        return Some(text[i..].chars().take(30).collect());
    }
    for (i, _) in text.match_indices('§') {
        let before = &text[..i];
        let standard = before
            .rfind("RFC ")
            .is_some_and(|r| before[r + 4..].trim().chars().all(|c| c.is_ascii_digit()));
        if !standard {
            let start = before.char_indices().rev().nth(20).map_or(0, |(n, _)| n);
            return Some(text[start..].chars().take(40).collect());
        }
    }
    None
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    walk_all(dir, out, false)
}

fn walk_all(dir: &Path, out: &mut Vec<PathBuf>, hidden: bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            // Tests may name where a rule came from; build output is not ours.
            if name != "tests" && name != "target" && (hidden || !name.starts_with('.')) {
                walk_all(&p, out, hidden);
            }
        } else {
            out.push(p);
        }
    }
}

#[test]
fn the_citation_check_finds_what_it_must() {
    assert!(citation("see seed 003 §7.4").is_some());
    assert!(citation("The seed's keys").is_some());
    assert!(citation("as DESIGN.md decides").is_some());
    assert!(citation("a random seed for the pool").is_none());
    assert!(citation("seeded by cp").is_none());
    assert!(citation("a missing result is failed (§6.1)").is_some());
    assert!(citation("an HTTP date (RFC 9110 §10.2.3)").is_none());
    assert!(citation("path: docs/{{run_id}}/design.md").is_none());
    assert!(citation("the fuzz corpus seeds/*").is_none());
}

#[test]
fn docs_protos_examples_and_sources_cite_nothing() {
    let root = root();
    let mut files = Vec::new();
    for dir in [
        "docs", "proto", "examples", "crates", "services", "cli/src", "deploy", "scripts",
    ] {
        walk(&root.join(dir), &mut files);
    }
    files.push(root.join("README.md"));
    let mut found = Vec::new();
    for f in files {
        let ext = f.extension().map(|e| e.to_string_lossy().into_owned());
        let text_file = matches!(
            ext.as_deref(),
            Some(
                "rs" | "md"
                    | "proto"
                    | "yaml"
                    | "yml"
                    | "toml"
                    | "json"
                    | "sh"
                    | "py"
                    | "html"
                    | "css"
                    | "js"
            )
        );
        if !text_file {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if let Some(c) = citation(line) {
                found.push(format!(
                    "{}:{}: {c}",
                    f.strip_prefix(&root).unwrap().display(),
                    n + 1
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "citations of internal documents:\n{}",
        found.join("\n")
    );
}

/// The subcommands a help text lists.
fn subcommands(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in help.lines() {
        if line.starts_with("Commands:") {
            inside = true;
            continue;
        }
        if inside {
            if !line.starts_with("  ") {
                break;
            }
            let name = line.split_whitespace().next().unwrap_or_default();
            if name != "help" {
                out.push(name.to_owned());
            }
        }
    }
    out
}

#[test]
fn the_help_of_every_command_cites_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue: Vec<Vec<String>> = vec![vec![]];
    let mut seen = 0;
    while let Some(path) = queue.pop() {
        let out = cairn(dir.path())
            .args(&path)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "cairn {path:?} --help");
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(citation(&help), None, "cairn {} --help", path.join(" "));
        seen += 1;
        for sub in subcommands(&help) {
            let mut next = path.clone();
            next.push(sub);
            queue.push(next);
        }
    }
    assert!(seen > 20, "only {seen} help texts were read");
}

#[test]
fn the_run_directory_of_a_real_run_cites_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cassette = root().join("examples/modes/self_critique.yaml");
    cairn(&data)
        .args([
            "run",
            "--mode",
            "self_critique",
            "--prompt",
            "Write a word-count tool",
            "--llm",
        ])
        .arg(format!("replay:{}", cassette.display()))
        .assert()
        .success();
    let mut files = Vec::new();
    walk_all(&data, &mut files, true);
    let runs: Vec<&PathBuf> = files
        .iter()
        .filter(|f| {
            f.to_string_lossy().contains("/.cairn/runs/") || f.to_string_lossy().contains("/docs/")
        })
        .collect();
    assert!(runs.len() > 5, "{runs:?}");
    for f in runs {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        assert_eq!(citation(&text), None, "{}", f.display());
    }
}
