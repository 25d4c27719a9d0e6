//! WatchLogs: what a run's nodes printed, from the log hub (attempts running here) and the run
//! directory (ended attempts, `logs/<node>/<attempt>.jsonl`), then, when following, live until
//! the run is final and every attempt seen has ended. Each attempt's chunks are sent in order,
//! once; a gap in the offsets (output dropped beyond the bound) is sent as `dropped_bytes`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cairn_node::logs::{self as hub, Chunk, Held, LogHub};
use cairn_proto::v1 as pb;
use cairn_store_client::Store;
use tokio::sync::mpsc;
use tonic::Status;

/// How often a follower looks at the run's state when no output comes.
const FINAL_CHECK: Duration = Duration::from_secs(1);

/// What WatchLogs asks for, decoded.
#[derive(Clone, Debug, Default)]
pub struct LogQuery {
    pub project: String,
    pub run_id: String,
    pub node: Option<String>,
    pub follow: bool,
    pub after_attempt: u32,
    pub after_seq: u64,
}

/// How far one attempt has been sent.
#[derive(Default)]
struct Cursor {
    next_seq: u64,
    /// Offset just past the last data sent; None after a resume (nothing to compare).
    offset: Option<u64>,
    ended: bool,
}

pub type Sink = mpsc::Sender<Result<pb::LogChunk, Status>>;

/// One WatchLogs stream.
pub struct Watcher {
    hub: Arc<LogHub>,
    store: Store,
    q: LogQuery,
    cursors: BTreeMap<(String, u32), Cursor>,
    tx: Sink,
}

/// The client went away.
pub struct Gone;

impl Watcher {
    pub fn new(hub: Arc<LogHub>, store: Store, q: LogQuery, tx: Sink) -> Watcher {
        Watcher {
            hub,
            store,
            q,
            cursors: BTreeMap::new(),
            tx,
        }
    }

    pub fn query(&self) -> &LogQuery {
        &self.q
    }

    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<()> {
        self.hub.subscribe(&self.q.project, &self.q.run_id)
    }

    pub fn release(&self) {
        self.hub.release(&self.q.project, &self.q.run_id);
    }

    pub fn sink(&self) -> &Sink {
        &self.tx
    }

    fn cursor(&mut self, node: &str, attempt: u32) -> &mut Cursor {
        let (after_attempt, after_seq) = (self.q.after_attempt, self.q.after_seq);
        self.cursors
            .entry((node.to_owned(), attempt))
            .or_insert_with(|| {
                if attempt < after_attempt {
                    // Before the resume point: nothing of it is sent.
                    Cursor {
                        next_seq: u64::MAX,
                        offset: None,
                        ended: true,
                    }
                } else if attempt == after_attempt && after_seq > 0 {
                    Cursor {
                        next_seq: after_seq + 1,
                        offset: None,
                        ended: false,
                    }
                } else {
                    Cursor {
                        next_seq: 1,
                        offset: Some(0),
                        ended: false,
                    }
                }
            })
    }

    fn next_seq(&self, node: &str, attempt: u32) -> u64 {
        match self.cursors.get(&(node.to_owned(), attempt)) {
            Some(c) => c.next_seq,
            None if attempt < self.q.after_attempt => u64::MAX,
            None if attempt == self.q.after_attempt && self.q.after_seq > 0 => self.q.after_seq + 1,
            None => 1,
        }
    }

    async fn send(&mut self, node: &str, attempt: u32, chunks: Vec<Chunk>) -> Result<(), Gone> {
        for c in chunks {
            let cur = self.cursor(node, attempt);
            if cur.ended || c.seq < cur.next_seq {
                continue;
            }
            let dropped = cur.offset.map_or(0, |o| c.offset.saturating_sub(o));
            cur.next_seq = c.seq + 1;
            cur.offset = Some(c.offset + c.data.len() as u64);
            cur.ended = c.end.is_some();
            let end = c.end.unwrap_or_default();
            let msg = pb::LogChunk {
                node_id: node.to_owned(),
                attempt,
                seq: c.seq,
                stream: c.stream as i32,
                data: c.data,
                dropped_bytes: dropped,
                end: cur.ended,
                outcome: end.outcome,
                error: end.error,
            };
            self.tx.send(Ok(msg)).await.map_err(|_| Gone)?;
        }
        Ok(())
    }

    async fn send_stored(&mut self, node: &str, attempt: u32) -> Result<(), Gone> {
        match hub::read_stored(&self.store, &self.q.project, &self.q.run_id, node, attempt).await {
            Ok(chunks) => self.send(node, attempt, chunks).await,
            Err(s) => {
                let path = cairn_node::RunDir::new(&self.q.run_id).node_log(node, attempt);
                let e = crate::error::Error::store(format!("reading {path}"))(s);
                let _ = self.tx.send(Err(e.into())).await;
                Err(Gone)
            }
        }
    }

    /// Sends what is new: the hub's attempts and, with `stored`, the attempts only the run
    /// directory has. The hub is read first: an attempt it forgets meanwhile is stored by then.
    pub async fn pass(&mut self, stored: bool) -> Result<(), Gone> {
        let (project, run_id) = (self.q.project.clone(), self.q.run_id.clone());
        let held = self
            .hub
            .snapshot(&project, &run_id, self.q.node.as_deref(), |n, a| {
                self.next_seq(n, a)
            });
        if stored {
            let list = match hub::list_stored(
                &self.store,
                &project,
                &run_id,
                self.q.node.as_deref(),
            )
            .await
            {
                Ok(l) => l,
                Err(s) => {
                    let e = crate::error::Error::store("listing the run's stored logs")(s);
                    let _ = self.tx.send(Err(e.into())).await;
                    return Err(Gone);
                }
            };
            for (n, a) in list {
                let in_hub = held.iter().any(|(hn, ha, _)| *hn == n && *ha == a);
                if !in_hub && !self.cursor(&n, a).ended {
                    self.send_stored(&n, a).await?;
                }
            }
        }
        for (n, a, h) in held {
            match h {
                Held::Live(chunks) => self.send(&n, a, chunks).await?,
                Held::Stored => {
                    if !self.cursor(&n, a).ended {
                        self.send_stored(&n, a).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Every attempt seen has ended.
    pub fn all_ended(&self) -> bool {
        self.cursors.values().all(|c| c.ended)
    }
}

/// A follower waits this long at most before it looks at the run's state again.
pub fn final_check() -> Duration {
    FINAL_CHECK
}
