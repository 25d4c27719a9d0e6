//! `/metrics` of `cairn up` during real runs, read by Prometheus's own Python parser
//! (`prometheus_client.parser`): the documented series are there, and they move with the
//! calls, runs and writes made between two scrapes; every series of the table in
//! docs/operations.md ("Metrics") is scraped with its documented type and moves when runs
//! queue, stall, run sandboxes, are refused a sandbox and are adopted after a restart.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::io::BufRead;
use std::process::Stdio;
use std::time::Duration;

use common::{cairn, sandbox_available, Killed};

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
    up_with(data, &[])
}

/// [`up`] with more environment (settings of the services it hosts).
fn up_with(data: &std::path::Path, env: &[(&str, &str)]) -> (Killed, String, String) {
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("cairn"))
        .env_remove("CAIRN_ADDR")
        .env_remove("CAIRN_CONFIG")
        .env("RUST_LOG", "error")
        .envs(env.iter().copied())
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

/// The series of the metrics table in docs/operations.md: (family as the parser names it,
/// documented type).
fn documented_series() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/operations.md"
    ))
    .unwrap();
    let table = doc
        .split("\n| series | type |")
        .nth(1)
        .expect("the metrics table of docs/operations.md");
    let mut out = Vec::new();
    for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let name = cells[1].split('`').nth(1).unwrap().to_owned();
        let kind = cells[2].to_owned();
        // The parser names a counter's family without its `_total`.
        let family = match kind.as_str() {
            "counter" => name.trim_end_matches("_total").to_owned(),
            _ => name,
        };
        out.push((family, kind));
    }
    assert!(out.len() >= 15, "{out:?}");
    out
}

/// Waits until the run `id` ends; its JSON.
fn wait_end(cli: &dyn Fn(&[&str]) -> serde_json::Value, id: &str) -> serde_json::Value {
    for _ in 0..600 {
        let shown = cli(&["runs", "show", id]);
        let state = shown["state"].as_str().unwrap_or_default().to_owned();
        if ["completed", "failed", "canceled", "input-required"].contains(&state.as_str()) {
            return shown;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("run {id} did not end or wait within 120 s");
}

/// Every series the docs list, scraped with its documented type while runs queue, run
/// sandboxes (from a warm pool), are refused a sandbox, stall and are adopted after a
/// restart; each
/// moves (a sample above zero in some scrape). `cairn_runs_healed_total` is left to
/// heal_test (a run without a live driver inside a live process is not made from outside).
#[test]
fn every_documented_series_is_scraped_with_its_type_and_moves() {
    if !parser_present() {
        return;
    }
    if !sandbox_available() {
        println!("SKIP: every_documented_series...: no Docker with cairn-sandbox:latest");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let env = [
        ("CAIRN_ORCHESTRATOR_STALL_AFTER_S", "1"),
        ("CAIRN_ORCHESTRATOR_MAX_PARALLEL_RUNS", "1"),
        ("CAIRN_SANDBOX_RUNNER_BACKEND", "docker"),
        ("CAIRN_SANDBOX_RUNNER_POOL_SIZE", "1"),
        ("CAIRN_SANDBOX_RUNNER_MAX_CONCURRENT_RUNS", "1"),
        ("CAIRN_SANDBOX_RUNNER_QUEUE_DEPTH", "0"),
    ];
    let (up1, addr, url) = up_with(&data, &env);
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let stall = file(
        "stall.yaml",
        "nodes:\n  - {id: nap, type: sandbox_run, language: python, timeout_s: 60, code: 'import time; time.sleep(4)'}\n",
    );
    let refused = file(
        "refused.yaml",
        "nodes:\n  - {id: p1, type: sandbox_run, language: python, timeout_s: 60, retry: {max_attempts: 6}, code: 'import time; time.sleep(2)'}\n  - {id: p2, type: sandbox_run, language: python, timeout_s: 60, retry: {max_attempts: 6}, code: 'import time; time.sleep(2)'}\n",
    );
    let gated = file("gated.yaml", GATED);
    let mut scrapes = Vec::new();
    {
        let addr = addr.clone();
        let cli = |args: &[&str]| -> serde_json::Value {
            let out = cairn(dir.path())
                .args(["--addr", &addr, "--json"])
                .args(args)
                .timeout(Duration::from_secs(120))
                .output()
                .unwrap();
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "cairn {args:?} printed no JSON ({e}): {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
        };
        // Two sandbox steps at once on a runner that takes one: one is refused (and retried).
        // Meanwhile the run holds the only run slot, so the next run queues.
        cli(&["run", "--detach", "--run-id", "r1", &refused]);
        cli(&["run", "--detach", "--run-id", "s1", &stall]);
        let queued = (0..100).find_map(|_| {
            let now = Scrape::take(&url);
            let q = now.sum("cairn_runs_queued", &[]);
            scrapes.push(now);
            std::thread::sleep(Duration::from_millis(50));
            (q >= 1.0).then_some(q)
        });
        assert_eq!(queued, Some(1.0), "the second run never showed as queued");
        wait_end(&cli, "r1");
        // Then a sandbox step silent past stall_after_s: reported stalled while it runs.
        let mut seen_stalled = false;
        for _ in 0..200 {
            let now = Scrape::take(&url);
            seen_stalled |= now.sum("cairn_runs_stalled", &[]) >= 1.0;
            scrapes.push(now);
            if seen_stalled {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(seen_stalled, "the stalled-runs gauge never showed a run");
        assert_eq!(wait_end(&cli, "s1")["state"], "completed");
        cli(&["run", "--detach", "--run-id", "g1", &gated]);
        assert_eq!(wait_end(&cli, "g1")["state"], "input-required");
        scrapes.push(Scrape::take(&url));
    }
    // kill -9 and start again: the unfinished runs are adopted at start-up.
    drop(up1);
    let (_up2, addr, url) = up_with(&data, &env);
    let cli = |args: &[&str]| -> serde_json::Value {
        let out = cairn(dir.path())
            .args(["--addr", &addr, "--json"])
            .args(args)
            .timeout(Duration::from_secs(120))
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    };
    assert_eq!(wait_end(&cli, "g1")["state"], "input-required");
    cli(&["gate", "approve", "g1", "review"]);
    assert_eq!(wait_end(&cli, "g1")["state"], "completed");
    scrapes.push(Scrape::take(&url));

    let mut missing = Vec::new();
    for (family, kind) in documented_series() {
        let typed = scrapes
            .iter()
            .any(|s| s.families.get(&family) == Some(&kind));
        let moved = scrapes.iter().any(|s| {
            s.samples
                .iter()
                .any(|(n, _, v)| n.starts_with(&family) && *v > 0.0)
        });
        let exempt = family == "cairn_runs_healed";
        if !(exempt || typed && moved) {
            let found: Vec<_> = scrapes
                .iter()
                .filter_map(|s| s.families.get(&family))
                .collect();
            missing.push(format!(
                "{family} ({kind}): typed {typed} moved {moved}, seen as {found:?}"
            ));
        }
    }
    assert!(
        missing.is_empty(),
        "documented series not scraped as documented:\n{}",
        missing.join("\n")
    );
}
