//! cairn's metrics: OpenTelemetry instruments on one meter provider per process, read by a
//! Prometheus registry (served as `/metrics`, see [`encode`]) and, when OTLP metrics export is
//! configured, pushed over OTLP as well. Names, types and labels are documented in
//! docs/operations.md ("Metrics"); keep attribute values few (kinds, states and outcomes,
//! never ids).
//!
//! [`init`](crate::init) builds the provider with its OTLP reader; anything recorded before
//! it (tests that never call it) lands on a provider with the Prometheus reader only.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::metrics::{Counter, Gauge, Histogram, MeterProvider as _, UpDownCounter};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;

/// Buckets in seconds, from a quick node (5 ms) to an hour-long one.
const SECONDS: [f64; 18] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];

/// Buckets in seconds for short operations (RPCs, fsyncs): 0.5 ms to 30 s.
const QUICK_SECONDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
];

/// The content type of [`encode`]'s text (Prometheus text exposition 0.0.4).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

struct Provider {
    provider: SdkMeterProvider,
    registry: prometheus::Registry,
}

static PROVIDER: OnceLock<Provider> = OnceLock::new();

fn build(resource: Resource, otlp: Option<opentelemetry_otlp::MetricExporter>) -> Provider {
    let registry = prometheus::Registry::new();
    let mut builder = SdkMeterProvider::builder().with_resource(resource);
    match opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .scope_info_enabled(false)
        .build()
    {
        Ok(reader) => builder = builder.with_reader(reader),
        Err(e) => eprintln!("cairn: Prometheus metrics reader not started: {e}"),
    }
    if let Some(exporter) = otlp {
        // Pushed every `OTEL_METRIC_EXPORT_INTERVAL` ms (default 60000) and at shutdown.
        builder = builder.with_reader(PeriodicReader::builder(exporter).build());
    }
    Provider {
        provider: builder.build(),
        registry,
    }
}

fn provider() -> &'static Provider {
    PROVIDER.get_or_init(|| build(Resource::builder().build(), None))
}

/// Builds this process's meter provider (once; later calls change nothing) and makes it the
/// global one. Returns it when `otlp` was attached, for the guard to flush at exit.
pub(crate) fn install(
    resource: &Resource,
    otlp: Option<opentelemetry_otlp::MetricExporter>,
) -> Option<SdkMeterProvider> {
    let pushing = otlp.is_some();
    let mut built = false;
    let p = PROVIDER.get_or_init(|| {
        built = true;
        build(resource.clone(), otlp)
    });
    opentelemetry::global::set_meter_provider(p.provider.clone());
    // A gauge shows only once recorded: stalled runs are 0 until someone says otherwise.
    runs_stalled(0);
    (built && pushing).then(|| p.provider.clone())
}

/// The current values of every metric in the Prometheus text format ([`CONTENT_TYPE`]).
pub fn encode() -> String {
    use prometheus::Encoder as _;
    let families = provider().registry.gather();
    let mut out = Vec::new();
    if let Err(e) = prometheus::TextEncoder::new().encode(&families, &mut out) {
        tracing::warn!(error = %e, "could not encode the metrics");
    }
    String::from_utf8(out).unwrap_or_default()
}

struct Instruments {
    runs: Counter<u64>,
    runs_active: UpDownCounter<i64>,
    runs_stalled: Gauge<u64>,
    runs_queued: UpDownCounter<i64>,
    adopted: Counter<u64>,
    adoption_duration: Histogram<f64>,
    node_duration: Histogram<f64>,
    sandbox_duration: Histogram<f64>,
    sandbox_refused: Counter<u64>,
    pool_ready: Gauge<u64>,
    store_bytes: Counter<u64>,
    healed: Counter<u64>,
    stalled: Counter<u64>,
    fsync_duration: Histogram<f64>,
    rpc_requests: Counter<u64>,
    rpc_duration: Histogram<f64>,
}

fn instruments() -> &'static Instruments {
    static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meter = provider().provider.meter("cairn");
        let seconds = |name: &'static str, what: &'static str, buckets: &[f64]| {
            meter
                .f64_histogram(name)
                .with_description(what)
                .with_unit("s")
                .with_boundaries(buckets.to_vec())
                .build()
        };
        Instruments {
            runs: meter
                .u64_counter("cairn.runs")
                .with_description("Runs that entered a state, by state (cairn.run.state)")
                .with_unit("{run}")
                .build(),
            runs_active: meter
                .i64_up_down_counter("cairn.runs.active")
                .with_description("Runs this orchestrator drives, by their current state")
                .build(),
            runs_stalled: meter
                .u64_gauge("cairn.runs.stalled")
                .with_description("Unfinished runs that made no progress for longer than allowed")
                .build(),
            runs_queued: meter
                .i64_up_down_counter("cairn.runs.queued")
                .with_description("Runs waiting for a slot of max_parallel_runs")
                .build(),
            adopted: meter
                .u64_counter("cairn.runs.adopted")
                .with_description("Unfinished runs this orchestrator took over, by reason")
                .build(),
            adoption_duration: seconds(
                "cairn.runs.adoption.duration",
                "Time from finding an unfinished run to driving it again",
                &QUICK_SECONDS,
            ),
            node_duration: seconds(
                "cairn.node.duration",
                "Duration of node attempts, by node kind and outcome",
                &SECONDS,
            ),
            sandbox_duration: seconds(
                "cairn.sandbox.duration",
                "Duration of sandbox runs on a runner, by backend and outcome",
                &SECONDS,
            ),
            sandbox_refused: meter
                .u64_counter("cairn.sandbox.refused")
                .with_description("Sandbox runs and sessions a runner refused to admit, by reason")
                .build(),
            pool_ready: meter
                .u64_gauge("cairn.sandbox.pool.ready")
                .with_description("Warm sandboxes ready in a runner's pool, by pool")
                .build(),
            store_bytes: meter
                .u64_counter("cairn.store.written")
                .with_description("Bytes of files the artifact-store wrote (new or replaced)")
                .with_unit("By")
                .build(),
            healed: meter
                .u64_counter("cairn.runs.healed")
                .with_description(
                    "Unfinished runs the reconcile pass found without a live driver and resumed",
                )
                .with_unit("{run}")
                .build(),
            stalled: meter
                .u64_counter("cairn.runs.stalls")
                .with_description("Stalls of runs the watchdog reported, by stall policy")
                .with_unit("{run}")
                .build(),
            fsync_duration: seconds(
                "cairn.store.fsync.duration",
                "Time the artifact-store spent in one fsync, by what it made durable",
                &QUICK_SECONDS,
            ),
            rpc_requests: meter
                .u64_counter("cairn.rpc.server.requests")
                .with_description("gRPC calls served, by service, method and status code")
                .build(),
            rpc_duration: seconds(
                "cairn.rpc.server.duration",
                "Time to serve a gRPC call (to its last message), by service and method",
                &QUICK_SECONDS,
            ),
        }
    })
}

fn kv(key: &'static str, value: &str) -> KeyValue {
    KeyValue::new(key, value.to_owned())
}

/// A run entered `state` (`created`, `working`, `input-required`, `completed`, `failed`,
/// `canceled`).
pub fn run_entered(state: &str) {
    instruments().runs.add(1, &[kv("cairn.run.state", state)]);
}

/// A run this process drives moved from `from` (none: it was not driven here) to `to` (none:
/// it is no longer driven here).
pub fn run_moved(from: Option<&str>, to: Option<&str>) {
    let i = instruments();
    if let Some(s) = from {
        i.runs_active.add(-1, &[kv("cairn.run.state", s)]);
    }
    if let Some(s) = to {
        i.runs_active.add(1, &[kv("cairn.run.state", s)]);
    }
}

/// How many unfinished runs are stalled now.
pub fn runs_stalled(n: u64) {
    instruments().runs_stalled.record(n, &[]);
}

/// The runs of this process stalled now (`<project>/<run>`), behind the stalled-runs gauge.
static STALLED: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Run `run` (`<project>/<run>`) is stalled now, or no longer (it moved on, or its driver here
/// ended): the stalled-runs gauge follows.
pub fn run_stall(run: &str, stalled: bool) {
    let mut set = match STALLED.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    let changed = if stalled {
        set.insert(run.to_owned())
    } else {
        set.remove(run)
    };
    if changed {
        runs_stalled(set.len() as u64);
    }
}

/// A run waits for a slot of max_parallel_runs until the value returned is dropped.
pub fn run_queued() -> Queued {
    instruments().runs_queued.add(1, &[]);
    Queued(())
}

/// One run counted in `cairn.runs.queued` while this lives.
#[must_use = "the run counts as queued only while this lives"]
pub struct Queued(());

impl Drop for Queued {
    fn drop(&mut self) {
        instruments().runs_queued.add(-1, &[]);
    }
}

/// This process took over an unfinished run (`reason`: `restart` or `failover`) in `took`.
pub fn run_adopted(reason: &str, took: Duration) {
    let i = instruments();
    let attrs = [kv("cairn.adoption.reason", reason)];
    i.adopted.add(1, &attrs);
    i.adoption_duration.record(took.as_secs_f64(), &attrs);
}

/// The reconcile pass resumed an unfinished run that had no live driver here.
pub fn run_healed() {
    instruments().healed.add(1, &[]);
}

/// The watchdog found a run stalled and acted on it by `policy` (`notify`, `retry`, `fail`).
pub fn run_stalled(policy: &str) {
    instruments()
        .stalled
        .add(1, &[KeyValue::new("cairn.stall.policy", policy.to_owned())]);
}

/// A node attempt of `kind` (`sandbox_run`, `agent_task`, ...) ended with `outcome`
/// (`succeeded`, `failed`, `timeout`, `unavailable`, `refused`, `canceled`).
pub fn node_finished(kind: &str, outcome: &str, elapsed: Duration) {
    instruments().node_duration.record(
        elapsed.as_secs_f64(),
        &[
            kv("cairn.node.kind", kind),
            kv("cairn.node.outcome", outcome),
        ],
    );
}

/// A sandbox run on `backend` (`docker`, `local`) ended with `outcome` (`ok`, `exit_nonzero`,
/// `timed_out`, `oom_killed`, `error`).
pub fn sandbox_finished(backend: &str, outcome: &str, elapsed: Duration) {
    instruments().sandbox_duration.record(
        elapsed.as_secs_f64(),
        &[
            kv("cairn.sandbox.backend", backend),
            kv("cairn.sandbox.outcome", outcome),
        ],
    );
}

/// A runner refused a run or session (`reason`: `max_concurrent_runs`, `shutting_down`).
pub fn sandbox_refused(reason: &str) {
    instruments()
        .sandbox_refused
        .add(1, &[kv("cairn.sandbox.reason", reason)]);
}

/// The warm pool `pool` (`docker`, `local`, `gvisor`) holds `ready` sandboxes now.
pub fn pool_ready(pool: &str, ready: usize) {
    instruments()
        .pool_ready
        .record(ready as u64, &[kv("cairn.sandbox.pool", pool)]);
}

/// The store wrote `bytes` of file content (`outcome`: `created` or `overwritten`).
pub fn store_written(bytes: u64, outcome: &str) {
    instruments()
        .store_bytes
        .add(bytes, &[kv("cairn.store.outcome", outcome)]);
}

/// One fsync by the store (`what`: `file` for a file's bytes, `events` for a batch of a run's
/// events) took `took`.
pub fn store_fsynced(what: &str, took: Duration) {
    instruments()
        .fsync_duration
        .record(took.as_secs_f64(), &[kv("cairn.store.fsync", what)]);
}

/// One gRPC call to `service`/`method` ended with status `code` after `took`.
pub fn rpc_served(service: &str, method: &str, code: &str, took: Duration) {
    let i = instruments();
    let (service, method) = (kv("rpc.service", service), kv("rpc.method", method));
    i.rpc_duration
        .record(took.as_secs_f64(), &[service.clone(), method.clone()]);
    i.rpc_requests
        .add(1, &[service, method, kv("rpc.grpc.status_code", code)]);
}
