//! Shared test harness: a store served in-process on 127.0.0.1:0 (or the real binary as a
//! child process), and small client helpers over the generated gRPC client.
#![allow(clippy::unwrap_used)]
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use cairn_artifact_store::Config;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::{
    get_response, put_request, GetRequest, PutHeader, PutRequest, PutResponse, WriteOutcome,
};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tonic::transport::Channel;
use tonic::{Code, Status};

pub type Client = ArtifactStoreClient<Channel>;

/// A store served in-process until dropped.
pub struct Served {
    pub client: Client,
    pub addr: String,
    pub data_root: PathBuf,
    pub shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: Option<tokio::task::JoinHandle<cairn_artifact_store::Result<()>>>,
    _tmp: Option<tempfile::TempDir>,
}

impl Served {
    /// Stops accepting and waits for in-flight calls.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }

    pub fn project_dir(&self, project: &str) -> PathBuf {
        self.data_root.join("projects").join(project)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Serves a store over a fresh temp data root.
pub async fn serve() -> Served {
    let tmp = tempfile::tempdir().unwrap();
    let config = Config::new(tmp.path().join("data"));
    let mut served = serve_with(config).await;
    served._tmp = Some(tmp);
    served
}

/// Serves a store with `config` on 127.0.0.1:0.
pub async fn serve_with(config: Config) -> Served {
    let data_root = config.data_root.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(cairn_artifact_store::serve(config, listener, async move {
        let _ = rx.await;
    }));
    let client = connect(&addr).await;
    Served {
        client,
        addr,
        data_root,
        shutdown: Some(tx),
        task: Some(task),
        _tmp: None,
    }
}

/// Connects, retrying while the server comes up.
pub async fn connect(addr: &str) -> Client {
    for _ in 0..200 {
        if let Ok(c) = ArtifactStoreClient::connect(addr.to_owned()).await {
            return c
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("store at {addr} did not come up");
}

/// Every event of `run` (the call must succeed).
pub async fn run_events(
    client: &mut Client,
    project: &str,
    run: &str,
) -> Vec<cairn_proto::v1::Event> {
    run_events_from(client, project, run, 1, 0).await
}

/// The events of `run` from `from_seq`, at most `limit` (0 = all; the call must succeed).
pub async fn run_events_from(
    client: &mut Client,
    project: &str,
    run: &str,
    from_seq: u64,
    limit: u64,
) -> Vec<cairn_proto::v1::Event> {
    use futures::StreamExt;
    client
        .read_events(cairn_proto::v1::ReadEventsRequest {
            project_id: project.into(),
            run_id: run.into(),
            from_seq,
            follow: false,
            limit,
        })
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await
}

/// Creates `project` (idempotent).
pub async fn create_project(client: &mut Client, project: &str) {
    client
        .create_project(cairn_proto::v1::CreateProjectRequest {
            project_id: project.into(),
        })
        .await
        .unwrap();
}

pub fn header(project: &str, path: &str) -> PutHeader {
    PutHeader {
        project_id: project.into(),
        path: path.into(),
        create_project: true,
        ..Default::default()
    }
}

/// Put of `bytes` in chunks of 64 KiB.
pub async fn put_with(
    client: &mut Client,
    header: PutHeader,
    bytes: &[u8],
) -> Result<PutResponse, Status> {
    let mut msgs = vec![PutRequest {
        msg: Some(put_request::Msg::Header(header)),
    }];
    for chunk in bytes.chunks(64 << 10) {
        msgs.push(PutRequest {
            msg: Some(put_request::Msg::Chunk(Bytes::copy_from_slice(chunk))),
        });
    }
    client
        .put(tokio_stream::iter(msgs))
        .await
        .map(|r| r.into_inner())
}

pub async fn put(
    client: &mut Client,
    project: &str,
    path: &str,
    bytes: &[u8],
) -> Result<PutResponse, Status> {
    put_with(client, header(project, path), bytes).await
}

pub async fn put_overwrite(
    client: &mut Client,
    project: &str,
    path: &str,
    bytes: &[u8],
) -> Result<PutResponse, Status> {
    put_with(
        client,
        PutHeader {
            overwrite: true,
            ..header(project, path)
        },
        bytes,
    )
    .await
}

pub fn outcome(r: &PutResponse) -> WriteOutcome {
    WriteOutcome::try_from(r.outcome).unwrap()
}

/// Get of a range: (info sha256, size, bytes).
pub async fn get_range(
    client: &mut Client,
    project: &str,
    path: &str,
    offset: u64,
    length: u64,
) -> Result<(String, u64, Vec<u8>), Status> {
    let mut stream = client
        .get(GetRequest {
            project_id: project.into(),
            path: path.into(),
            offset,
            length,
        })
        .await?
        .into_inner();
    let mut info = None;
    let mut bytes = Vec::new();
    while let Some(msg) = stream.next().await {
        match msg?.msg {
            Some(get_response::Msg::Info(i)) => info = Some(i),
            Some(get_response::Msg::Chunk(c)) => bytes.extend_from_slice(&c),
            None => {}
        }
    }
    let info = info.expect("Get sends a FileInfo first");
    Ok((info.sha256, info.size_bytes, bytes))
}

pub async fn get(client: &mut Client, project: &str, path: &str) -> Result<Vec<u8>, Status> {
    get_range(client, project, path, 0, 0)
        .await
        .map(|(_, _, b)| b)
}

/// Asserts a refusal's code and `cairn-reason`.
pub fn assert_refused<T: std::fmt::Debug>(
    result: Result<T, Status>,
    code: Code,
    reason: &str,
) -> Status {
    let status = result.expect_err("expected a refusal");
    assert_eq!(status.code(), code, "status: {status:?}");
    assert_eq!(
        cairn_proto::reason::of(&status).as_deref(),
        Some(reason),
        "status: {status:?}"
    );
    status
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Deterministic pseudo-random bytes (xorshift), so large bodies need no stored fixture.
pub struct Bytegen(u64);

impl Bytegen {
    pub fn new(seed: u64) -> Self {
        Bytegen(seed | 1)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
    }
}

/// Files under `dir` whose name starts with `.cairn-tmp-`.
/// Polls `cond` until it holds; panics naming `what` after 30 s (a loaded machine is slow,
/// a broken store never gets there).
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited 30 s for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

pub fn temp_files(dir: &Path) -> Vec<PathBuf> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(".cairn-tmp-"))
        .map(|e| e.path().to_path_buf())
        .collect()
}

/// Fails unless every `.cairn-tmp-*` file under `root` is gone within 30 s. A live store
/// writes its run index through a temp file too (a restarted one rewrites it in the
/// background), so only a temp file that stays is a leftover.
pub async fn assert_no_temp_files_stay(root: &Path, context: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left = temp_files(root);
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{context}: temp files left: {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Temp files the process `pid` is writing under `root`: named `.cairn-tmp-*` ones and
/// unnamed (O_TMPFILE) ones, with the bytes each holds so far.
pub fn open_temp_files(pid: u32, root: &Path) -> Vec<(String, u64)> {
    let root = root.canonicalize().unwrap();
    let mut out = Vec::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        let shown = target.to_string_lossy().into_owned();
        let temp = shown.contains("/.cairn-tmp-") || shown.ends_with(" (deleted)");
        if temp && target.starts_with(&root) {
            let size = std::fs::metadata(fd.path()).map(|m| m.len()).unwrap_or(0);
            out.push((shown, size));
        }
    }
    out
}

/// The store binary running as a child process.
pub struct Process {
    pub child: Child,
    pub addr: String,
}

impl Process {
    pub fn spawn(data_root: &Path) -> Process {
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_cairn-artifact-store"))
            .args([
                "--data-root",
                data_root.to_str().unwrap(),
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Process {
            child,
            addr: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Peak resident set size (VmHWM) in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Resets the peak (VmHWM) to what is resident now, and returns that (KiB).
    pub fn reset_peak_rss(&self) -> u64 {
        std::fs::write(format!("/proc/{}/clear_refs", self.child.id()), "5").unwrap();
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
