//! The ingest feature flag per project and per run.
//! Persisted through the store as small JSON documents; a run's setting overrides the
//! project's, which overrides the service default (`default_enabled`).

use bytes::Bytes;
use cairn_proto::v1::PutHeader;
use serde::{Deserialize, Serialize};

use crate::manifest::now_rfc3339;
use crate::store::{StoreClient, StoreError};

/// The project-wide flag document.
pub const PROJECT_FLAG_PATH: &str = ".cairn/ingest.json";

/// The flag document of one run (beside, not inside, `ingest/`: a node may be called
/// anything, and `ingest/<node_id>.json` are its manifests).
pub fn run_flag_path(run_id: &str) -> String {
    format!(".cairn/runs/{run_id}/ingest.json")
}

/// Largest flag document read (they are a few dozen bytes).
const MAX_FLAG_BYTES: u64 = 4096;

/// What a flag document holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlagDoc {
    pub enabled: bool,
    /// When it was set (RFC 3339 UTC).
    #[serde(default)]
    pub updated_at: String,
}

/// Reads one flag document; `None` when there is none (or it is not a flag document).
async fn read(
    store: &StoreClient,
    project_id: &str,
    path: &str,
) -> Result<Option<bool>, StoreError> {
    match store.get(project_id, path, MAX_FLAG_BYTES).await {
        Ok((_, _, bytes)) => match serde_json::from_slice::<FlagDoc>(&bytes) {
            Ok(doc) => Ok(Some(doc.enabled)),
            Err(e) => {
                tracing::warn!(project = project_id, path, error = %e, "ignoring an unreadable ingest flag document");
                Ok(None)
            }
        },
        Err(StoreError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The effective flag: the run's setting (when `run_id` is given and set), else the
/// project's, else `default`.
pub async fn effective(
    store: &StoreClient,
    project_id: &str,
    run_id: Option<&str>,
    default: bool,
) -> Result<bool, StoreError> {
    if let Some(run_id) = run_id {
        if let Some(enabled) = read(store, project_id, &run_flag_path(run_id)).await? {
            return Ok(enabled);
        }
    }
    Ok(read(store, project_id, PROJECT_FLAG_PATH)
        .await?
        .unwrap_or(default))
}

/// Sets the flag of the project (`run_id` None) or of one run.
pub async fn set(
    store: &StoreClient,
    project_id: &str,
    run_id: Option<&str>,
    enabled: bool,
) -> Result<(), StoreError> {
    let path = match run_id {
        Some(run_id) => run_flag_path(run_id),
        None => PROJECT_FLAG_PATH.to_owned(),
    };
    let doc = FlagDoc {
        enabled,
        updated_at: now_rfc3339(),
    };
    let body = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    let header = PutHeader {
        project_id: project_id.to_owned(),
        path,
        overwrite: true,
        run_id: run_id.unwrap_or_default().to_owned(),
        create_project: true,
        ..PutHeader::default()
    };
    store.put(header, Bytes::from(body)).await.map(|_| ())
}
