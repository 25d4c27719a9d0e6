//! The recorder: one per live run, the ordered writer of the run's events. Events are queued
//! in order and appended in batches (group commit: whatever queued while the previous
//! AppendEvents was in flight goes in the next one), each batch durable before the store
//! replies. `flush` waits until everything queued so far is durable: the scheduler calls it
//! before starting a node with effects, so a node's completion is recorded before anything
//! that depends on it runs (issue item 4).
//!
//! A failed append is retried; before a retry the recorder reads the log's tail to see whether
//! the batch landed after all (reply lost), so a retry never duplicates events. Every batch
//! carries the run's writer epoch (ClaimRun): once another orchestrator has claimed the run,
//! the store refuses it (`fenced`, not retried) and the run stops here. A batch refused as
//! `publication_unproven` (the store restarted before files the run's events name were
//! durable) is retried after the store client wrote those files again.

use std::collections::VecDeque;
use std::time::Duration;

use cairn_proto::v1::{Event, EventInput};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::Code;

use cairn_node::events::Ev;
use cairn_store_client::Store;

/// Most events in one AppendEvents.
const MAX_BATCH_EVENTS: usize = 4096;
/// Most bytes of event data in one AppendEvents.
const MAX_BATCH_BYTES: usize = 4 << 20;

/// Durability progress: how many of our events are durable, or why recording stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Durable {
    pub count: u64,
    pub failed: Option<String>,
}

/// An event, who waits for its sequence number, and whether the next event belongs to the
/// same group (appended in the same batch: never split by a crash).
struct Msg(EventInput, Option<oneshot::Sender<u64>>, bool);

/// Handle to a run's recorder (cheap to clone).
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::UnboundedSender<Msg>,
    queued: std::sync::Arc<std::sync::Mutex<u64>>,
    durable: watch::Receiver<Durable>,
    seqs: std::sync::Arc<std::sync::Mutex<SeqMap>>,
    /// Asks the task to append now instead of lingering for more events.
    kick: std::sync::Arc<tokio::sync::Notify>,
    epoch: u64,
}

/// Which store sequence numbers our recent batches got (to name the seq a snapshot reflects).
#[derive(Default)]
struct SeqMap {
    // (count after the batch, seq of its last event)
    batches: VecDeque<(u64, u64)>,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("the run's events cannot be recorded: {0}")]
pub struct RecordError(pub String);

impl Recorder {
    /// Starts the recorder task for one run; `last_seq` is the log's current end. Events
    /// nobody waits for may linger up to `linger` to be appended with later ones (fewer
    /// fsyncs); `flush`/`record` append at once.
    pub fn start(
        store: Store,
        project: String,
        run_id: String,
        last_seq: u64,
        epoch: u64,
        linger: Duration,
    ) -> Recorder {
        let (tx, rx) = mpsc::unbounded_channel();
        let (dtx, drx) = watch::channel(Durable {
            count: 0,
            failed: None,
        });
        let seqs = std::sync::Arc::new(std::sync::Mutex::new(SeqMap::default()));
        let kick = std::sync::Arc::new(tokio::sync::Notify::new());
        let task = Task {
            store,
            project,
            run_id,
            last_seq,
            epoch,
            durable: dtx,
            seqs: seqs.clone(),
            kick: kick.clone(),
            linger,
        };
        // In the run's span: the event appends belong to the run's trace.
        tokio::spawn(tracing::Instrument::in_current_span(task.run(rx)));
        Recorder {
            tx,
            queued: Default::default(),
            durable: drx,
            seqs,
            kick,
            epoch,
        }
    }

    /// Queues an event; returns its position (1-based) among this recorder's events.
    pub fn push(&self, e: &Ev) -> u64 {
        self.push_input(e.to_input(), None)
    }

    /// Queues events that are appended in one batch, all or none (a node's effects with its
    /// completion); returns the position of the last.
    pub fn push_group(&self, es: &[Ev]) -> u64 {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        for (i, e) in es.iter().enumerate() {
            *queued += 1;
            let _ = self.tx.send(Msg(e.to_input(), None, i + 1 < es.len()));
        }
        *queued
    }

    fn push_input(&self, input: EventInput, reply: Option<oneshot::Sender<u64>>) -> u64 {
        // Positions and channel order agree: both are taken under the same lock.
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        *queued += 1;
        let _ = self.tx.send(Msg(input, reply, false));
        *queued
    }

    /// Queues an event and waits until it is durable; returns its store sequence number.
    pub async fn record(&self, e: &Ev) -> Result<u64, RecordError> {
        let (tx, rx) = oneshot::channel();
        self.push_input(e.to_input(), Some(tx));
        self.kick.notify_one();
        match rx.await {
            Ok(seq) => Ok(seq),
            Err(_) => Err(RecordError(
                self.durable
                    .borrow()
                    .failed
                    .clone()
                    .unwrap_or_else(|| "recorder stopped".into()),
            )),
        }
    }

    /// The claim (ClaimRun epoch) this recorder appends under.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Number of events queued so far.
    pub fn queued(&self) -> u64 {
        *self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until the first `upto` events are durable.
    pub async fn flush_to(&self, upto: u64) -> Result<(), RecordError> {
        let mut rx = self.durable.clone();
        if rx.borrow().count < upto {
            self.kick.notify_one();
        }
        loop {
            {
                let d = rx.borrow_and_update();
                if d.count >= upto {
                    return Ok(());
                }
                if let Some(f) = &d.failed {
                    return Err(RecordError(f.clone()));
                }
            }
            if rx.changed().await.is_err() {
                let d = rx.borrow();
                return if d.count >= upto {
                    Ok(())
                } else {
                    Err(RecordError("recorder stopped".into()))
                };
            }
        }
    }

    /// Waits until everything queued so far is durable.
    pub async fn flush(&self) -> Result<(), RecordError> {
        self.flush_to(self.queued()).await
    }

    /// True when everything queued is durable.
    pub fn is_flushed(&self) -> bool {
        self.durable.borrow().count >= self.queued()
    }

    /// The store sequence number of our `pos`-th event, once durable (for snapshots).
    pub fn seq_of(&self, pos: u64) -> Option<u64> {
        let seqs = self.seqs.lock().ok()?;
        // Batches are contiguous in our numbering; the one containing `pos` ends at or after it.
        let mut prev_end = 0;
        for &(end, last_seq) in &seqs.batches {
            if pos <= end && pos > prev_end {
                return Some(last_seq - (end - pos));
            }
            prev_end = end;
        }
        None
    }
}

/// How many of `buf`'s events go in the next batch: what fits the limits, never splitting a
/// group (a group longer than the limits goes whole).
fn batch_len(buf: &[Msg]) -> usize {
    let mut bytes = 0;
    let mut take = 0;
    let mut in_group = false;
    for Msg(e, _, more) in buf {
        bytes += e.data_json.len() + e.r#type.len() + e.node_id.len() + 16;
        if take > 0 && !in_group && (bytes > MAX_BATCH_BYTES || take >= MAX_BATCH_EVENTS) {
            break;
        }
        take += 1;
        in_group = *more;
    }
    take
}

struct Task {
    store: Store,
    project: String,
    run_id: String,
    last_seq: u64,
    /// Our claim on the run (ClaimRun); a newer claim fences our appends off.
    epoch: u64,
    durable: watch::Sender<Durable>,
    seqs: std::sync::Arc<std::sync::Mutex<SeqMap>>,
    kick: std::sync::Arc<tokio::sync::Notify>,
    linger: Duration,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        let mut buf: Vec<Msg> = Vec::new();
        let mut count: u64 = 0;
        loop {
            if buf.is_empty() && rx.recv_many(&mut buf, MAX_BATCH_EVENTS).await == 0 {
                return; // every handle dropped and nothing pending
            }
            // Group commit: gather what comes within `linger` unless someone waits.
            if !self.linger.is_zero() {
                let deadline = tokio::time::Instant::now() + self.linger;
                while buf.len() < MAX_BATCH_EVENTS {
                    let room = MAX_BATCH_EVENTS - buf.len();
                    tokio::select! {
                        biased;
                        _ = self.kick.notified() => break,
                        n = rx.recv_many(&mut buf, room) => if n == 0 { break },
                        _ = tokio::time::sleep_until(deadline) => break,
                    }
                }
            }
            // A group still arriving is waited for (its sender queues it all at once).
            while buf.last().is_some_and(|m| m.2) {
                if rx.recv_many(&mut buf, MAX_BATCH_EVENTS).await == 0 {
                    break;
                }
            }
            let take = batch_len(&buf);
            let batch: Vec<Msg> = buf.drain(..take).collect();
            let inputs: Vec<EventInput> = batch.iter().map(|m| m.0.clone()).collect();
            match self.append(inputs).await {
                Ok(first_seq) => {
                    let n = batch.len() as u64;
                    count += n;
                    self.last_seq = first_seq + n - 1;
                    if let Ok(mut s) = self.seqs.lock() {
                        s.batches.push_back((count, self.last_seq));
                        while s.batches.len() > 64 {
                            s.batches.pop_front();
                        }
                    }
                    for (i, Msg(_, reply, _)) in batch.into_iter().enumerate() {
                        if let Some(r) = reply {
                            let _ = r.send(first_seq + i as u64);
                        }
                    }
                    self.durable.send_replace(Durable {
                        count,
                        failed: None,
                    });
                }
                Err(message) => {
                    tracing::error!(run_id = %self.run_id, %message, "recording events failed");
                    self.durable.send_replace(Durable {
                        count,
                        failed: Some(message),
                    });
                    return;
                }
            }
            if buf.is_empty() {
                // Pick up whatever queued meanwhile without waiting.
                while let Ok(m) = rx.try_recv() {
                    buf.push(m);
                    if buf.len() >= MAX_BATCH_EVENTS {
                        break;
                    }
                }
            }
        }
    }

    /// Appends one batch; returns the first sequence number. Transient failures are retried
    /// (up to about two minutes), checking first whether the batch landed.
    async fn append(&mut self, inputs: Vec<EventInput>) -> Result<u64, String> {
        let mut delay = Duration::from_millis(50);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            match self
                .store
                .append_events_fenced(&self.project, &self.run_id, inputs.clone(), self.epoch)
                .await
            {
                Ok(r) => return Ok(r.first_seq),
                Err(s) => {
                    // An unproven publication (the store restarted) was written again by the
                    // store client: the batch may go again, once the tail shows it did not land.
                    let transient = matches!(
                        s.code(),
                        Code::Unavailable
                            | Code::DeadlineExceeded
                            | Code::Unknown
                            | Code::Cancelled
                            | Code::Aborted
                            | Code::Internal
                    ) || cairn_store_client::is_publication_unproven(&s);
                    if !transient || tokio::time::Instant::now() > deadline {
                        return Err(format!(
                            "AppendEvents failed: {} ({:?})",
                            s.message(),
                            s.code()
                        ));
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                    if let Some(first) = self.landed(&inputs).await {
                        return Ok(first);
                    }
                }
            }
        }
    }

    /// Whether `inputs` were appended after `last_seq` although the reply was lost.
    async fn landed(&self, inputs: &[EventInput]) -> Option<u64> {
        let tail = self
            .store
            .read_events(&self.project, &self.run_id, self.last_seq + 1)
            .await
            .ok()?;
        let first = inputs.first()?;
        let start = tail.iter().position(|e| same(e, first))?;
        let run: Vec<&Event> = tail[start..].iter().take(inputs.len()).collect();
        (run.len() == inputs.len() && run.iter().zip(inputs).all(|(e, i)| same(e, i)))
            .then(|| tail[start].seq)
    }
}

fn same(stored: &Event, input: &EventInput) -> bool {
    let a: Value = serde_json::from_str(&stored.data_json).unwrap_or(Value::Null);
    let b: Value = serde_json::from_str(&input.data_json).unwrap_or(Value::Null);
    stored.r#type == input.r#type
        && stored.node_id == input.node_id
        && (a == b || (a.is_null() && b == Value::Object(Default::default())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(groups: &[usize]) -> Vec<Msg> {
        let mut out = Vec::new();
        for &n in groups {
            for i in 0..n {
                let input = EventInput {
                    r#type: "node.completed".into(),
                    ..Default::default()
                };
                out.push(Msg(input, None, i + 1 < n));
            }
        }
        out
    }

    #[test]
    fn a_batch_ends_at_the_limit_but_never_inside_a_group() {
        // Single events: the limit cuts.
        assert_eq!(batch_len(&msgs(&[1; 5000])), MAX_BATCH_EVENTS);
        // A group straddling the limit goes whole into the batch.
        let mut groups = vec![1; MAX_BATCH_EVENTS - 2];
        groups.push(5);
        groups.push(1);
        assert_eq!(batch_len(&msgs(&groups)), MAX_BATCH_EVENTS + 3);
        // A group alone, longer than the limit, is not split either.
        assert_eq!(
            batch_len(&msgs(&[MAX_BATCH_EVENTS + 10, 1])),
            MAX_BATCH_EVENTS + 10
        );
        assert_eq!(batch_len(&[]), 0);
    }
}
