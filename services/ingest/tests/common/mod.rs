//! A real artifact-store and a real ingest service, in process, on 127.0.0.1 (port 0).
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use cairn_proto::v1::ingest_client::IngestClient;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// A running server and how to stop it.
pub struct Running {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Running {
    /// Graceful shutdown, waits until the server has stopped.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), task).await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// An artifact-store over a fresh temporary data root.
pub struct Store {
    pub data_root: tempfile::TempDir,
    pub server: Running,
}

impl Store {
    pub async fn start() -> Store {
        Store::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut cairn_artifact_store::Config)) -> Store {
        let data_root = tempfile::tempdir().unwrap();
        let mut config = cairn_artifact_store::Config::new(data_root.path());
        adjust(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            cairn_artifact_store::serve(config, listener, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Store {
            data_root,
            server: Running {
                addr,
                stop: Some(stop),
                task: Some(task),
            },
        }
    }

    pub fn addr(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    pub fn project(&self, project: &str) -> PathBuf {
        self.data_root.path().join("projects").join(project)
    }

    pub fn workspace(&self, project: &str) -> PathBuf {
        self.project(project).join("workspace")
    }

    /// The regular files beneath `workspace/` of `project`, by relative path.
    pub fn workspace_files(&self, project: &str) -> BTreeMap<String, Vec<u8>> {
        files_under(&self.workspace(project))
    }

    /// The `ingest.*` events of a run, parsed.
    pub fn events(&self, project: &str, run: &str) -> Vec<serde_json::Value> {
        let path = self
            .project(project)
            .join(".cairn/runs")
            .join(run)
            .join("events.jsonl");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    pub fn events_text(&self, project: &str, run: &str) -> Vec<u8> {
        std::fs::read(
            self.project(project)
                .join(".cairn/runs")
                .join(run)
                .join("events.jsonl"),
        )
        .unwrap_or_default()
    }
}

/// Regular files beneath `root` (symlinks are listed as "-> target" so a test sees them).
pub fn files_under(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let entry = entry.unwrap();
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                out.insert(
                    rel,
                    format!("-> {}", std::fs::read_link(&path).unwrap().display()).into_bytes(),
                );
            } else if kind.is_dir() {
                stack.push(path);
            } else {
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

/// An ingest service talking to `store_addr`.
pub struct Ingest {
    pub server: Running,
    pub client: IngestClient<Channel>,
}

impl Ingest {
    pub async fn start(config: cairn_ingest::Config) -> Ingest {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            cairn_ingest::serve(config, listener, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        let client = IngestClient::new(channel)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        Ingest {
            server: Running {
                addr,
                stop: Some(stop),
                task: Some(task),
            },
            client,
        }
    }
}

/// Ingest's config pointing at `store_addr`.
pub fn config(store_addr: &str) -> cairn_ingest::Config {
    cairn_ingest::Config {
        store_addr: store_addr.to_owned(),
        // These tests check what ingest does once the store is given up on; riding out an
        // outage has its own test.
        dependency_outage_s: 0,
        ..cairn_ingest::Config::default()
    }
}

/// The sha256 of `bytes` by the `sha2` crate, independent of the one ingest computes with.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// An ingest request over an inline document.
pub fn request(project: &str, run: &str, doc: &[u8]) -> cairn_proto::v1::IngestRequest {
    cairn_proto::v1::IngestRequest {
        project_id: project.to_owned(),
        run_id: run.to_owned(),
        node_id: "n1".to_owned(),
        mode: "single".to_owned(),
        doc_path: "docs/answer.md".to_owned(),
        content: bytes::Bytes::copy_from_slice(doc),
        ..Default::default()
    }
}

/// Writes a file through the store's own gRPC API (creating the project).
pub async fn put_file(store_addr: &str, project: &str, path: &str, bytes: &[u8]) {
    use cairn_proto::v1::{
        artifact_store_client::ArtifactStoreClient, put_request::Msg, PutHeader, PutRequest,
    };
    let mut client = ArtifactStoreClient::connect(store_addr.to_owned())
        .await
        .unwrap();
    let header = PutHeader {
        project_id: project.into(),
        path: path.into(),
        create_project: true,
        ..Default::default()
    };
    let messages = vec![
        PutRequest {
            msg: Some(Msg::Header(header)),
        },
        PutRequest {
            msg: Some(Msg::Chunk(bytes::Bytes::copy_from_slice(bytes))),
        },
    ];
    client.put(futures::stream::iter(messages)).await.unwrap();
}
