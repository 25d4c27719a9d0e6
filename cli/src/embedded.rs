//! Where a command's services come from: the address in --addr / CAIRN_ADDR, or services
//! started in this process on a loopback port (all of them on one address, like `cairn up`).

use std::path::Path;

use anyhow::Context;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::ingest_client::IngestClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient;
use cairn_telemetry::TracedChannel;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::cli::Global;

/// A connection to cairn's services, embedded or remote.
pub struct Services {
    channel: TracedChannel,
    addr: String,
    embedded: Option<Embedded>,
}

struct Embedded {
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

/// Which optional services an embedded host starts (the store and ingest always run).
#[derive(Debug, Clone, Copy, Default)]
pub struct Needs {
    /// The sandbox-runner (needs Docker or bubblewrap).
    pub sandbox: bool,
    /// The orchestrator (resumes unfinished runs of the data root when it starts).
    pub orchestrator: bool,
}

/// Services hosted together, plus what must be cleaned up after the server stops.
pub struct Hosted {
    host: cairn_server::Host,
    runner: Option<cairn_sandbox_runner::RunnerHandle>,
    orchestrator: Option<cairn_orchestrator::Handle>,
}

impl Hosted {
    /// Serves until `shutdown`, then removes every sandbox the runner started.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> anyhow::Result<()> {
        let served = self.host.serve(listener, shutdown).await;
        if let Some(orchestrator) = self.orchestrator {
            orchestrator.shutdown().await;
        }
        if let Some(runner) = self.runner {
            runner.shutdown().await;
        }
        Ok(served?)
    }
}

impl Services {
    /// Connects to --addr, or starts the services in this process.
    pub async fn open(global: &Global, needs: Needs) -> anyhow::Result<Services> {
        if let Some(addr) = &global.addr {
            let channel = cairn_server::connect(addr)?;
            return Ok(Services {
                channel: cairn_telemetry::traced(channel),
                addr: addr.clone(),
                embedded: None,
            });
        }
        let listener = cairn_server::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let hosted = host_all(&global.data_root, &addr, needs).await?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            hosted
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await
        });
        let channel = cairn_server::connect(&addr)?;
        Ok(Services {
            channel: cairn_telemetry::traced(channel),
            addr,
            embedded: Some(Embedded { stop, task }),
        })
    }

    pub fn store(&self) -> ArtifactStoreClient<TracedChannel> {
        ArtifactStoreClient::new(self.channel.clone())
            .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
    }

    pub fn ingest(&self) -> IngestClient<TracedChannel> {
        IngestClient::new(self.channel.clone())
            .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
    }

    pub fn sandbox(&self) -> SandboxRunnerClient<TracedChannel> {
        SandboxRunnerClient::new(self.channel.clone())
            .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
    }

    pub fn orchestrator(&self) -> OrchestratorClient<TracedChannel> {
        OrchestratorClient::new(self.channel.clone())
            .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
    }

    #[allow(dead_code)]
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Stops embedded services gracefully (in-flight calls finish).
    pub async fn close(self) -> anyhow::Result<()> {
        if let Some(e) = self.embedded {
            let _ = e.stop.send(());
            e.task.await.context("embedded services panicked")??;
        }
        Ok(())
    }
}

/// cairn's services on one host, talking to each other through `self_addr`.
pub async fn host_all(data_root: &Path, self_addr: &str, needs: Needs) -> anyhow::Result<Hosted> {
    let mut host = cairn_server::Host::new();
    let store = cairn_artifact_store::artifact_store_service(cairn_artifact_store::Config::new(
        data_root.to_path_buf(),
    ))
    .await
    .with_context(|| format!("starting the artifact-store over {}", data_root.display()))?;
    host.add(store);
    let ingest = cairn_ingest::ingest_service(&cairn_ingest::Config {
        store_addr: self_addr.to_owned(),
        ..cairn_ingest::Config::default()
    })
    .context("starting the ingest service")?;
    host.add(ingest);
    let mut runner = None;
    if needs.sandbox {
        let config = cairn_sandbox_runner::Config {
            work_root: std::path::absolute(data_root)?.join("sandbox"),
            ..cairn_sandbox_runner::Config::default()
        };
        let (service, handle) = cairn_sandbox_runner::sandbox_service(config)
            .await
            .context("starting the sandbox-runner (it needs a Docker engine or bubblewrap)")?;
        host.add(service);
        runner = Some(handle);
    }
    let mut orchestrator = None;
    if needs.orchestrator {
        let config = cairn_orchestrator::Config {
            store_addr: self_addr.to_owned(),
            ingest_addr: self_addr.to_owned(),
            sandbox_addrs: if needs.sandbox { vec![self_addr.to_owned()] } else { Vec::new() },
            ..cairn_orchestrator::Config::default()
        };
        let (service, handle) = cairn_orchestrator::orchestrator_service(config)
            .await
            .context("starting the orchestrator")?;
        host.add(service);
        orchestrator = Some(handle);
    }
    Ok(Hosted { host, runner, orchestrator })
}
