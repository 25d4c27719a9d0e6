//! Where a command's services come from: the address in --addr / CAIRN_ADDR, or services
//! started in this process on a loopback port (all of them on one address, like `cairn up`).

use std::path::PathBuf;

use anyhow::Context;
use cairn_orchestrator::auth::Bearer;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::ingest_client::IngestClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient;
use cairn_telemetry::TracedChannel;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;

use crate::cli::Global;
use crate::settings::Settings;

/// A connection to cairn's services, embedded or remote.
pub struct Services {
    /// --addr (or the embedded address): every service not given an address of its own.
    channel: Option<TracedChannel>,
    store: Option<TracedChannel>,
    ingest: Option<TracedChannel>,
    sandbox: Option<TracedChannel>,
    addr: String,
    embedded: Option<Embedded>,
    /// --token-file / --token / CAIRN_TOKEN, sent with every call (a host that requires
    /// tokens takes admin tokens on the store, ingest and the runner).
    bearer: Bearer,
}

/// A channel whose calls carry the user's token.
pub type Authed = InterceptedService<TracedChannel, Bearer>;

struct Embedded {
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

/// Which optional services an embedded host starts (the store and ingest always run).
#[derive(Debug, Clone, Default)]
pub struct Needs {
    /// The sandbox-runner (needs Docker, bubblewrap, or runsc with `backend = "gvisor"`).
    pub sandbox: bool,
    /// The orchestrator (resumes unfinished runs of the data root when it starts).
    pub orchestrator: bool,
    /// With `sandbox`: go on without it when it cannot start (built-in modes need none; a
    /// run that reaches a sandbox node then fails there, saying so).
    pub sandbox_optional: bool,
    /// The orchestrator's tokens file (`cairn up --tokens-file`).
    pub tokens_file: Option<PathBuf>,
    /// An LLM server URL given to `cairn run --llm` (`openai:<base_url>#<model>`). In this
    /// single-user process the user is the operator: it becomes the provider
    /// `EMBEDDED_LLM_PROVIDER`, which gets the key of `llm.api_key_env`.
    pub llm_url: Option<String>,
}

/// The provider name of `Needs::llm_url` in an embedded orchestrator.
pub const EMBEDDED_LLM_PROVIDER: &str = "cairn-run";

/// Services hosted together, plus what must be cleaned up after the server stops.
pub struct Hosted {
    host: cairn_server::Host,
    runner: Option<cairn_sandbox_runner::RunnerHandle>,
    orchestrator: Option<cairn_orchestrator::Handle>,
    /// Plaintext callers need a token (the orchestrator has tokens or JWTs).
    pub tokens_required: bool,
}

impl Hosted {
    /// Also serves `/metrics` on `listener` (see [`cairn_server::Host::metrics`]).
    pub fn metrics(&mut self, listener: tokio::net::TcpListener) {
        self.host.metrics(listener);
    }

    /// Serves until `shutdown`, then removes every sandbox the runner started.
    pub async fn serve(
        self,
        listener: impl Into<cairn_server::Listen>,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> anyhow::Result<()> {
        // Stop run drivers and kill sandboxes first, then drain calls: a long sandbox run must
        // not hold the shutdown.
        let (orchestrator, runner) = (self.orchestrator.clone(), self.runner.clone());
        let served = self
            .host
            .serve(listener, async move {
                shutdown.await;
                if let Some(o) = &orchestrator {
                    o.shutdown().await;
                }
                if let Some(r) = &runner {
                    r.shutdown().await;
                }
            })
            .await;
        if let Some(runner) = self.runner {
            runner.shutdown().await;
        }
        Ok(served?)
    }
}

impl Services {
    /// Connects to --addr, or starts the services in this process.
    pub async fn open(global: &Global, needs: Needs) -> anyhow::Result<Services> {
        let bearer = Bearer::new(global.bearer_token()?.as_deref()).map_err(anyhow::Error::msg)?;
        let remote = [
            &global.addr,
            &global.store_addr,
            &global.ingest_addr,
            &global.sandbox_addr,
        ]
        .iter()
        .any(|a| a.is_some());
        if remote {
            if let Some(path) = &global.config {
                // The file configures services this process starts; remote ones have their
                // own. Still check it, and say it is not used, rather than ignore it silently.
                Settings::load(global)?;
                eprintln!(
                    "note: {} configures the services cairn starts itself; the services at {} use their own configuration (leave out --addr / CAIRN_ADDR to use this file)",
                    path.display(),
                    global.addr.as_deref().unwrap_or("the given addresses")
                );
            }
            let tls = global
                .tls
                .config()
                .load(IDENTITY)
                .context("reading the TLS files (--tls-dir / CAIRN_TLS_DIR)")?;
            let dial = |a: &Option<String>| -> anyhow::Result<Option<TracedChannel>> {
                a.as_deref()
                    .map(|a| {
                        let name = server_name_for(a, global.tls_server_name.as_deref());
                        Ok(cairn_telemetry::traced(cairn_server::connect_named(
                            a,
                            tls.as_ref(),
                            name,
                        )?))
                    })
                    .transpose()
            };
            return Ok(Services {
                channel: dial(&global.addr)?,
                store: dial(&global.store_addr)?,
                ingest: dial(&global.ingest_addr)?,
                sandbox: dial(&global.sandbox_addr)?,
                addr: global.addr.clone().unwrap_or_default(),
                embedded: None,
                bearer,
            });
        }
        let listener = cairn_server::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        // This command's calls, like the services' calls to each other, stay in the process.
        let in_process = cairn_server::inproc::Listener::new();
        let internal = in_process.addr().to_owned();
        let settings = Settings::load(global)?;
        let hosted = host_all(&settings, &addr, needs, Some(in_process)).await?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            hosted
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await
        });
        let channel = cairn_server::connect(&internal)?;
        Ok(Services {
            channel: Some(cairn_telemetry::traced(channel)),
            store: None,
            ingest: None,
            sandbox: None,
            addr,
            embedded: Some(Embedded { stop, task }),
            bearer,
        })
    }

    /// The channel of one service: its own address, else --addr.
    fn channel_for(
        &self,
        own: &Option<TracedChannel>,
        flag: &str,
    ) -> anyhow::Result<TracedChannel> {
        own.clone()
            .or_else(|| self.channel.clone())
            .ok_or_else(|| anyhow::anyhow!("no address for this service: give --addr or {flag}"))
    }

    pub fn store(&self) -> anyhow::Result<ArtifactStoreClient<Authed>> {
        Ok(
            ArtifactStoreClient::new(self.authed(&self.store, "--store-addr")?)
                .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES),
        )
    }

    pub fn ingest(&self) -> anyhow::Result<IngestClient<Authed>> {
        Ok(
            IngestClient::new(self.authed(&self.ingest, "--ingest-addr")?)
                .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES),
        )
    }

    pub fn sandbox(&self) -> anyhow::Result<SandboxRunnerClient<Authed>> {
        Ok(
            SandboxRunnerClient::new(self.authed(&self.sandbox, "--sandbox-addr")?)
                .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES),
        )
    }

    /// [`Services::channel_for`] carrying the user's token.
    fn authed(&self, own: &Option<TracedChannel>, flag: &str) -> anyhow::Result<Authed> {
        Ok(InterceptedService::new(
            self.channel_for(own, flag)?,
            self.bearer.clone(),
        ))
    }

    pub fn orchestrator(&self) -> anyhow::Result<OrchestratorClient<Authed>> {
        Ok(OrchestratorClient::new(self.authed(&None, "--addr")?)
            .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES))
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

/// The identity CLI commands dial with (`<tls.dir>/cli.pem`).
pub const IDENTITY: &str = "cli";

/// cairn's services on one host, configured by `settings` (the one configuration). With
/// `in_process` the host serves plaintext (TLS settings are ignored) and the services call each
/// other through it, in memory; without, the host serves the orchestrator's TLS settings and
/// each service dials `self_addr` with its own certificate. When the orchestrator has tokens
/// or JWTs, every caller on the port needs a token or a certificate (see `trust_mode`).
pub async fn host_all(
    settings: &Settings,
    self_addr: &str,
    needs: Needs,
    in_process: Option<cairn_server::inproc::Listener>,
) -> anyhow::Result<Hosted> {
    let plaintext = in_process.is_some();
    let tls = |t: &cairn_server::TlsConfig| {
        if plaintext {
            cairn_server::TlsConfig::default()
        } else {
            t.clone()
        }
    };
    let own = &settings.orchestrator.config;
    own.telemetry.apply();
    let mut host = cairn_server::Host::new();
    host.secure(
        cairn_orchestrator::IDENTITY,
        &tls(&own.tls),
        own.insecure_listen,
        &Default::default(),
    )
    .context("reading the TLS files (--tls-dir / CAIRN_TLS_DIR / [tls])")?;
    let self_addr = match &in_process {
        Some(l) => l.addr().to_owned(),
        None => self_addr.to_owned(),
    };
    let self_addr = self_addr.as_str();
    if let Some(l) = in_process {
        host.in_process(l);
    }
    let store_config = settings.artifact_store.config.clone();
    let data_root = store_config.data_root.clone();
    let store = cairn_artifact_store::artifact_store_service(store_config)
        .await
        .with_context(|| format!("starting the artifact-store over {}", data_root.display()))?;
    host.add(store);
    let ingest = cairn_ingest::ingest_service(&cairn_ingest::Config {
        store_addr: self_addr.to_owned(),
        tls: tls(&settings.ingest.config.tls),
        ..settings.ingest.config.clone()
    })
    .context("starting the ingest service")?;
    host.add(ingest);
    let mut runner = None;
    if needs.sandbox {
        let config = cairn_sandbox_runner::Config {
            tls: tls(&settings.sandbox_runner.config.tls),
            ..settings.sandbox_runner.config.clone()
        };
        match cairn_sandbox_runner::sandbox_service(config).await {
            Ok((service, handle)) => {
                host.add(service);
                runner = Some(handle);
            }
            Err(e) if needs.sandbox_optional => {
                tracing::warn!(error = %e, "no sandbox-runner (it needs a Docker engine, bubblewrap, or runsc with backend = gvisor); sandbox nodes will fail");
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(
                    "starting the sandbox-runner (it needs a Docker engine, bubblewrap, or runsc with backend = gvisor)",
                ))
            }
        }
    }
    let mut orchestrator = None;
    let mut tokens_required = false;
    if needs.orchestrator {
        // The one configuration applies; the addresses are ours.
        let mut config = cairn_orchestrator::Config {
            store_addr: self_addr.to_owned(),
            ingest_addr: self_addr.to_owned(),
            tls: tls(&own.tls),
            sandbox_addrs: if runner.is_some() {
                vec![self_addr.to_owned()]
            } else {
                Vec::new()
            },
            ..own.clone()
        };
        if let Some(f) = &needs.tokens_file {
            config.auth.tokens_file = f.display().to_string();
        }
        if let Some(url) = &needs.llm_url {
            let (base_url, model) = match cairn_agents::ProviderSpec::parse(url)? {
                cairn_agents::ProviderSpec::OpenAi { base_url, model } => (base_url, model),
                _ => anyhow::bail!("--llm {url}: not an LLM server URL"),
            };
            let provider = cairn_agents::ProviderConfig {
                base_url,
                model,
                api_key_env: config.llm.api_key_env.clone(),
                ..Default::default()
            };
            config
                .llm
                .providers
                .insert(EMBEDDED_LLM_PROVIDER.to_owned(), provider);
        }
        let (service, handle) = cairn_orchestrator::orchestrator_service(config)
            .await
            .context("starting the orchestrator")?;
        host.add(service);
        if let Some(check) = handle.token_check() {
            host.require_tokens(check);
            tokens_required = true;
        }
        orchestrator = Some(handle);
    }
    Ok(Hosted {
        host,
        runner,
        orchestrator,
        tokens_required,
    })
}

/// `--tls-server-name` applies to addresses that are non-loopback IP addresses only: a host
/// name is verified as dialled, and loopback addresses are on every certificate.
fn server_name_for<'a>(addr: &str, name: Option<&'a str>) -> Option<&'a str> {
    let bare = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    let host = bare.rsplit_once(':').map_or(bare, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) if !ip.is_loopback() => name,
        _ => None,
    }
}

#[cfg(test)]
mod server_name_tests {
    use super::server_name_for;

    #[test]
    fn the_server_name_applies_to_non_loopback_ip_addresses_only() {
        let n = Some("ingest");
        assert_eq!(server_name_for("172.18.0.3:7070", n), Some("ingest"));
        assert_eq!(
            server_name_for("https://172.18.0.3:7070", n),
            Some("ingest")
        );
        assert_eq!(server_name_for("[fd00::3]:7070", n), Some("ingest"));
        assert_eq!(server_name_for("127.0.0.1:7071", n), None);
        assert_eq!(server_name_for("[::1]:7071", n), None);
        assert_eq!(server_name_for("ingest.cairn:7070", n), None);
        assert_eq!(server_name_for("172.18.0.3:7070", None), None);
    }
}
