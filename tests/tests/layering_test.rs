//! The workspace's shape, checked from its manifests and sources: which crate may depend on
//! which, and how large the orchestrator's core may grow. A newcomer reads the rules here; a
//! change that breaks one fails with the rule it broke.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Most lines of Rust in `services/orchestrator/src`, and in any one crate's `src`.
const MAX_CORE_LINES: usize = 12_000;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every workspace package: name -> (directory, normal dependencies).
fn packages() -> BTreeMap<String, (PathBuf, Vec<String>)> {
    let root = root();
    let ws: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let mut out = BTreeMap::new();
    for m in ws["workspace"]["members"].as_array().unwrap() {
        let dir = root.join(m.as_str().unwrap());
        let manifest: toml::Value =
            toml::from_str(&std::fs::read_to_string(dir.join("Cargo.toml")).unwrap()).unwrap();
        let name = manifest["package"]["name"].as_str().unwrap().to_owned();
        let deps = manifest
            .get("dependencies")
            .and_then(|d| d.as_table())
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        out.insert(name, (dir, deps));
    }
    out
}

fn rust_lines(dir: &Path) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            n += rust_lines(&path);
        } else if path.extension().is_some_and(|e| e == "rs") {
            n += std::fs::read_to_string(&path).unwrap().lines().count();
        }
    }
    n
}

const SERVICES: &[&str] = &[
    "cairn-artifact-store",
    "cairn-ingest",
    "cairn-sandbox-runner",
    "cairn-orchestrator",
];

#[test]
fn the_graph_language_is_pure() {
    let pkgs = packages();
    let (_, deps) = &pkgs["cairn-graph"];
    for banned in [
        "tokio",
        "tonic",
        "reqwest",
        "axum",
        "cairn-proto",
        "cairn-server",
    ] {
        assert!(
            !deps.iter().any(|d| d == banned),
            "cairn-graph depends on {banned}; the graph language has no runtime, RPC or I/O"
        );
    }
    let cairn: Vec<&String> = deps.iter().filter(|d| d.starts_with("cairn-")).collect();
    assert!(
        cairn.is_empty(),
        "cairn-graph depends on {cairn:?}; it may depend on pathguard and data crates only"
    );
}

#[test]
fn no_crate_depends_on_a_service_but_the_apps() {
    // Services are composed by the CLI and tested end to end; no library may reach into one.
    let apps = ["cairn-cli", "cairn-e2e", "cairn-bench"];
    for (name, (_, deps)) in packages() {
        if apps.contains(&name.as_str()) {
            continue;
        }
        let services: Vec<&String> = deps
            .iter()
            .filter(|d| SERVICES.contains(&d.as_str()))
            .collect();
        assert!(
            services.is_empty(),
            "{name} depends on the service crates {services:?}; depend on the protos and client crates instead"
        );
    }
}

#[test]
fn node_kinds_depend_on_the_node_api_not_on_each_other() {
    let pkgs = packages();
    let kinds = [
        "cairn-code-delivery",
        "cairn-delivery",
        "cairn-phases",
        "cairn-tools",
        "cairn-external-agents",
    ];
    for k in kinds {
        let (_, deps) = &pkgs[k];
        assert!(
            deps.iter().any(|d| d == "cairn-node"),
            "{k} must implement cairn-node's Kind"
        );
        for d in deps {
            // code delivery hands archives to delivery targets: the one allowed edge.
            let allowed = k == "cairn-code-delivery" && d == "cairn-delivery";
            assert!(
                allowed || !kinds.contains(&d.as_str()),
                "{k} depends on the kind crate {d}"
            );
        }
    }
    // The core knows kinds only where it registers them.
    let core = root().join("services/orchestrator/src");
    for entry in walk(&core) {
        let rel = entry
            .strip_prefix(&core)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel == "nodes/mod.rs" || rel == "config.rs" {
            continue;
        }
        let mut text = std::fs::read_to_string(&entry).unwrap();
        // Result contracts apply to every node (`result:`), so the core prepares and keeps them,
        // with the files the graph names (read at submit).
        for allowed in [
            "cairn_phases::prepare(",
            "cairn_phases::contracts::",
            "cairn_phases::inputs::",
        ] {
            text = text.replace(allowed, "");
        }
        for k in kinds {
            let module = k.replace('-', "_");
            assert!(
                !text.contains(&format!("{module}::")),
                "services/orchestrator/src/{rel} uses {module}; the core reaches kinds through the registry (nodes/mod.rs)"
            );
        }
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

#[test]
fn the_console_is_a_client() {
    let pkgs = packages();
    let (_, deps) = &pkgs["cairn-console"];
    let cairn: Vec<&String> = deps.iter().filter(|d| d.starts_with("cairn-")).collect();
    for d in &cairn {
        assert!(
            [
                "cairn-proto",
                "cairn-server",
                "cairn-telemetry",
                "cairn-sha256",
                "cairn-evidence"
            ]
            .contains(&d.as_str()),
            "cairn-console depends on {d}; it talks to the services over gRPC only"
        );
    }
}

#[test]
fn no_crate_outgrows_the_bound() {
    for (name, (dir, _)) in packages() {
        let src = dir.join("src");
        if !src.exists() {
            continue;
        }
        let n = rust_lines(&src);
        assert!(
            n <= MAX_CORE_LINES,
            "{name} has {n} lines of Rust in src/; split it (at most {MAX_CORE_LINES})"
        );
    }
}

#[test]
fn every_crate_says_what_it_is_for() {
    for (name, (dir, _)) in packages() {
        let lib = dir.join("src/lib.rs");
        if !lib.exists() {
            continue;
        }
        let text = std::fs::read_to_string(&lib).unwrap();
        assert!(
            text.trim_start().starts_with("//!"),
            "{name}: src/lib.rs must open with a //! comment saying what the crate is for"
        );
    }
}
