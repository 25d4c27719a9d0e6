//! cairn's artifact-store: the single canonical writer of project files, run records and
//! manifests.
//!
//! Embedding: [`artifact_store_service`] opens the data root, sweeps leftover temp files and
//! returns the tonic server to add to a `cairn_server::Host`; [`serve`] runs it standalone
//! (with health, reflection and graceful shutdown from `cairn-server`).

mod access;
mod archive;
mod backup;
mod claim;
#[cfg(test)]
mod commit_order;
pub mod config;
mod deferred;
mod digest;
mod document;
pub mod error;
mod event_seek;
mod events;
mod files;
mod layout;
mod page;
mod project;
mod publication;
mod quota;
mod read;
mod retention;
mod run_index;
mod run_records;
mod service;
mod slots;
mod snapshots;
mod stamp;
mod state;
mod store;
mod sweep;
mod temp;
mod write;

use std::future::Future;
use std::sync::Arc;

use cairn_proto::v1::artifact_store_server::ArtifactStoreServer;

pub use config::{Config, ConfigArgs};
pub use error::{Error, Result};
pub use service::ArtifactStoreService;

/// The identity whose certificate the store serves with (`<tls.dir>/artifact-store.pem`).
pub const IDENTITY: &str = "artifact-store";

/// Largest gRPC message the store accepts or sends (Put chunks are at most 4 MiB).
const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Opens the store over `config.data_root` (created when missing), removes temp files left by
/// a crash, and returns the gRPC service ready to be hosted.
pub async fn artifact_store_service(
    config: Config,
) -> Result<ArtifactStoreServer<ArtifactStoreService>> {
    let store = tokio::task::spawn_blocking(move || -> Result<store::Store> {
        let store = store::Store::open(config)?;
        let root = &store.config().data_root;
        let removed = sweep::remove_temp_files(root)
            .map_err(|e| Error::io(format!("sweeping temp files under {}", root.display()), e))?;
        tracing::info!(data_root = %root.display(), removed_temp_files = removed, "artifact-store ready");
        Ok(store)
    })
    .await
    .map_err(|e| Error::Server(format!("start-up task failed: {e}")))??;
    let store = Arc::new(store);
    // Each project's run index is checked against its run directories in the background;
    // a query that comes first loads its project itself.
    let loading = store.clone();
    tokio::task::spawn_blocking(move || {
        for (project, checked) in loading.load_run_indexes() {
            if let Err(e) = checked {
                tracing::warn!(%project, error = %e, "loading the run index failed; its first query tries again");
            }
        }
    });
    if store.config().sweeps() {
        let sweeping = Arc::downgrade(&store);
        let every = std::time::Duration::from_secs(store.config().retention.sweep_interval_s);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                // The sweep ends with the store.
                let Some(store) = sweeping.upgrade() else {
                    return;
                };
                store.sweep_retention().await;
            }
        });
    }
    Ok(ArtifactStoreServer::new(ArtifactStoreService::new(store))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
        // Clients may send gzip-compressed requests (replies stay uncompressed).
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip))
}

/// Serves the store alone on `listener` until `shutdown` resolves; in-flight calls finish
/// first (a Put either completes and publishes or leaves nothing).
pub async fn serve(
    config: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let drain = std::time::Duration::from_secs(config.drain_deadline_s);
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
    let service = artifact_store_service(config).await?;
    host.add(service).drain_deadline(drain);
    host.serve(listener, shutdown)
        .await
        .map_err(|e| Error::Server(e.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeSet;

    /// The modules from the bottom up; a module may use only modules of a lower layer (so the
    /// graph of `crate::` imports has no cycle, and nothing beneath `store` reaches it).
    const LAYERS: &[&[&str]] = &[
        &["error"],
        &["claim"],
        &[
            "config",
            "page",
            "stamp",
            "digest",
            "slots",
            "publication",
            "deferred",
            "access",
            "quota",
            "run_records",
            "event_seek",
        ],
        &["layout"],
        &["temp"],
        &["state"],
        &["files", "read", "run_index", "snapshots"],
        &["project"],
        &["events", "events_reader", "retention"],
        &["write", "write_tests", "archive", "backup"],
        &["document", "commit_order"],
        &["store", "sweep"],
        &["service"],
        &["lib", "main"],
    ];

    fn layer(module: &str) -> Option<usize> {
        LAYERS.iter().position(|l| l.contains(&module))
    }

    /// The modules a source file names through `crate::` (comments left out; names the crate
    /// root re-exports are counted as their modules).
    fn uses(source: &str) -> BTreeSet<String> {
        let mut used = BTreeSet::new();
        for line in source.lines() {
            let code = line.split("//").next().unwrap_or("");
            let mut rest = code;
            while let Some(at) = rest.find("crate::") {
                rest = &rest[at + "crate::".len()..];
                let names: Vec<&str> = match rest.strip_prefix('{') {
                    Some(group) => group.split('}').next().unwrap_or("").split(',').collect(),
                    None => vec![rest],
                };
                for name in names {
                    let name: String = name
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    let module = match name.as_str() {
                        "Error" | "Result" => "error".to_owned(),
                        "Config" | "ConfigArgs" => "config".to_owned(),
                        _ => name,
                    };
                    if layer(&module).is_some() {
                        used.insert(module);
                    }
                }
            }
        }
        used
    }

    #[test]
    fn modules_use_only_the_layers_beneath_them() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut seen = 0;
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            let Some(module) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            let at = layer(module).unwrap_or_else(|| panic!("{module}.rs is in no layer"));
            for used in uses(&std::fs::read_to_string(&path).unwrap()) {
                let below = layer(&used).is_some_and(|l| l < at);
                assert!(below, "{module} uses {used}, which is not beneath it");
            }
            seen += 1;
        }
        assert_eq!(seen, LAYERS.iter().map(|l| l.len()).sum::<usize>());
        assert!(
            uses("use crate::{access, Result};\nuse crate::store::Store; // crate::x")
                .into_iter()
                .eq(["access", "error", "store"])
        );
    }
}
