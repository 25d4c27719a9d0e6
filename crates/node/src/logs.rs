//! What nodes print, as it happens: the log hub (one per orchestrator) holds the output of
//! every running node attempt in memory, wakes whoever watches the run, and, when the attempt
//! ends, stores it in the run directory (`logs/<node>/<attempt>.jsonl`) and forgets it.
//!
//! Bounded: an attempt keeps only its last `retain` bytes; older chunks are dropped and each
//! chunk records its offset in the attempt's whole output, so a reader can say how many bytes
//! it will never see. Kinds write through [`NodeLog`] (`NodeCtx::log`); the orchestrator reads
//! through [`LogHub::snapshot`] and [`read_stored`]. Never holds a lock across an await.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::Engine as _;
use bytes::Bytes;
use cairn_proto::v1::LogStream;
use cairn_store_client::{PutOptions, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tonic::{Code, Status};

use crate::layout::RunDir;

/// Bytes of output kept per node attempt unless configured otherwise.
pub const DEFAULT_RETAIN_BYTES: usize = 1 << 20;
/// Largest stored log file read back (the bound plus its JSON and base64 overhead).
const MAX_STORED_BYTES: u64 = 16 << 20;

/// How an attempt ended (the last chunk of every attempt carries it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    /// succeeded | failed | refused | timeout | unavailable | canceled.
    pub outcome: String,
    /// The node's error when it failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// One piece of an attempt's output.
#[derive(Clone, Debug, PartialEq)]
pub struct Chunk {
    /// From 1, one more per chunk of the attempt.
    pub seq: u64,
    /// Bytes of the attempt's output before this chunk's data.
    pub offset: u64,
    pub stream: LogStream,
    pub data: Bytes,
    /// Set on the attempt's last chunk (which has no data).
    pub end: Option<End>,
}

/// An attempt's output as the hub holds it.
#[derive(Default)]
struct Attempt {
    chunks: VecDeque<Chunk>,
    /// Data bytes in `chunks`.
    bytes: usize,
    next_seq: u64,
    /// Bytes of output written so far (kept or dropped).
    total: u64,
    ended: bool,
    /// Stored in the run directory: `chunks` is empty, readers read the file.
    stored: bool,
}

impl Attempt {
    fn push(&mut self, stream: LogStream, mut data: Bytes, retain: usize, end: Option<End>) {
        if data.len() > retain {
            // Only the tail of a chunk larger than the bound is kept.
            let cut = data.len() - retain;
            self.total += cut as u64;
            data = data.slice(cut..);
        }
        while self.bytes + data.len() > retain {
            match self.chunks.pop_front() {
                Some(old) => self.bytes -= old.data.len(),
                None => break,
            }
        }
        self.next_seq += 1;
        let len = data.len();
        self.chunks.push_back(Chunk {
            seq: self.next_seq,
            offset: self.total,
            stream,
            data,
            end,
        });
        self.bytes += len;
        self.total += len as u64;
    }
}

/// One run's attempts, by (node, attempt), and the line that wakes its watchers.
struct RunLogs {
    attempts: BTreeMap<(String, u32), Attempt>,
    changed: watch::Sender<()>,
}

impl RunLogs {
    fn new() -> RunLogs {
        RunLogs {
            attempts: BTreeMap::new(),
            changed: watch::channel(()).0,
        }
    }
}

/// What a watcher gets of one attempt the hub knows.
#[derive(Debug)]
pub enum Held {
    /// Still in memory: the kept chunks from the asked sequence number on.
    Live(Vec<Chunk>),
    /// Ended and stored: read the file ([`read_stored`]).
    Stored,
}

/// The orchestrator's in-memory node output.
pub struct LogHub {
    retain: usize,
    runs: Mutex<HashMap<String, RunLogs>>,
}

fn key(project: &str, run_id: &str) -> String {
    format!("{project}/{run_id}")
}

impl LogHub {
    /// A hub that keeps at most `retain` bytes per attempt (at least 1).
    pub fn new(retain: usize) -> LogHub {
        LogHub {
            retain: retain.max(1),
            runs: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, RunLogs>> {
        // A panic elsewhere must not stop the logs: the map is valid after any one operation.
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes to run `key` on `attempt`, with the run's watchers woken.
    fn change(&self, k: &str, node: &str, attempt: u32, f: impl FnOnce(&mut Attempt, usize)) {
        let mut runs = self.lock();
        let run = runs.entry(k.to_owned()).or_insert_with(RunLogs::new);
        let a = run.attempts.entry((node.to_owned(), attempt)).or_default();
        f(a, self.retain);
        run.changed.send_replace(());
    }

    /// Wakes on every change of the run's output; Err from `changed()` means the run was
    /// forgotten (subscribe again).
    pub fn subscribe(&self, project: &str, run_id: &str) -> watch::Receiver<()> {
        self.lock()
            .entry(key(project, run_id))
            .or_insert_with(RunLogs::new)
            .changed
            .subscribe()
    }

    /// The attempts the hub knows (of `node`, or all), each with its chunks from the sequence
    /// number `from(node, attempt)` gives.
    pub fn snapshot(
        &self,
        project: &str,
        run_id: &str,
        node: Option<&str>,
        from: impl Fn(&str, u32) -> u64,
    ) -> Vec<(String, u32, Held)> {
        let runs = self.lock();
        let Some(run) = runs.get(&key(project, run_id)) else {
            return Vec::new();
        };
        run.attempts
            .iter()
            .filter(|((n, _), _)| node.is_none_or(|want| n.as_str() == want))
            .map(|((n, at), a)| {
                let held = if a.stored {
                    Held::Stored
                } else {
                    let first = from(n, *at);
                    Held::Live(
                        a.chunks
                            .iter()
                            .filter(|c| c.seq >= first)
                            .cloned()
                            .collect(),
                    )
                };
                (n.clone(), *at, held)
            })
            .collect()
    }

    /// Forgets the ended attempts of a run whose driver stopped (readers find them stored);
    /// attempts still running (of a driver started since) stay.
    pub fn forget(&self, project: &str, run_id: &str) {
        let mut runs = self.lock();
        let k = key(project, run_id);
        if let Some(run) = runs.get_mut(&k) {
            run.attempts.retain(|_, a| !a.ended);
            if run.attempts.is_empty() {
                runs.remove(&k);
            }
        }
    }

    /// Forgets the run's entry if it holds nothing and nobody else watches it.
    pub fn release(&self, project: &str, run_id: &str) {
        let mut runs = self.lock();
        let k = key(project, run_id);
        if runs
            .get(&k)
            .is_some_and(|r| r.attempts.is_empty() && r.changed.receiver_count() == 0)
        {
            runs.remove(&k);
        }
    }

    /// Ends an attempt that was begun (pushing its end marker) and gives its kept chunks;
    /// None when it was never begun or is stored already.
    fn end(&self, k: &str, node: &str, attempt: u32, end: End) -> Option<Vec<Chunk>> {
        let mut runs = self.lock();
        let run = runs.get_mut(k)?;
        let a = run.attempts.get_mut(&(node.to_owned(), attempt))?;
        if a.stored {
            return None;
        }
        if !a.ended {
            a.ended = true;
            a.push(LogStream::Unspecified, Bytes::new(), self.retain, Some(end));
            run.changed.send_replace(());
        }
        Some(a.chunks.iter().cloned().collect())
    }

    fn mark_stored(&self, k: &str, node: &str, attempt: u32) {
        let mut runs = self.lock();
        if let Some(run) = runs.get_mut(k) {
            if let Some(a) = run.attempts.get_mut(&(node.to_owned(), attempt)) {
                a.stored = true;
                a.chunks.clear();
                a.bytes = 0;
            }
            run.changed.send_replace(());
        }
    }
}

impl Default for LogHub {
    fn default() -> LogHub {
        LogHub::new(DEFAULT_RETAIN_BYTES)
    }
}

/// One node attempt's output line into the hub. Nothing is kept until [`NodeLog::begin`] (only
/// kinds that print anything begin one, so only their attempts get a stored log).
#[derive(Clone)]
pub struct NodeLog {
    hub: Arc<LogHub>,
    key: String,
    run_id: String,
    project: String,
    node: String,
    attempt: u32,
}

impl NodeLog {
    pub fn new(hub: Arc<LogHub>, project: &str, run_id: &str, node: &str, attempt: u32) -> Self {
        NodeLog {
            hub,
            key: key(project, run_id),
            run_id: run_id.to_owned(),
            project: project.to_owned(),
            node: node.to_owned(),
            attempt,
        }
    }

    /// Opens this attempt's log (so it ends with an end marker even when nothing is printed).
    pub fn begin(&self) {
        self.hub
            .change(&self.key, &self.node, self.attempt, |_, _| {});
    }

    /// Output of the program, as it comes.
    pub fn write(&self, stream: LogStream, data: Bytes) {
        if data.is_empty() {
            return;
        }
        self.hub
            .change(&self.key, &self.node, self.attempt, |a, retain| {
                if !a.ended {
                    a.push(stream, data, retain, None);
                }
            });
    }

    /// A line of the orchestrator's own about the work (`$ command`, `[exit 1]`).
    pub fn step(&self, line: &str) {
        let mut text = line.to_owned();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        self.write(LogStream::Step, Bytes::from(text));
    }

    /// Ends the attempt's log (when it was begun) and stores it in the run directory; then the
    /// hub forgets its chunks. A failed write is logged: the output stays in memory until the
    /// run's driver stops.
    pub async fn finish(&self, store: &Store, end: End) {
        let Some(chunks) = self.hub.end(&self.key, &self.node, self.attempt, end) else {
            return;
        };
        let path = RunDir::new(&self.run_id).node_log(&self.node, self.attempt);
        let opts = PutOptions {
            overwrite: true,
            ..Default::default()
        };
        match store
            .put(&self.project, &path, Bytes::from(encode(&chunks)), &opts)
            .await
        {
            Ok(_) => self.hub.mark_stored(&self.key, &self.node, self.attempt),
            Err(s) => {
                tracing::warn!(path = %path, error = %s.message(), "cannot store the node's output; it is kept in memory until the run stops")
            }
        }
    }
}

/// One line of a stored log (logs/<node>/<attempt>.jsonl).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Line {
    seq: u64,
    offset: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    stream: String,
    /// The data when it is UTF-8 ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    /// ... else as base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    end: Option<End>,
}

fn stream_name(s: LogStream) -> &'static str {
    match s {
        LogStream::Stdout => "stdout",
        LogStream::Stderr => "stderr",
        LogStream::Step => "step",
        LogStream::Unspecified => "",
    }
}

fn stream_of(name: &str) -> LogStream {
    match name {
        "stdout" => LogStream::Stdout,
        "stderr" => LogStream::Stderr,
        "step" => LogStream::Step,
        _ => LogStream::Unspecified,
    }
}

/// Chunks as JSON lines.
pub fn encode(chunks: &[Chunk]) -> String {
    let mut out = String::new();
    for c in chunks {
        let (text, b64) = match std::str::from_utf8(&c.data) {
            Ok(t) if !t.is_empty() => (Some(t.to_owned()), None),
            Ok(_) => (None, None),
            Err(_) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(&c.data)),
            ),
        };
        let line = Line {
            seq: c.seq,
            offset: c.offset,
            stream: stream_name(c.stream).to_owned(),
            text,
            base64: b64,
            end: c.end.clone(),
        };
        if let Ok(l) = serde_json::to_string(&line) {
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

/// Chunks from JSON lines; lines that do not parse are skipped.
pub fn decode(text: &str) -> Vec<Chunk> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Line>(l).ok())
        .map(|l| {
            let data = match (l.text, l.base64) {
                (Some(t), _) => Bytes::from(t),
                (None, Some(b)) => base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map(Bytes::from)
                    .unwrap_or_default(),
                (None, None) => Bytes::new(),
            };
            Chunk {
                seq: l.seq,
                offset: l.offset,
                stream: stream_of(&l.stream),
                data,
                end: l.end,
            }
        })
        .collect()
}

/// The stored attempts of a run (of `node`, or all) as (node, attempt), in order.
pub async fn list_stored(
    store: &Store,
    project: &str,
    run_id: &str,
    node: Option<&str>,
) -> Result<Vec<(String, u32)>, Status> {
    let dir = RunDir::new(run_id).path("logs");
    let prefix = match node {
        Some(n) => format!("{dir}/{n}"),
        None => dir.clone(),
    };
    let entries = match store.list(project, &prefix, true).await {
        Ok(e) => e,
        Err(s) if s.code() == Code::NotFound => return Ok(Vec::new()),
        Err(s) => return Err(s),
    };
    let mut out: Vec<(String, u32)> = entries
        .into_iter()
        .filter(|e| e.kind == cairn_proto::v1::EntryKind::File as i32)
        .filter_map(|e| {
            let rel = e.path.strip_prefix(&dir)?.strip_prefix('/')?;
            let (n, file) = rel.split_once('/')?;
            let attempt = file.strip_suffix(".jsonl")?.parse().ok()?;
            Some((n.to_owned(), attempt))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// A stored attempt's chunks (none when it is not stored).
pub async fn read_stored(
    store: &Store,
    project: &str,
    run_id: &str,
    node: &str,
    attempt: u32,
) -> Result<Vec<Chunk>, Status> {
    let path = RunDir::new(run_id).node_log(node, attempt);
    let bytes = store.get_at_most(project, &path, MAX_STORED_BYTES).await?;
    Ok(bytes
        .map(|b| decode(&String::from_utf8_lossy(&b)))
        .unwrap_or_default())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn texts(a: &Attempt) -> Vec<(u64, u64, String)> {
        a.chunks
            .iter()
            .map(|c| {
                (
                    c.seq,
                    c.offset,
                    String::from_utf8_lossy(&c.data).into_owned(),
                )
            })
            .collect()
    }

    /// The oldest chunks go first; offsets keep counting what was dropped.
    #[test]
    fn an_attempt_keeps_only_its_last_bytes() {
        let mut a = Attempt::default();
        for s in ["aaaa", "bbbb", "cccc"] {
            a.push(LogStream::Stdout, Bytes::from(s), 8, None);
        }
        assert_eq!(
            texts(&a),
            vec![(2, 4, "bbbb".into()), (3, 8, "cccc".into())]
        );
        a.push(LogStream::Stderr, Bytes::from("0123456789"), 8, None);
        assert_eq!(texts(&a), vec![(4, 14, "23456789".into())]);
        assert_eq!(a.total, 22);
        assert!(a.bytes <= 8);
    }

    #[test]
    fn stored_lines_round_trip_text_and_binary() {
        let chunks = vec![
            Chunk {
                seq: 1,
                offset: 0,
                stream: LogStream::Stdout,
                data: Bytes::from("héllo\n"),
                end: None,
            },
            Chunk {
                seq: 2,
                offset: 7,
                stream: LogStream::Stderr,
                data: Bytes::from_static(&[0xff, 0x00, b'x']),
                end: None,
            },
            Chunk {
                seq: 3,
                offset: 10,
                stream: LogStream::Unspecified,
                data: Bytes::new(),
                end: Some(End {
                    outcome: "failed".into(),
                    error: "exit 1".into(),
                }),
            },
        ];
        assert_eq!(decode(&encode(&chunks)), chunks);
    }
}
