//! The files a submitted graph names, found where the submitter may put them: the files sent
//! with the request, else the run's project (under the request's `graph_dir`) through the
//! store under its path rules. This module never opens a file of the orchestrator's host: a
//! request names no host path, so no request can reach the host's files or key material.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;

use bytes::Bytes;
use cairn_node::RunDir;
use cairn_phases::inputs::{self, GraphFiles};
use cairn_proto::v1::InputFile;
use cairn_store_client::{PutOptions, Store};
use pathguard::SafePath;
use tonic::Code;

use crate::error::{Error, Result};

/// Run records: never a graph's input.
const RECORDS: &str = ".cairn";

const HINT: &str = "`cairn run` sends the files a graph names from the graph file's directory; a graph started from the project finds them beside it (graph_dir)";

/// Where one submit's graph finds its files; keeps the ones it read, to record with the run.
pub struct Inputs<'a> {
    store: &'a Store,
    project: &'a str,
    graph_dir: Option<SafePath>,
    sent: BTreeMap<SafePath, Bytes>,
    used: Mutex<BTreeMap<SafePath, Bytes>>,
    /// The store could not be reached (the submit is then UNAVAILABLE, not a bad graph).
    unavailable: Mutex<Option<tonic::Status>>,
}

impl<'a> Inputs<'a> {
    /// Checks what the request sent and its `graph_dir`.
    pub fn new(
        store: &'a Store,
        project: &'a str,
        graph_dir: &str,
        files: Vec<InputFile>,
    ) -> Result<Inputs<'a>> {
        let sent = inputs::check_sent(files).map_err(Error::InvalidArgument)?;
        let graph_dir = match graph_dir.trim_end_matches('/') {
            "" => None,
            d => {
                let dir = pathguard::validate(d).map_err(|rej| {
                    Error::field(
                        "graph_dir",
                        format!("graph_dir `{d}`: {rej} (a directory of the run's project)"),
                    )
                })?;
                if dir.components().next() == Some(RECORDS) {
                    return Err(records_refused("graph_dir", d));
                }
                Some(dir)
            }
        };
        Ok(Inputs {
            store,
            project,
            graph_dir,
            sent,
            used: Mutex::new(BTreeMap::new()),
            unavailable: Mutex::new(None),
        })
    }

    /// The store's outage, if a read met one.
    pub fn unavailable(&self) -> Option<Error> {
        let status = self.unavailable.lock().ok()?.take()?;
        Some(Error::Store {
            context: "reading the files the graph names".into(),
            status,
        })
    }

    /// The files the graph read, by path relative to the graph's directory.
    pub fn into_used(self) -> BTreeMap<SafePath, Bytes> {
        self.used.into_inner().unwrap_or_default()
    }

    async fn read_now(&self, path: &SafePath) -> std::result::Result<String, String> {
        if let Some(bytes) = self.sent.get(path) {
            let text = inputs::text(path, bytes)?;
            self.keep(path, bytes.clone());
            return Ok(text);
        }
        let in_project = match &self.graph_dir {
            Some(d) => d
                .checked_join(path)
                .map_err(|rej| format!("`{path}`: {rej}"))?,
            None => path.clone(),
        };
        if in_project.components().next() == Some(RECORDS) {
            return Err(records_refused("a file the graph names", in_project.as_str()).to_string());
        }
        let read = self
            .store
            .get_at_most(self.project, in_project.as_str(), inputs::MAX_FILE_BYTES)
            .await;
        let bytes = match read {
            Ok(Some(b)) => b,
            Ok(None) => {
                return Err(format!(
                    "`{path}` was not sent with the graph and project `{}` has no `{in_project}`; {HINT}",
                    self.project
                ))
            }
            Err(s) if s.code() == Code::ResourceExhausted => return Err(inputs::too_large(path)),
            Err(s) if matches!(s.code(), Code::Unavailable | Code::Unknown | Code::Cancelled) => {
                let m = format!("cannot read `{in_project}` from the artifact-store");
                if let Ok(mut u) = self.unavailable.lock() {
                    u.get_or_insert(s);
                }
                return Err(m);
            }
            // The store's own refusals (a symlink, the denylist, not a file) name the path.
            Err(s) => return Err(format!("`{in_project}` in the project: {}", s.message())),
        };
        let text = inputs::text(path, &bytes)?;
        self.keep(path, bytes);
        Ok(text)
    }

    fn keep(&self, path: &SafePath, bytes: Bytes) {
        if let Ok(mut used) = self.used.lock() {
            used.insert(path.clone(), bytes);
        }
    }
}

impl GraphFiles for Inputs<'_> {
    fn read(
        &self,
        path: &SafePath,
    ) -> impl Future<Output = std::result::Result<String, String>> + Send {
        self.read_now(path)
    }
}

fn records_refused(what: &str, path: &str) -> Error {
    let message = format!(
        "{what} `{path}` is under `{RECORDS}/`, the run records, which are no graph's input; {HINT}"
    );
    if what == "graph_dir" {
        Error::field(what, message)
    } else {
        Error::InvalidArgument(message)
    }
}

/// The project path where run `run_id` keeps input `path`.
pub fn record_path(run_id: &str, path: &SafePath) -> String {
    RunDir::new(run_id).path(&format!("inputs/{path}"))
}

/// Writes the files the graph read under the run's `inputs/`.
pub async fn record(
    store: &Store,
    project: &str,
    run_id: &str,
    used: &BTreeMap<SafePath, Bytes>,
) -> Result<()> {
    let opts = &PutOptions::default();
    let puts = used.iter().map(|(p, body)| {
        let at = record_path(run_id, p);
        async move {
            store
                .put(project, &at, body.clone(), opts)
                .await
                .map_err(Error::store(format!("writing {at}")))
        }
    });
    for r in futures::future::join_all(puts).await {
        r?;
    }
    Ok(())
}
