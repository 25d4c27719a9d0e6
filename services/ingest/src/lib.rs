//! cairn's ingest service: strict code fences in agent
//! documents become workspace files, written through the artifact-store, with manifest v1 and
//! `ingest.*` events. Fail-open: ingest never fails its caller's run.
//!
//! Embedding: [`ingest_service`] returns the tonic server to add to a `cairn_server::Host`;
//! [`serve`] runs it standalone. The pure parts ([`parse`], [`Manifest`]) need no store.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod block;
pub mod fence;
pub mod manifest;

#[cfg(feature = "service")]
pub mod config;
#[cfg(feature = "service")]
pub mod error;
#[cfg(feature = "service")]
pub mod events;
#[cfg(feature = "service")]
pub mod flag;
#[cfg(feature = "service")]
pub mod ingest;
#[cfg(feature = "service")]
pub mod service;
#[cfg(feature = "service")]
pub mod store;

pub use block::{parse, sha256_hex, Block, BlockStatus, Limits};
pub use manifest::{Manifest, Severity, Source, Summary};

#[cfg(feature = "service")]
pub use config::{Config, ConfigArgs};
#[cfg(feature = "service")]
pub use error::{Error, Result};
#[cfg(feature = "service")]
pub use ingest::{Ingestor, Outcome, Request};
#[cfg(feature = "service")]
pub use service::IngestService;
#[cfg(feature = "service")]
pub use serving::{ingest_service, ingestor, serve};

/// Largest gRPC message ingest accepts or sends (documents up to 16 MiB by default plus the
/// envelope); a larger document cannot be sent in one request.
pub const MAX_MESSAGE_BYTES: usize = 32 << 20;

/// Building and hosting the gRPC service.
#[cfg(feature = "service")]
mod serving {
    use std::future::Future;

    use cairn_proto::v1::ingest_server::IngestServer;

    use crate::{store, Config, Error, IngestService, Ingestor, Result};

    /// The identity ingest serves and dials with (`<tls.dir>/ingest.pem`).
    pub const IDENTITY: &str = "ingest";

    use crate::MAX_MESSAGE_BYTES;

    /// How often a standalone ingest checks that the store answers (readiness).
    const PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

    /// The domain object over `config` (a lazily connecting store client: a dead store never
    /// blocks start-up). Fails only on an unusable `store_addr`.
    pub fn ingestor(config: &Config) -> Result<Ingestor> {
        config.check()?;
        let tls = config
            .tls
            .load(IDENTITY)
            .map_err(|e| Error::Config(e.to_string()))?;
        let channel = cairn_server::connect_tls(&config.store_addr, tls.as_ref())
            .map_err(|e| Error::Config(e.to_string()))?;
        Ok(Ingestor {
            store: store::StoreClient::new(channel, config.store_timeout()).riding_out(
                cairn_server::retry::Dependency::new(store::STORE, config.dependency_outage()),
            ),
            limits: config.limits(),
            policy: config.policy(),
            default_enabled: config.default_enabled,
            write_concurrency: config.write_concurrency,
        })
    }

    /// The gRPC service, ready to be hosted (e.g. by `cairn up` on one port with the others).
    pub fn ingest_service(config: &Config) -> Result<IngestServer<IngestService>> {
        Ok(server(ingestor(config)?))
    }

    fn server(ingestor: Ingestor) -> IngestServer<IngestService> {
        IngestServer::new(IngestService::new(ingestor))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
            // Clients may send gzip-compressed requests (replies stay uncompressed).
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
    }

    /// Serves ingest alone on `listener` until `shutdown` resolves (health, reflection, graceful
    /// shutdown from `cairn-server`).
    pub async fn serve(
        config: Config,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<()> {
        let ingestor = ingestor(&config)?;
        // Readiness follows the store, also while no ingest is running.
        let store = ingestor.store.dependency().clone();
        let tls = config
            .tls
            .load(IDENTITY)
            .map_err(|e| Error::Config(e.to_string()))?;
        let channel = cairn_server::connect_tls(&config.store_addr, tls.as_ref())
            .map_err(|e| Error::Config(e.to_string()))?;
        store.probe(channel, PROBE_INTERVAL);
        let service = server(ingestor);
        let mut host = cairn_server::Host::new();
        host.secure(
            IDENTITY,
            &config.tls,
            config.insecure_listen,
            &config.access,
        )
        .map_err(|e| Error::Config(e.to_string()))?;
        host.observe(&config.metrics_listen, &config.telemetry)
            .await
            .map_err(|e| Error::Server(e.to_string()))?;
        host.add(service)
            .require(&store)
            .drain_deadline(config.drain_deadline());
        host.serve(listener, shutdown)
            .await
            .map_err(|e| Error::Server(e.to_string()))
    }
}
