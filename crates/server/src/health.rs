//! grpc.health.v1 as cairn reports it: readiness and liveness. Owns the statuses a host
//! reports; never decides what a dependency's state is (its client does, see [`crate::retry`]).
//!
//! - Readiness: service "" and each hosted service name are SERVING while the host serves
//!   and every required dependency is reachable; NOT_SERVING while one is not, and from the
//!   start of shutdown on. Load balancers and readiness probes use it.
//! - Liveness: service [`LIVENESS`] stays SERVING for as long as the process answers, also
//!   through a dependency's outage (restarting this process would not bring the dependency
//!   back). Liveness probes use it.

use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// The health service name that reports liveness.
pub const LIVENESS: &str = "liveness";

/// A dependency readiness follows: its name (for the log) and its reachability.
pub(crate) struct Required {
    pub name: String,
    pub up: watch::Receiver<bool>,
}

/// The health reporter of one host.
pub(crate) struct Health {
    reporter: HealthReporter,
    names: Vec<&'static str>,
    stopping: watch::Sender<bool>,
}

impl Health {
    /// Reports every name SERVING (liveness too) and starts following `required`.
    pub async fn start(
        names: Vec<&'static str>,
        required: Vec<Required>,
    ) -> (
        Health,
        tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
    ) {
        let (reporter, server) = tonic_health::server::health_reporter();
        reporter
            .set_service_status(LIVENESS, ServingStatus::Serving)
            .await;
        let health = Health {
            reporter,
            names,
            stopping: watch::Sender::new(false),
        };
        health.set(true).await;
        tokio::spawn(follow(
            health.reporter.clone(),
            health.names.clone(),
            required,
            health.stopping.subscribe(),
        ));
        (health, server)
    }

    /// Shutdown began: NOT_SERVING from now on (liveness stays).
    pub async fn stopping(&self) {
        self.stopping.send_replace(true);
        self.set(false).await;
    }

    async fn set(&self, ready: bool) {
        set(&self.reporter, &self.names, ready).await;
    }
}

async fn set(reporter: &HealthReporter, names: &[&'static str], ready: bool) {
    let status = if ready {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    for name in names.iter().copied().chain([""]) {
        reporter.set_service_status(name, status).await;
    }
}

/// Keeps readiness equal to "every required dependency is up" until shutdown.
async fn follow(
    reporter: HealthReporter,
    names: Vec<&'static str>,
    mut required: Vec<Required>,
    mut stopping: watch::Receiver<bool>,
) {
    if required.is_empty() {
        return;
    }
    let mut was_ready = true;
    loop {
        let down: Vec<&str> = required
            .iter()
            .filter(|r| !*r.up.borrow())
            .map(|r| r.name.as_str())
            .collect();
        let ready = down.is_empty();
        if *stopping.borrow() {
            return;
        }
        if ready != was_ready {
            if ready {
                tracing::info!("ready again: every required dependency is reachable");
            } else {
                tracing::warn!(unreachable = ?down, "not ready: a required dependency is unreachable");
            }
            set(&reporter, &names, ready).await;
            was_ready = ready;
        }
        let changed = futures::future::select_all(
            required
                .iter_mut()
                .map(|r| Box::pin(r.up.changed()))
                .collect::<Vec<_>>(),
        );
        tokio::select! {
            (r, _, _) = changed => if r.is_err() { return },
            _ = stopping.changed() => {}
        }
    }
}
