//! cairn's sandbox-runner: runs model-written
//! code in Docker containers or bubblewrap sandboxes with limits, collects its outputs without
//! trusting them, and keeps long-lived sessions for code delivery. It never touches the
//! project store: inputs come in the request and outputs leave in the reply.
//!
//! Embedding: [`sandbox_service`] gives the tonic service plus a [`RunnerHandle`] whose
//! `shutdown` kills and removes every sandbox; [`serve`] runs it standalone.

mod admission;
mod args;
mod backend;
mod capture;
pub mod config;
mod error;
mod job;
mod limits;
mod outputs;
mod pool;
mod runner;
mod service;
mod session;
pub mod snapshot;
mod workspace;

use std::future::Future;
use std::sync::Arc;

pub use args::ConfigArgs;
pub use cairn_proto::sandbox_runner_server::SandboxRunnerServer;
pub use config::{BackendChoice, Config};
pub use error::Error;
pub use limits::Limits;
pub use service::SandboxService;

use runner::Runner;

/// Cleans up after the service: keep it and call `shutdown` when the server has stopped.
#[derive(Clone)]
pub struct RunnerHandle {
    runner: Arc<Runner>,
}

impl RunnerHandle {
    /// Refuses new work, closes sessions, kills and removes every container/sandbox it started.
    pub async fn shutdown(&self) {
        self.runner.shutdown().await;
    }

    pub fn runner_id(&self) -> &str {
        self.runner.runner_id()
    }

    /// `docker` or `local`.
    pub fn backend(&self) -> &'static str {
        self.runner.backend_name()
    }

    /// Leftover containers and task directories removed at start-up.
    pub fn swept(&self) -> usize {
        self.runner.swept()
    }
}

/// Starts the runner (backend choice, start-up sweep, warm pool) and returns its gRPC service
/// (`Host::add` it) with the handle for shutdown.
pub async fn sandbox_service(
    config: Config,
) -> Result<(SandboxRunnerServer<SandboxService>, RunnerHandle), Error> {
    let runner = Arc::new(Runner::start(config).await?);
    runner.expire_idle_sessions();
    let server = SandboxRunnerServer::new(SandboxService::new(runner.clone()))
        .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
        // Clients may send gzip-compressed requests (replies stay uncompressed).
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    Ok((server, RunnerHandle { runner }))
}

/// The identity the runner serves with (`<tls.dir>/sandbox-runner.pem`).
pub const IDENTITY: &str = "sandbox-runner";

/// Serves the runner on `listener` until `shutdown` resolves, then removes what it started.
pub async fn serve(
    config: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    let mut host = cairn_server::Host::new();
    host.secure(
        IDENTITY,
        &config.tls,
        config.insecure_listen,
        &config.access,
    )
    .map_err(|e| Error::Config(e.to_string()))?;
    host.observe(&config.metrics_listen, &config.telemetry)
        .await?;
    let drain = std::time::Duration::from_secs(config.drain_deadline_s);
    let (server, handle) = sandbox_service(config).await?;
    host.add(server).drain_deadline(drain);
    // Kill what runs before draining calls: a long run must not hold the shutdown (and be
    // SIGKILLed with its container left behind); cut-off calls end Unavailable.
    let stopper = handle.clone();
    let served = host
        .serve(listener, async move {
            shutdown.await;
            stopper.shutdown().await;
        })
        .await;
    handle.shutdown().await;
    served.map_err(Error::from)
}
