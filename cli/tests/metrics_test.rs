//! `/metrics` of `cairn up` during real runs, read by Prometheus's own Python parser
//! (`prometheus_client.parser`): the documented series are there, and they move with the
//! calls, runs and writes made between two scrapes.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::io::BufRead;
use std::process::Stdio;
use std::time::Duration;

use common::{cairn, Killed};

/// Fetches `url` and parses it; prints one JSON object: families (name -> type) and samples
/// ([name, labels, value]).
const SCRAPE: &str = r#"
import json, sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
families, samples = {}, []
for f in text_string_to_metric_families(text):
    families[f.name] = f.type
    for s in f.samples:
        samples.append([s.name, s.labels, s.value])
print(json.dumps({"families": families, "samples": samples}))
"#;

/// Python 3 with prometheus_client (scripts/setup.sh installs it); CI
/// (CAIRN_REQUIRE_DOCKER=1) insists.
fn parser_present() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import prometheus_client.parser"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var("CAIRN_REQUIRE_DOCKER").as_deref() == Ok("1") {
            panic!("CAIRN_REQUIRE_DOCKER=1 but python3 with prometheus_client is missing (run scripts/setup.sh)");
        }
        println!("SKIP: python3 with prometheus_client is missing (run scripts/setup.sh)");
    }
    ok
}

struct Scrape {
    families: HashMap<String, String>,
    samples: Vec<(String, HashMap<String, String>, f64)>,
}

impl Scrape {
    fn take(url: &str) -> Scrape {
        let out = std::process::Command::new("python3")
            .args(["-c", SCRAPE, url])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the Prometheus parser refused /metrics: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let families = v["families"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, t)| (k.clone(), t.as_str().unwrap().to_owned()))
            .collect();
        let samples = v["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let labels = s[1]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, l)| (k.clone(), l.as_str().unwrap().to_owned()))
                    .collect();
                (
                    s[0].as_str().unwrap().to_owned(),
                    labels,
                    s[2].as_f64().unwrap(),
                )
            })
            .collect();
        Scrape { families, samples }
    }

    /// The sum of the samples named `name` whose labels include `with`.
    fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, labels, _)| {
                n == name
                    && with
                        .iter()
                        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }

    fn kind(&self, family: &str) -> &str {
        self.families
            .get(family)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("no family {family} in {:?}", self.families.keys()))
    }
}

/// `cairn up` with `/metrics` on a port of its choosing: (process, gRPC address, metrics URL).
fn up(data: &std::path::Path) -> (Killed, String, String) {
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("cairn"))
        .env_remove("CAIRN_ADDR")
        .env_remove("CAIRN_CONFIG")
        .env("RUST_LOG", "error")
        .env("CAIRN_ORCHESTRATOR_METRICS_LISTEN", "127.0.0.1:0")
        .arg("--data-root")
        .arg(data)
        .args(["up", "--listen", "127.0.0.1:0", "--no-console"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let up = Killed(child);
    let mut lines = std::io::BufReader::new(stderr).lines();
    let mut addr = None;
    let mut url = None;
    for line in lines.by_ref().map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix("cairn is up on ") {
            addr = rest.split_whitespace().next().map(str::to_owned);
        }
        if let Some(rest) = line.strip_prefix("metrics: ") {
            url = Some(rest.trim().to_owned());
            break;
        }
    }
    // Its later log lines are read and dropped: a closed pipe would end their writes.
    std::thread::spawn(move || lines.for_each(drop));
    (
        up,
        addr.expect("cairn up says where it listens"),
        url.expect("cairn up says where /metrics is"),
    )
}

const GATED: &str = "nodes:\n  - {id: draft, type: write_file, path: \"docs/{{run_id}}/d.txt\", content: draft}\n  - {id: review, type: gate, needs: [draft]}\n  - {id: after, type: write_file, path: \"docs/{{run_id}}/a.txt\", content: after, needs: [review]}\n";

#[test]
fn metrics_are_scraped_and_move_with_calls_runs_and_writes() {
    if !parser_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_up, addr, url) = up(&dir.path().join("data"));
    let graph = dir.path().join("gated.yaml");
    std::fs::write(&graph, GATED).unwrap();
    let cli = |args: &[&str]| {
        let out = cairn(dir.path())
            .args(["--addr", &addr, "--json"])
            .args(args)
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "cairn {args:?} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };

    let before = Scrape::take(&url);
    assert_eq!(before.kind("cairn_runs_stalled"), "gauge");
    assert_eq!(before.sum("cairn_runs_stalled", &[]), 0.0);

    // A run that waits at its gate: one run input-required, files written.
    let graph_arg = graph.to_str().unwrap();
    let waiting = cli(&["run", "--run-id", "m1", graph_arg]);
    assert_eq!(waiting["state"], "input-required", "{waiting}");
    let gated = Scrape::take(&url);
    let state = "cairn_run_state";
    assert_eq!(
        gated.sum("cairn_runs_active", &[(state, "input-required")]),
        1.0
    );
    let submit = [
        ("rpc_service", "cairn.v1.Orchestrator"),
        ("rpc_method", "SubmitRun"),
        ("rpc_grpc_status_code", "OK"),
    ];
    let submits = gated.sum("cairn_rpc_server_requests_total", &submit);
    assert!(submits >= 1.0, "Submit calls counted: {submits}");
    let written = gated.sum("cairn_store_written_bytes_total", &[]);
    assert!(written > 0.0, "bytes written counted: {written}");

    // The gate approved: the run completes, and writes one more file.
    let done = cli(&["gate", "approve", "m1", "review"]);
    assert!(done["state"].is_string(), "{done}");
    let mut after = Scrape::take(&url);
    for _ in 0..50 {
        if after.sum("cairn_runs_total", &[(state, "completed")]) >= 1.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        after = Scrape::take(&url);
    }
    assert_eq!(after.sum("cairn_runs_total", &[(state, "completed")]), 1.0);
    assert_eq!(
        after.sum("cairn_runs_active", &[(state, "input-required")]),
        0.0,
        "the finished run left the runs by state"
    );
    let any_ok = [("rpc_grpc_status_code", "OK")];
    assert!(
        after.sum("cairn_rpc_server_requests_total", &any_ok)
            > gated.sum("cairn_rpc_server_requests_total", &any_ok),
        "request counters grow with the calls"
    );
    assert!(after.sum("cairn_store_written_bytes_total", &[]) > written);

    // A refused call counts under its code.
    let out = cairn(dir.path())
        .args(["--addr", &addr, "gate", "approve", "nosuchrun", "review"])
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let refused = Scrape::take(&url);
    let errors: f64 = refused
        .samples
        .iter()
        .filter(|(n, l, _)| {
            n == "cairn_rpc_server_requests_total"
                && l.get("rpc_grpc_status_code").is_some_and(|c| c != "OK")
        })
        .map(|(_, _, v)| v)
        .sum();
    assert!(errors >= 1.0, "the refused call counted as an error");

    for (family, kind) in [
        ("cairn_rpc_server_requests", "counter"),
        ("cairn_rpc_server_duration_seconds", "histogram"),
        ("cairn_runs", "counter"),
        ("cairn_runs_active", "gauge"),
        ("cairn_runs_stalled", "gauge"),
        ("cairn_node_duration_seconds", "histogram"),
        ("cairn_store_written_bytes", "counter"),
        ("cairn_store_fsync_duration_seconds", "histogram"),
    ] {
        assert_eq!(refused.kind(family), kind, "{family}");
    }
}
