//! scripts/mutants.sh mutates the files behind cairn's security and durability promises. A
//! file renamed or split must not drop out of its scope unnoticed: every scope's files exist,
//! every critical file is in a scope, every scope names a workspace package, and
//! docs/testing.md's "Last result" table has a row for each scope (and none for a scope that
//! is gone).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The files the promises rest on: access and path rules, containment, the store's write,
/// commit and access paths, the client's publication tokens, server access and TLS identity,
/// the orchestrator's auth, the console's guard, provider keys, and each sandbox backend's
/// isolation set-up.
const CRITICAL: &[&str] = &[
    "crates/pathguard/src/lib.rs",
    "crates/contain/src/lib.rs",
    "services/artifact-store/src/write.rs",
    "services/artifact-store/src/events.rs",
    "services/artifact-store/src/deferred.rs",
    "services/artifact-store/src/access.rs",
    "services/artifact-store/src/publication.rs",
    "crates/store-client/src/lib.rs",
    "crates/server/src/access.rs",
    "crates/server/src/tls.rs",
    "crates/server/src/caller.rs",
    "crates/auth/src/lib.rs",
    "crates/console/src/guard.rs",
    "crates/agents/src/providers.rs",
    "services/sandbox-runner/src/backend/local.rs",
    "services/sandbox-runner/src/backend/docker_config.rs",
    "services/sandbox-runner/src/backend/gvisor_spec.rs",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

struct Scope {
    name: String,
    package: String,
    files: Vec<String>,
}

/// The `scopes=(...)` entries of the script: `"name|package|file file ..."`.
fn scopes(script: &str) -> Vec<Scope> {
    let (_, rest) = script.split_once("\nscopes=(\n").expect("a scopes=( array");
    let (body, _) = rest.split_once("\n)\n").expect("the end of scopes=(");
    body.lines()
        .map(|l| {
            let entry = l.trim().trim_matches('"');
            let mut parts = entry.split('|');
            let (Some(name), Some(package), Some(files), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                panic!("not a scope entry: {l}")
            };
            Scope {
                name: name.to_owned(),
                package: package.to_owned(),
                files: files.split_whitespace().map(str::to_owned).collect(),
            }
        })
        .collect()
}

/// `[name]=` keys of the `declare -A NAME=(` array.
fn keys(script: &str, array: &str) -> Vec<String> {
    let (_, rest) = script
        .split_once(&format!("declare -A {array}=("))
        .unwrap_or_else(|| panic!("a {array} array"));
    let body = &rest[..rest.find("\n)").unwrap_or(rest.len())];
    body.split('[')
        .skip(1)
        .filter_map(|k| k.split_once("]=").map(|(k, _)| k.to_owned()))
        .collect()
}

/// The files a scope's pattern names: a path, or `dir/*.ext`.
fn expand(pattern: &str) -> Vec<String> {
    match pattern.rsplit_once("/*") {
        Some((dir, ext)) => {
            assert!(!dir.contains('*'), "only `dir/*.ext` patterns: {pattern}");
            let mut out: Vec<String> = std::fs::read_dir(root().join(dir))
                .unwrap_or_else(|e| panic!("{pattern}: {e}"))
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(ext))
                .map(|n| format!("{dir}/{n}"))
                .collect();
            out.sort();
            out
        }
        None => {
            assert!(!pattern.contains(['*', '?', '[']), "a glob: {pattern}");
            vec![pattern.to_owned()]
        }
    }
}

fn workspace_packages() -> BTreeSet<String> {
    let ws: toml::Value = toml::from_str(&read("Cargo.toml")).unwrap();
    ws["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let manifest: toml::Value =
                toml::from_str(&read(&format!("{}/Cargo.toml", m.as_str().unwrap()))).unwrap();
            manifest["package"]["name"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[test]
fn every_scope_names_files_that_exist_in_a_workspace_package() {
    let script = read("scripts/mutants.sh");
    let scopes = scopes(&script);
    assert!(scopes.len() >= 10, "{} scopes", scopes.len());
    let packages = workspace_packages();
    let mut names = BTreeSet::new();
    for s in &scopes {
        assert!(names.insert(s.name.clone()), "scope {} twice", s.name);
        assert!(
            packages.contains(&s.package),
            "scope {}: no workspace package {}",
            s.name,
            s.package
        );
        assert!(!s.files.is_empty(), "scope {} has no files", s.name);
        for pattern in &s.files {
            let files = expand(pattern);
            assert!(
                !files.is_empty(),
                "scope {}: {pattern} matches nothing",
                s.name
            );
            for f in files {
                assert!(
                    root().join(&f).is_file(),
                    "scope {}: {f} does not exist (renamed or moved? update scripts/mutants.sh)",
                    s.name
                );
            }
        }
    }
    for key in keys(&script, "narrow") {
        assert!(names.contains(&key), "narrow[{key}]: no such scope");
    }
    let groups = script
        .split_once("declare -A groups=(")
        .expect("a groups array")
        .1
        .split_once(')')
        .unwrap()
        .0;
    for member in groups
        .split('"')
        .skip(1)
        .step_by(2)
        .flat_map(str::split_whitespace)
    {
        assert!(
            names.contains(member),
            "group member {member}: no such scope"
        );
    }
}

#[test]
fn every_critical_file_is_mutated_by_some_scope() {
    let covered: BTreeSet<String> = scopes(&read("scripts/mutants.sh"))
        .iter()
        .flat_map(|s| s.files.iter().flat_map(|p| expand(p)))
        .collect();
    for f in CRITICAL {
        assert!(root().join(f).is_file(), "{f} is gone: update this list");
        assert!(
            covered.contains(*f),
            "{f} is in no scope of scripts/mutants.sh"
        );
    }
}

#[test]
fn the_last_result_table_has_one_row_per_scope() {
    let names: BTreeSet<String> = scopes(&read("scripts/mutants.sh"))
        .into_iter()
        .map(|s| s.name)
        .collect();
    let doc = read("docs/testing.md");
    let (_, table) = doc
        .split_once("### Last result")
        .expect("a `### Last result` section in docs/testing.md");
    let rows: Vec<String> = table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| l.split('|').nth(1).unwrap_or_default().trim().to_owned())
        .collect();
    let in_table: BTreeSet<String> = rows.iter().cloned().collect();
    assert_eq!(rows.len(), in_table.len(), "a scope twice in the table");
    assert_eq!(
        in_table, names,
        "docs/testing.md's Last result table and the scripts/mutants.sh scopes differ"
    );
}
