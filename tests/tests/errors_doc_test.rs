//! docs/errors.md lists every reason word the code sends, and only those: the words of the
//! protos' vocabulary, the words of each service's error mapping (`fn reason`), of pathguard,
//! and those passed to `cairn_proto::reason::status*` by name, are all in its table; every
//! word in the table occurs in the code.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn is_word(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

/// The words of the table's first column (`| \`word\` | CODE | ... |`), and the words named
/// in the closing paragraph as block-only words.
fn documented() -> BTreeSet<String> {
    let doc = read("docs/errors.md");
    let (_, words) = doc
        .split_once("## Reason words")
        .expect("a `## Reason words` section");
    let mut out = BTreeSet::new();
    for line in words.lines() {
        let Some(cell) = line.strip_prefix("| `") else {
            continue;
        };
        let word = cell.split('`').next().unwrap_or_default();
        assert!(is_word(word), "not a reason word: {line}");
        assert!(out.insert(word.to_owned()), "{word} is listed twice");
    }
    let tail = words
        .rsplit_once("Ingest also uses")
        .expect("block words")
        .1;
    out.extend(tail.split('`').skip(1).step_by(2).map(str::to_owned));
    out
}

/// Quoted lower-case words in `text`.
fn quoted(text: &str) -> Vec<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| is_word(s))
        .map(str::to_owned)
        .collect()
}

/// The body of `fn <name>(` in `text` (to the first line that closes at its indentation).
fn body<'a>(text: &'a str, name: &str) -> &'a str {
    let start = text
        .find(&format!("fn {name}("))
        .unwrap_or_else(|| panic!("no fn {name}"));
    let rest = &text[start..];
    let end = rest.find("\n    }\n").unwrap_or(rest.len());
    &rest[..end]
}

/// The reason argument (third) of every `reason::status(` / `status_with(` / `detailed(` call
/// that passes it as a literal.
fn passed(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for call in [
        "reason::status(",
        "reason::status_with(",
        "reason::detailed(",
    ] {
        for (i, _) in text.match_indices(call) {
            let mut depth = 1;
            let mut args = vec![String::new()];
            let mut in_str = false;
            for c in text[i + call.len()..].chars() {
                match c {
                    '"' => in_str = !in_str,
                    '(' | '[' | '{' if !in_str => depth += 1,
                    ')' | ']' | '}' if !in_str => depth -= 1,
                    ',' if !in_str && depth == 1 => {
                        args.push(String::new());
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if let Some(a) = args.last_mut() {
                    a.push(c);
                }
            }
            if let Some(word) = args
                .get(2)
                .and_then(|a| a.trim().strip_prefix('"').and_then(|s| s.strip_suffix('"')))
            {
                if is_word(word) {
                    out.push(word.to_owned());
                }
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() && p.file_name().is_some_and(|n| n != "tests" && n != "target") {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn sources() -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    for dir in ["services", "crates"] {
        rust_files(&root().join(dir), &mut files);
    }
    files
        .into_iter()
        .map(|p| {
            let t = std::fs::read_to_string(&p).unwrap();
            (p, t)
        })
        .collect()
}

#[test]
fn every_reason_word_the_code_sends_is_in_the_table() {
    let doc = documented();
    let mut sent: BTreeSet<String> = BTreeSet::new();
    // The protos' vocabulary (common.proto's header).
    let proto = read("proto/cairn/v1/common.proto");
    let vocab = proto
        .split_once("// Reason vocabulary")
        .and_then(|(_, r)| r.split_once("where nothing more precise applies"))
        .expect("the vocabulary in common.proto")
        .0;
    let mut plain = String::new();
    let mut depth = 0;
    for c in vocab.replace("//", " ").chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    for item in plain.split([',', '.']) {
        let item = item.trim();
        let item = item.strip_prefix("and ").unwrap_or(item);
        let first = item.split_whitespace().next();
        if let Some(word) = first.filter(|w| is_word(w) && *w != "and") {
            sent.insert(word.to_owned());
        }
    }
    for file in [
        "services/artifact-store/src/error.rs",
        "services/sandbox-runner/src/error.rs",
    ] {
        sent.extend(quoted(body(&read(file), "reason")));
    }
    sent.extend(quoted(body(&read("crates/proto/src/lib.rs"), "fallback")));
    sent.extend(quoted(body(
        &read("crates/pathguard/src/reason.rs"),
        "as_str",
    )));
    for (_, text) in sources() {
        sent.extend(passed(&text));
    }
    let missing: Vec<_> = sent.difference(&doc).collect();
    assert!(
        missing.is_empty(),
        "reason words sent but not in docs/errors.md: {missing:?}"
    );
}

#[test]
fn every_word_in_the_table_occurs_in_the_code() {
    let all: String = sources().into_iter().map(|(_, t)| t).collect();
    let dead: Vec<_> = documented()
        .into_iter()
        .filter(|w| !all.contains(&format!("\"{w}\"")))
        .collect();
    assert!(
        dead.is_empty(),
        "docs/errors.md lists words no code sends: {dead:?}"
    );
}
