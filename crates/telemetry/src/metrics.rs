//! cairn's metrics (OpenTelemetry instruments on the global meter provider that [`init`]
//! installs when metrics export is on; without it every call here is a no-op). Names and
//! attributes are documented in docs/operations.md ("Metrics"); keep attribute values few
//! (kinds and outcomes, never ids).
//!
//! The instruments are made at first use: call [`init`] before anything records.
//!
//! [`init`]: crate::init

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram};
use opentelemetry::KeyValue;

/// Buckets in seconds, from a quick node (5 ms) to an hour-long one.
const SECONDS: [f64; 18] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];

struct Instruments {
    runs: Counter<u64>,
    node_duration: Histogram<f64>,
    sandbox_duration: Histogram<f64>,
    store_bytes: Counter<u64>,
    healed: Counter<u64>,
    stalled: Counter<u64>,
}

fn instruments() -> &'static Instruments {
    static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meter = opentelemetry::global::meter("cairn");
        Instruments {
            runs: meter
                .u64_counter("cairn.runs")
                .with_description("Runs that entered a state, by state (cairn.run.state)")
                .with_unit("{run}")
                .build(),
            node_duration: meter
                .f64_histogram("cairn.node.duration")
                .with_description("Duration of node attempts, by node kind and outcome")
                .with_unit("s")
                .with_boundaries(SECONDS.to_vec())
                .build(),
            sandbox_duration: meter
                .f64_histogram("cairn.sandbox.duration")
                .with_description("Duration of sandbox runs on a runner, by backend and outcome")
                .with_unit("s")
                .with_boundaries(SECONDS.to_vec())
                .build(),
            store_bytes: meter
                .u64_counter("cairn.store.bytes_written")
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
                .u64_counter("cairn.runs.stalled")
                .with_description("Stalls of runs the watchdog reported, by stall policy")
                .with_unit("{run}")
                .build(),
        }
    })
}

/// A run entered `state` (`created`, `working`, `input-required`, `completed`, `failed`,
/// `canceled`).
pub fn run_entered(state: &str) {
    instruments()
        .runs
        .add(1, &[KeyValue::new("cairn.run.state", state.to_owned())]);
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
            KeyValue::new("cairn.node.kind", kind.to_owned()),
            KeyValue::new("cairn.node.outcome", outcome.to_owned()),
        ],
    );
}

/// A sandbox run on `backend` (`docker`, `local`) ended with `outcome` (`ok`, `exit_nonzero`,
/// `timed_out`, `oom_killed`, `error`).
pub fn sandbox_finished(backend: &str, outcome: &str, elapsed: Duration) {
    instruments().sandbox_duration.record(
        elapsed.as_secs_f64(),
        &[
            KeyValue::new("cairn.sandbox.backend", backend.to_owned()),
            KeyValue::new("cairn.sandbox.outcome", outcome.to_owned()),
        ],
    );
}

/// The store wrote `bytes` of file content (`outcome`: `created` or `overwritten`).
pub fn store_written(bytes: u64, outcome: &str) {
    instruments().store_bytes.add(
        bytes,
        &[KeyValue::new("cairn.store.outcome", outcome.to_owned())],
    );
}
