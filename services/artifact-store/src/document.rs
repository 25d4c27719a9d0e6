//! Versioned JSON documents (write_version optimistic lock).
//!
//! A document is a JSON object whose top-level `write_version` (u64) belongs to the store. An
//! update names the version it read; when that is still the stored one the patch is applied as
//! an RFC 7386 merge patch. Otherwise MERGE_POLICY_NONE aborts with nothing changed, and
//! MERGE_POLICY_MAX merges numbers by maximum (recursively in objects; other patch values win)
//! and still bumps the version: "以最大值合併各計數欄位後遞增版本號". Updates of one
//! path are serialised by a per-path lock and written through the atomic temp+rename path.
//!
//! May depend on: state, layout, files, events, error, cairn-contain; never on `store`.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::events::{NewEvent, RunLogs};
use crate::files;
use crate::layout::check_id;
use crate::state::{blocking, State};

/// The store-owned version key.
pub const VERSION_KEY: &str = "write_version";

/// How a version conflict is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// Conflict = Aborted.
    None,
    /// Numbers by maximum, version bumps.
    Max,
}

/// An UpdateJson request in the store's words.
#[derive(Debug, Clone)]
pub struct Update {
    pub project_id: String,
    pub path: String,
    pub expected_version: u64,
    pub patch_json: String,
    pub merge: Merge,
    pub run_id: String,
}

/// The result of an update.
#[derive(Debug, Clone, PartialEq)]
pub struct Updated {
    pub version: u64,
    pub document: String,
    pub merged_conflict: bool,
}

type PathLock = tokio::sync::Mutex<()>;

/// One async lock per document path being updated.
#[derive(Debug, Default)]
pub struct DocLocks {
    locks: Mutex<HashMap<(String, String), Weak<PathLock>>>,
}

impl DocLocks {
    fn lock_for(&self, project: &str, path: &str) -> Arc<PathLock> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        if locks.len() > 4096 {
            locks.retain(|_, lock| lock.strong_count() > 0);
        }
        let key = (project.to_owned(), path.to_owned());
        if let Some(lock) = locks.get(&key).and_then(Weak::upgrade) {
            return lock;
        }
        let lock = Arc::new(PathLock::new(()));
        locks.insert(key, Arc::downgrade(&lock));
        lock
    }
}

/// UpdateJson.
pub async fn update(
    state: &Arc<State>,
    runs: &RunLogs,
    docs: &DocLocks,
    request: Update,
) -> Result<Updated> {
    check_id("project", &request.project_id)?;
    if !request.run_id.is_empty() {
        check_id("run", &request.run_id)?;
    }
    let path = state.layout.write_path(&request.path, &[])?.to_string();
    let patch = match serde_json::from_str::<Value>(&request.patch_json) {
        Ok(Value::Object(map)) => map,
        Ok(_) => {
            return Err(Error::BadRequest(format!(
                "patch_json for {path:?} must be a JSON object"
            )))
        }
        Err(e) => {
            return Err(Error::BadRequest(format!(
                "patch_json for {path:?} is not valid JSON: {e}"
            )))
        }
    };
    if patch.contains_key(VERSION_KEY) {
        return Err(Error::BadRequest(format!(
            "patch_json for {path:?} sets {VERSION_KEY:?}, which the store owns; send expected_version instead"
        )));
    }
    let lock = docs.lock_for(&request.project_id, &path);
    let _held = lock.lock().await;
    // A Put of the document still being published lands first.
    state.slots.settled(&request.project_id, &path).await;
    let (state2, project, path2, expected, merge) = (
        state.clone(),
        request.project_id.clone(),
        path.clone(),
        request.expected_version,
        request.merge,
    );
    let (updated, stored) = blocking(move || {
        let root = state2.layout.project_root(&project)?;
        let max = state2.config.max_json_bytes;
        let mut doc = read_document(root.as_fd(), &project, &path2, max)?.unwrap_or_default();
        let stored = doc.get(VERSION_KEY).and_then(Value::as_u64).unwrap_or(0);
        let merged_conflict = if expected == stored {
            merge_patch(&mut doc, patch);
            false
        } else if merge == Merge::Max {
            max_merge(&mut doc, patch);
            true
        } else {
            return Err(Error::VersionConflict {
                path: path2,
                stored,
                expected,
            });
        };
        let version = stored + 1;
        doc.insert(VERSION_KEY.to_owned(), Value::from(version));
        let document = Value::Object(doc).to_string();
        if document.len() + 1 > max {
            return Err(Error::TooLarge {
                what: format!("document {path2:?} after the update"),
                limit: max as u64,
            });
        }
        let bytes = Bytes::from(format!("{document}\n"));
        files::write_bytes(&state2, root.as_fd(), &project, &path2, &[bytes], true)?;
        Ok((
            Updated {
                version,
                document,
                merged_conflict,
            },
            stored,
        ))
    })
    .await?;
    if updated.merged_conflict && !request.run_id.is_empty() {
        let event = NewEvent::store(
            "store.json_merged",
            serde_json::json!({"path": path, "expected_version": request.expected_version, "stored_version": stored, "version": updated.version}),
        );
        if let Err(e) = runs
            .append(state, &request.project_id, &request.run_id, vec![event])
            .await
        {
            tracing::error!(error = %e, %path, "could not record store.json_merged");
        }
    }
    Ok(updated)
}

/// The stored document (None when absent); it must be a JSON object.
fn read_document(
    root: std::os::fd::BorrowedFd<'_>,
    project: &str,
    path: &str,
    max: usize,
) -> Result<Option<Map<String, Value>>> {
    let text = match files::read_at_most(root, project, path, max as u64) {
        Ok(Some(text)) => text,
        Ok(None) => return Ok(None),
        Err(Error::TooLarge { limit, .. }) => {
            return Err(Error::TooLarge {
                what: format!("document {path:?}"),
                limit,
            })
        }
        Err(Error::NotAFile { .. }) => {
            return Err(Error::NotAFile {
                path: path.to_owned(),
                found: "this is not a regular file, so not a JSON document",
            })
        }
        Err(e) => return Err(e),
    };
    match serde_json::from_slice::<Value>(&text) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        _ => Err(Error::BadRequest(format!(
            "{path:?} does not hold a JSON object, so it cannot be updated; fix or delete it"
        ))),
    }
}

/// RFC 7386 merge patch of an object into an object.
pub fn merge_patch(target: &mut Map<String, Value>, patch: Map<String, Value>) {
    for (key, value) in patch {
        match value {
            Value::Null => {
                target.remove(&key);
            }
            Value::Object(inner) => {
                let slot = target
                    .entry(key)
                    .or_insert_with(|| Value::Object(Map::new()));
                if !slot.is_object() {
                    *slot = Value::Object(Map::new());
                }
                if let Value::Object(obj) = slot {
                    merge_patch(obj, inner);
                }
            }
            other => {
                target.insert(key, other);
            }
        }
    }
}

/// Merge patch where numbers present on both sides keep the larger one.
pub fn max_merge(target: &mut Map<String, Value>, patch: Map<String, Value>) {
    for (key, value) in patch {
        match (target.get_mut(&key), value) {
            (_, Value::Null) => {
                target.remove(&key);
            }
            (Some(Value::Number(stored)), Value::Number(new)) => {
                if number_greater(&new, stored) {
                    *stored = new;
                }
            }
            (Some(Value::Object(stored)), Value::Object(new)) => max_merge(stored, new),
            (_, Value::Object(new)) => {
                let mut fresh = Map::new();
                merge_patch(&mut fresh, new);
                target.insert(key, Value::Object(fresh));
            }
            (_, other) => {
                target.insert(key, other);
            }
        }
    }
}

fn number_greater(a: &serde_json::Number, b: &serde_json::Number) -> bool {
    let exact = |n: &serde_json::Number| {
        n.as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
    };
    match (exact(a), exact(b)) {
        (Some(x), Some(y)) => x > y,
        _ => a.as_f64().unwrap_or(f64::NAN) > b.as_f64().unwrap_or(f64::NAN),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut doc = obj(json!({"a": "b", "c": {"d": "e", "f": "g"}}));
        merge_patch(&mut doc, obj(json!({"a": "z", "c": {"f": null}})));
        assert_eq!(Value::Object(doc), json!({"a": "z", "c": {"d": "e"}}));
    }

    #[test]
    fn max_merge_keeps_the_larger_counters() {
        let mut doc =
            obj(json!({"done": 5, "nested": {"n": 1.5, "keep": 9}, "name": "old", "gone": 1}));
        max_merge(
            &mut doc,
            obj(
                json!({"done": 3, "nested": {"n": 2, "keep": -1}, "name": "new", "gone": null, "added": 4}),
            ),
        );
        assert_eq!(
            Value::Object(doc),
            json!({"done": 5, "nested": {"n": 2, "keep": 9}, "name": "new", "added": 4})
        );
    }
}
