//! Telemetry across real processes (issue 7 §4): the four services run as `cairn serve`
//! children on 127.0.0.1, each exporting to an OTLP receiver started here (the collector's
//! trace and metrics gRPC services), and `cairn run` submits a graph that writes a document
//! (ingest hook: orchestrator -> ingest -> artifact-store) and runs its code in a sandbox
//! (orchestrator -> runner). Then: every span of every process is in one trace, the spans form
//! one tree whose root is the CLI's, each service contributed, cairn's ids are attributes,
//! the services' log lines carry the trace id, and the metrics arrived.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::procs::{sandbox_backend, wait_for, Proc};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point;

const SERVICES: [&str; 4] = [
    "cairn-orchestrator",
    "cairn-ingest",
    "cairn-artifact-store",
    "cairn-sandbox-runner",
];

const GRAPH: &str = r#"
version: 1
title: traced
nodes:
  - id: design
    type: write_file
    path: "docs/{{run_id}}/design.md"
    content: |
      # Design

      ```python file=traced/hello.py
      print("hello from the sandbox")
      ```
  - id: check
    type: sandbox_run
    needs: [design]
    language: python
    input_files: ["workspace/traced/"]
    allowed_prefixes: ["workspace/traced/", "docs/"]
    timeout_s: 60
    code: |
      import runpy
      runpy.run_path("/input/workspace/traced/hello.py")
      open("/output/checked.txt", "w").write("ok")
"#;

// ---------------------------------------------------------------- the OTLP receiver

/// One exported span, flattened.
#[derive(Clone, Debug)]
struct GotSpan {
    service: String,
    name: String,
    trace: String,
    id: String,
    parent: String,
    attrs: HashMap<String, String>,
}

/// One data point of an exported metric.
#[derive(Clone, Debug)]
struct GotPoint {
    service: String,
    metric: String,
    attrs: HashMap<String, String>,
    /// The sum's value or the histogram's count.
    value: f64,
}

#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<GotSpan>>>,
    points: Arc<Mutex<Vec<GotPoint>>>,
}

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attrs(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

fn service_of(r: &Option<opentelemetry_proto::tonic::resource::v1::Resource>) -> String {
    r.as_ref()
        .map(|r| attrs(&r.attributes))
        .and_then(|a| a.get("service.name").cloned())
        .unwrap_or_default()
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = service_of(&rs.resource);
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                got.push(GotSpan {
                    service: service.clone(),
                    name: span.name.clone(),
                    trace: hex(&span.trace_id),
                    id: hex(&span.span_id),
                    parent: hex(&span.parent_span_id),
                    attrs: attrs(&span.attributes),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let mut got = self.points.lock().unwrap();
        for rm in request.into_inner().resource_metrics {
            let service = service_of(&rm.resource);
            for m in rm.scope_metrics.into_iter().flat_map(|s| s.metrics) {
                let mut push = |a: &[KeyValue], value: f64| {
                    got.push(GotPoint {
                        service: service.clone(),
                        metric: m.name.clone(),
                        attrs: attrs(a),
                        value,
                    })
                };
                match &m.data {
                    Some(Data::Sum(s)) => {
                        for p in &s.data_points {
                            let v = match p.value {
                                Some(number_data_point::Value::AsInt(i)) => i as f64,
                                Some(number_data_point::Value::AsDouble(d)) => d,
                                None => 0.0,
                            };
                            push(&p.attributes, v);
                        }
                    }
                    Some(Data::Histogram(h)) => {
                        for p in &h.data_points {
                            push(&p.attributes, p.count as f64);
                        }
                    }
                    _ => push(&[], 0.0),
                }
            }
        }
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Serves the receiver on a loopback port; returns its endpoint URL.
async fn start_receiver(r: Receiver) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(r.clone()))
            .add_service(MetricsServiceServer::new(r))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    format!("http://{addr}")
}

// ---------------------------------------------------------------- the processes

fn cairn(otlp: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
    for k in [
        "CAIRN_ADDR",
        "CAIRN_PROJECT",
        "CAIRN_TRACE_FILTER",
        "OTEL_SERVICE_NAME",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "OTEL_METRICS_EXPORTER",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
    ] {
        c.env_remove(k);
    }
    c.env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("OTEL_METRIC_EXPORT_INTERVAL", "300")
        .env("CAIRN_LOG_FORMAT", "json")
        .env("RUST_LOG", "info");
    c
}

// ---------------------------------------------------------------- the test

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_run_is_one_trace_across_all_services_with_logs_and_metrics() {
    let Some(backend) = sandbox_backend() else {
        println!("SKIP: one_run_is_one_trace...: neither Docker with cairn-sandbox:latest nor bubblewrap is available");
        return;
    };
    let received = Receiver::default();
    let otlp = start_receiver(received.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = |p: &str| dir.path().join(p).display().to_string();

    let mut store = {
        let mut c = cairn(&otlp);
        c.args([
            "serve",
            "artifact-store",
            "--listen",
            "127.0.0.1:0",
            "--data-root",
        ])
        .arg(path("data"));
        Proc::spawn("artifact-store", c)
    };
    let store_addr = store.wait_addr();
    let mut ingest = {
        let mut c = cairn(&otlp);
        c.args(["serve", "ingest", "--listen", "127.0.0.1:0", "--store-addr"])
            .arg(format!("http://{store_addr}"));
        Proc::spawn("ingest", c)
    };
    let mut runner = {
        let mut c = cairn(&otlp);
        c.args([
            "serve",
            "sandbox-runner",
            "--listen",
            "127.0.0.1:0",
            "--pool-size",
            "0",
        ])
        .args(["--backend", backend, "--runner-id"])
        .arg(format!("traced{}", std::process::id()))
        .arg("--work-root")
        .arg(path("runner"));
        Proc::spawn("sandbox-runner", c)
    };
    let ingest_addr = ingest.wait_addr();
    let runner_addr = runner.wait_addr();
    let mut orchestrator = {
        let mut c = cairn(&otlp);
        // Start-up resume scans the store in a trace of its own; nothing to resume here.
        c.env("CAIRN_ORCHESTRATOR_RESUME_ON_START", "false")
            .args(["serve", "orchestrator", "--listen", "127.0.0.1:0"])
            .arg("--store-addr")
            .arg(format!("http://{store_addr}"))
            .arg("--ingest-addr")
            .arg(format!("http://{ingest_addr}"))
            .arg("--sandbox-addr")
            .arg(format!("http://{runner_addr}"));
        Proc::spawn("orchestrator", c)
    };
    let orchestrator_addr = orchestrator.wait_addr();

    // The client: `cairn run` against the orchestrator, exporting its own span.
    let graph = dir.path().join("graph.yaml");
    std::fs::write(&graph, GRAPH).unwrap();
    let out = tokio::task::spawn_blocking({
        let mut c = cairn(&otlp);
        c.args([
            "--addr",
            &orchestrator_addr,
            "-p",
            "traced",
            "--json",
            "run",
        ])
        .arg(&graph)
        .stdin(Stdio::null());
        move || c.output().unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cairn run failed:\n{stderr}");
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["state"], "completed", "{info:#}");
    let run_id = info["run_id"].as_str().unwrap().to_owned();

    // Metrics are pushed every 300 ms: every service's must arrive while it runs.
    let point = |metric: &str, service: &str, want: &[(&str, &str)]| {
        received.points.lock().unwrap().iter().any(|p| {
            p.metric == metric
                && p.service == service
                && p.value > 0.0
                && want
                    .iter()
                    .all(|(k, v)| p.attrs.get(*k).map(String::as_str) == Some(*v))
        })
    };
    wait_for("the metrics of the run", Duration::from_secs(15), || {
        point(
            "cairn.runs",
            "cairn-orchestrator",
            &[("cairn.run.state", "completed")],
        ) && point(
            "cairn.node.duration",
            "cairn-orchestrator",
            &[
                ("cairn.node.kind", "sandbox_run"),
                ("cairn.node.outcome", "succeeded"),
            ],
        ) && point(
            "cairn.node.duration",
            "cairn-orchestrator",
            &[
                ("cairn.node.kind", "write_file"),
                ("cairn.node.outcome", "succeeded"),
            ],
        ) && point(
            "cairn.sandbox.duration",
            "cairn-sandbox-runner",
            &[
                ("cairn.sandbox.backend", backend),
                ("cairn.sandbox.outcome", "ok"),
            ],
        ) && point(
            "cairn.store.written",
            "cairn-artifact-store",
            &[("cairn.store.outcome", "created")],
        )
    });

    // Stopping flushes what the batch exporters still hold.
    for p in [&mut orchestrator, &mut runner, &mut ingest, &mut store] {
        p.stop();
    }
    let spans = received.spans.lock().unwrap().clone();
    let table = spans
        .iter()
        .map(|s| {
            format!(
                "{:22} {:44} {} {} <- {:16}",
                s.service, s.name, s.trace, s.id, s.parent
            )
        })
        .collect::<Vec<_>>()
        .join("\n");

    // One trace.
    let traces: BTreeSet<&str> = spans.iter().map(|s| s.trace.as_str()).collect();
    assert_eq!(traces.len(), 1, "every span in one trace:\n{table}");
    let trace = traces.into_iter().next().unwrap().to_owned();

    // One tree: ids unique, every parent present, one root: the CLI's span.
    let ids: HashSet<&str> = spans.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids.len(), spans.len(), "span ids unique:\n{table}");
    let roots: Vec<&GotSpan> = spans.iter().filter(|s| s.parent.is_empty()).collect();
    assert_eq!(roots.len(), 1, "one root:\n{table}");
    assert_eq!(
        (roots[0].service.as_str(), roots[0].name.as_str()),
        ("cairn", "cairn run"),
        "{table}"
    );
    for s in &spans {
        assert!(
            s.parent.is_empty() || ids.contains(s.parent.as_str()),
            "parent of {} {} missing:\n{table}",
            s.service,
            s.name
        );
    }

    // Every service took part.
    let services: BTreeSet<&str> = spans.iter().map(|s| s.service.as_str()).collect();
    for want in SERVICES {
        assert!(services.contains(want), "no span from {want}:\n{table}");
    }

    // The hops are where they belong: runner call under the sandbox node, ingest under the
    // node that wrote the document, the store under ingest.
    let by_id: HashMap<&str, &GotSpan> = spans.iter().map(|s| (s.id.as_str(), s)).collect();
    let ancestors = |s: &GotSpan| {
        let mut out = Vec::new();
        let mut at = by_id.get(s.parent.as_str());
        while let Some(p) = at {
            out.push(format!("{}/{}", p.service, p.name));
            at = by_id.get(p.parent.as_str());
        }
        out
    };
    let find = |service: &str, name: &str| {
        spans
            .iter()
            .find(|s| s.service == service && s.name.contains(name))
            .unwrap_or_else(|| panic!("no {service} span named like {name}:\n{table}"))
    };
    let runner_call = find("cairn-sandbox-runner", "cairn.v1.SandboxRunner/Run");
    assert!(
        ancestors(runner_call).contains(&"cairn-orchestrator/node check".to_owned()),
        "{:?}",
        ancestors(runner_call)
    );
    let ingest_call = find("cairn-ingest", "cairn.v1.Ingest/");
    assert!(
        ancestors(ingest_call).contains(&"cairn-orchestrator/node design".to_owned()),
        "{:?}",
        ancestors(ingest_call)
    );
    assert!(
        spans.iter().any(|s| s.service == "cairn-artifact-store"
            && by_id
                .get(s.parent.as_str())
                .is_some_and(|p| p.service == "cairn-ingest")),
        "the store's spans of ingest's writes are ingest's children:\n{table}"
    );
    let run_span = spans
        .iter()
        .find(|s| s.service == "cairn-orchestrator" && s.name == "run")
        .unwrap_or_else(|| panic!("no run span:\n{table}"));
    assert_eq!(
        by_id.get(run_span.parent.as_str()).map(|p| p.name.as_str()),
        Some("/cairn.v1.Orchestrator/SubmitRun"),
        "the run's span continues the SubmitRun call"
    );

    // cairn's ids as attributes.
    let node = find("cairn-orchestrator", "node check");
    for (k, v) in [
        ("cairn.run_id", run_id.as_str()),
        ("cairn.node_id", "check"),
        ("cairn.project", "traced"),
    ] {
        assert_eq!(
            node.attrs.get(k).map(String::as_str),
            Some(v),
            "{k} on {node:?}"
        );
    }
    assert_eq!(
        runner_call.attrs.get("cairn.run_id"),
        Some(&run_id),
        "{runner_call:?}"
    );
    assert_eq!(
        ingest_call.attrs.get("cairn.node_id").map(String::as_str),
        Some("design"),
        "{ingest_call:?}"
    );

    // Logs carry the trace id: the runner's lines about the job, in JSON.
    let runner_log = runner.log();
    let job_lines: Vec<serde_json::Value> = runner_log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "run finished")
        .collect();
    assert_eq!(job_lines.len(), 1, "{runner_log}");
    assert_eq!(job_lines[0]["trace_id"], trace.as_str(), "{runner_log}");
    assert!(
        job_lines[0]["span_id"]
            .as_str()
            .is_some_and(|s| ids.contains(s)),
        "the line's span_id is an exported span: {}",
        job_lines[0]
    );
    assert_logged_no_trace_outside(&store.log(), &trace);
}

/// Lines of a service logged outside any request (start-up, shutdown) have no trace id; a
/// line with one names the run's trace.
fn assert_logged_no_trace_outside(log: &str, trace: &str) {
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            panic!("a log line that is not JSON: {line}");
        };
        if v["fields"]["message"] == "serving gRPC" {
            assert!(v.get("trace_id").is_none(), "{line}");
        }
        if let Some(t) = v.get("trace_id") {
            assert_eq!(t, trace, "{line}");
        }
    }
}

/// Health probes make no trace (a Docker HEALTHCHECK runs `cairn health` every few seconds per
/// service): neither the probe's own process nor the server's grpc.health.v1 handling exports
/// a span, even with every span level traced; a store call in between still does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_probes_make_no_trace() {
    let received = Receiver::default();
    let otlp = start_receiver(received.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut store = {
        let mut c = cairn(&otlp);
        c.env("CAIRN_TRACE_FILTER", "trace")
            .args([
                "serve",
                "artifact-store",
                "--listen",
                "127.0.0.1:0",
                "--data-root",
            ])
            .arg(dir.path().join("data"));
        Proc::spawn("artifact-store", c)
    };
    let addr = store.wait_addr();
    let client = |args: &[&str]| {
        let mut c = cairn(&otlp);
        c.env("CAIRN_TRACE_FILTER", "trace")
            .args(["--addr", &addr])
            .args(args);
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "cairn {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    tokio::task::block_in_place(|| {
        for service in ["", "liveness", "cairn.v1.ArtifactStore"] {
            client(&["health", "--service", service]);
        }
        // The control: a call that is traced, from the CLI and in the store.
        let file = dir.path().join("control.txt");
        std::fs::write(&file, "traced\n").unwrap();
        client(&[
            "store",
            "put",
            &file.display().to_string(),
            "docs/control.txt",
        ]);
        store.stop();
    });
    let spans = received.spans.lock().unwrap().clone();
    let names: Vec<(&str, &str)> = spans
        .iter()
        .map(|s| (s.service.as_str(), s.name.as_str()))
        .collect();
    assert!(
        names
            .iter()
            .any(|(s, n)| *s == "cairn" && n.starts_with("cairn store"))
            && names
                .iter()
                .any(|(s, n)| *s == "cairn-artifact-store"
                    && n.starts_with("/cairn.v1.ArtifactStore/")),
        "the control calls were not traced: {names:?}"
    );
    let health: Vec<_> = names
        .iter()
        .filter(|(_, n)| n.contains("health") || n.contains("grpc.health.v1"))
        .collect();
    assert!(health.is_empty(), "health probes were traced: {health:?}");
}
