//! cairn's orchestrator: agent graphs run as durable, editable run directories with human
//! gates (and the ingest hook). Every file and event goes
//! through the artifact-store; ingest and sandbox runners are called over gRPC.
//!
//! Embedding (`cairn up`): [`orchestrator_service`] returns the tonic server and a [`Handle`];
//! standalone: [`serve`].

mod args;
pub use cairn_auth as auth;
pub use cairn_cluster as cluster;
pub mod config;
pub mod error;
pub mod gates;
pub mod human;
pub mod inputs;
pub mod logs;
pub mod modes;
pub mod nodes;
pub mod recorder;
pub mod run;
pub mod rundir;
pub mod runs;
pub mod scheduler;
pub mod service;
pub mod task_edits;

use std::future::Future;
use std::sync::Arc;

use cairn_proto::v1::ingest_client::IngestClient;
use cairn_proto::v1::orchestrator_server::OrchestratorServer;

pub use args::ConfigArgs;
pub use config::{Config, RetryPolicy};
pub use error::Error;
pub use service::OrchestratorService;

/// How often a standalone orchestrator checks that the store answers (readiness).
const PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Control of a running orchestrator: resume and shutdown.
#[derive(Clone)]
pub struct Handle {
    runs: Arc<runs::Runs>,
    store: cairn_server::retry::Dependency,
    auth: Arc<auth::Auth>,
}

impl Handle {
    /// The check a host serving other services beside this orchestrator applies to their
    /// plaintext callers' tokens; `None` when no tokens or JWTs are configured.
    pub fn token_check(&self) -> Option<Arc<dyn cairn_server::access::TokenCheck>> {
        self.auth
            .tokens_required()
            .then(|| self.auth.clone() as Arc<dyn cairn_server::access::TokenCheck>)
    }

    /// Resumes every run that is not final (done automatically when `resume_on_start`).
    /// Returns how many were resumed.
    pub async fn resume_unfinished(&self) -> usize {
        self.runs.clone().resume_unfinished().await
    }

    /// Stops all run drivers, leaving runs resumable, after flushing their records, and ends
    /// WatchRun streams. Call it when shutdown begins (inside the shutdown future given to
    /// `Host::serve`): the host's graceful shutdown waits for open streams.
    pub async fn shutdown(&self) {
        self.runs.shutdown().await
    }

    /// The store as a dependency (readiness follows it).
    pub fn store_dependency(&self) -> &cairn_server::retry::Dependency {
        &self.store
    }

    /// The run registry, for in-process callers (tests, benches).
    pub fn runs(&self) -> Arc<runs::Runs> {
        self.runs.clone()
    }
}

/// The identity the orchestrator serves and dials with (`<tls.dir>/orchestrator.pem`).
pub const IDENTITY: &str = "orchestrator";

/// Builds the service. Connections are lazy, so the store may start after this; with
/// `resume_on_start` unfinished runs are resumed in the background once the store answers.
pub async fn orchestrator_service(
    config: Config,
) -> Result<(OrchestratorServer<OrchestratorService>, Handle), Error> {
    config.check()?;
    config.cluster.check_complete().map_err(Error::Config)?;
    let tls = config
        .tls
        .load(IDENTITY)
        .map_err(cairn_server::Error::from)?;
    if config.cluster.is_on() {
        config
            .cluster
            .check_transport(tls.is_some())
            .map_err(Error::Config)?;
    }
    let outage = std::time::Duration::from_secs(config.dependency_outage_s);
    let store =
        cairn_store_client::Store::connect_tls(&config.store_addr, tls.as_ref())?.riding_out(
            cairn_server::retry::Dependency::new(cairn_store_client::STORE, outage),
        );
    let ingest = if config.ingest_addr.trim().is_empty() {
        None
    } else {
        let channel = cairn_server::connect_tls(&config.ingest_addr, tls.as_ref())?;
        Some(
            IngestClient::new(cairn_telemetry::traced(channel))
                .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES),
        )
    };
    let balancing = cairn_runner_client::Balancing {
        health_interval: std::time::Duration::from_millis(config.sandbox_health_interval_ms),
        resolve_interval: std::time::Duration::from_millis(config.sandbox_resolve_interval_ms),
    };
    let peer_tls = tls.clone();
    let runners =
        cairn_runner_client::Runners::start_tls(&config.sandbox_addrs, balancing, tls).await?;
    let auth = Arc::new(auth::Auth::new(&config.auth)?);
    let resume = config.resume_on_start;
    let cluster = config.cluster.clone();
    let services = Arc::new(nodes::Services {
        store,
        ingest,
        ingest_dependency: cairn_server::retry::Dependency::new("ingest", outage),
        runners,
        providers: cairn_agents::Providers::with_default(config.llm.clone(), &config.default_llm)
            .map_err(Error::Config)?,
        ingest_hook: config.ingest_hook,
        node_timeout_s: config.node_timeout_s,
        logs: Arc::new(cairn_node::logs::LogHub::new(
            usize::try_from(config.log_retain_bytes).unwrap_or(usize::MAX),
        )),
    });
    let backends = Arc::new(nodes::Backends {
        services,
        kinds: nodes::registry(&config),
        config,
    });
    let store = backends.store.dependency().clone();
    let runs = runs::Runs::new(backends);
    if cluster.is_on() {
        // Replicas: the runs this one owns are adopted once it has joined (and whenever
        // membership changes), not all of them at start-up.
        runs.join_cluster(cluster, peer_tls);
    } else {
        if resume {
            // Its own trace: resumed runs start new traces (docs/operations.md "Tracing").
            let span = tracing::info_span!("cairn.resume_unfinished");
            tokio::spawn(tracing::Instrument::instrument(
                runs.clone().resume_unfinished(),
                span,
            ));
        }
        tokio::spawn(runs.clone().reconcile_forever());
    }
    let server = OrchestratorServer::new(OrchestratorService::new(runs.clone(), auth.clone()))
        .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
        // Clients may send gzip-compressed requests (replies stay uncompressed).
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    Ok((server, Handle { runs, store, auth }))
}

/// Serves the orchestrator alone on `listener` until `shutdown` resolves; then stops the run
/// drivers (runs stay resumable) after in-flight calls finish.
pub async fn serve(
    config: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    let drain = std::time::Duration::from_secs(config.drain_deadline_s);
    let store_addr = config.store_addr.clone();
    let mut host = cairn_server::Host::new();
    host.secure(
        IDENTITY,
        &config.tls,
        config.insecure_listen,
        &config.access,
    )?;
    host.observe(&config.metrics_listen, &config.telemetry)
        .await?;
    let tls = config
        .tls
        .load(IDENTITY)
        .map_err(cairn_server::Error::from)?;
    let (server, handle) = orchestrator_service(config).await?;
    // Readiness follows the store, also while no run is calling it.
    let store = handle.store_dependency().clone();
    store.probe(
        cairn_server::connect_tls(&store_addr, tls.as_ref())?,
        PROBE_INTERVAL,
    );
    host.add(server).require(&store).drain_deadline(drain);
    // Stop the drivers and end the watch streams as soon as shutdown begins, while the host
    // drains; waiting for the drivers is bounded by the drain deadline too.
    let (stopping, stopped) = tokio::sync::oneshot::channel();
    let stopper = handle.clone();
    let shutdown = async move {
        shutdown.await;
        let _ = stopping.send(tokio::spawn(async move { stopper.shutdown().await }));
    };
    let served = host.serve(listener, shutdown).await;
    if let Ok(drivers) = stopped.await {
        if tokio::time::timeout(drain, drivers).await.is_err() {
            tracing::warn!("run drivers still busy after the drain deadline; their runs resume from their records");
        }
    }
    served.map_err(Error::from)
}
