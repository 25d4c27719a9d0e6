//! ReadEvents' streams: stored events from the log file (sought through its seek index), then
//! live ones from the run's broadcast. A child of `events`, whose run logs it reads.
//!
//! May depend on: what `events` may.

use super::*;

/// One ReadEvents stream.
pub(super) struct Reader {
    pub(super) store: Arc<State>,
    pub(super) log: Arc<RunLog>,
    pub(super) project: String,
    pub(super) run: String,
    /// Next seq to send.
    pub(super) next: u64,
    pub(super) remaining: u64,
    pub(super) follow: bool,
    pub(super) tx: mpsc::Sender<Result<StoredEvent>>,
}

impl Reader {
    pub(super) async fn run(mut self) {
        loop {
            // Subscribe under the run's mutex: every event after `upto` reaches `live`.
            let (mut live, upto) = {
                let state = self.log.state.lock().await;
                (self.log.live.subscribe(), state.last_seq)
            };
            if self.next <= upto && !self.send_stored(upto).await {
                return;
            }
            if !self.follow || self.remaining == 0 {
                return;
            }
            // Live phase; any gap (lagging behind the broadcast) goes back to the file.
            loop {
                let received = tokio::select! {
                    _ = self.tx.closed() => return,
                    r = live.recv() => r,
                };
                match received {
                    Ok(event) if event.seq < self.next => {}
                    Ok(event) if event.seq == self.next => {
                        if self.tx.send(Ok((*event).clone())).await.is_err() {
                            return;
                        }
                        self.next += 1;
                        self.remaining -= 1;
                        if self.remaining == 0 {
                            return;
                        }
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    }

    /// Sends stored events `next..=upto` from the file; false when the stream should end.
    async fn send_stored(&mut self, upto: u64) -> bool {
        let (store, project, run, tx) = (
            self.store.clone(),
            self.project.clone(),
            self.run.clone(),
            self.tx.clone(),
        );
        let (from, remaining) = (self.next, self.remaining);
        let read =
            blocking(move || read_file(&store, &project, &run, from, upto, remaining, &tx)).await;
        match read {
            Ok(sent) => {
                self.next += sent;
                self.remaining -= sent;
                self.remaining > 0 && !self.tx.is_closed()
            }
            Err(e) => {
                let _ = self.tx.send(Err(e)).await;
                false
            }
        }
    }
}

/// Where in the log a read from `from` may start (0 without a usable seek index).
fn seek_offset(root: BorrowedFd<'_>, run: &str, log: &File, from: u64) -> u64 {
    let path = format!(".cairn/runs/{run}/{EVENTS_INDEX_FILE}");
    let Ok(fd) = contain::open(root, &path, OFlags::RDONLY | OFlags::NONBLOCK, 0) else {
        return 0;
    };
    let index = File::from(fd);
    let (Ok(marks), Ok(meta)) = (event_seek::read_marks(&index), log.metadata()) else {
        return 0;
    };
    event_seek::start(log, meta.len(), &marks, from).0
}

/// Reads lines with `from <= seq <= upto` (at most `max`) and sends them; returns how many.
fn read_file(
    store: &State,
    project: &str,
    run: &str,
    from: u64,
    upto: u64,
    max: u64,
    tx: &mpsc::Sender<Result<StoredEvent>>,
) -> Result<u64> {
    let root = store.layout.project_root(project)?;
    let path = log_path(run);
    let fd = contain::open(root.as_fd(), &path, OFlags::RDONLY | OFlags::NONBLOCK, 0)
        .map_err(|e| refusal(e, project, &path, "reading"))?;
    let file = File::from(fd);
    let offset = if from > event_seek::STRIDE {
        seek_offset(root.as_fd(), run, &file, from)
    } else {
        0
    };
    let mut file = file;
    if offset > 0 {
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(offset))
            .map_err(|e| Error::io(format!("reading {path:?}"), e))?;
    }
    let mut reader = BufReader::with_capacity(256 << 10, file);
    let mut line = String::new();
    let mut sent = 0;
    let mut expected = from;
    while sent < max && expected <= upto {
        line.clear();
        if reader
            .read_line(&mut line)
            .map_err(|e| Error::io(format!("reading {path:?}"), e))?
            == 0
        {
            break;
        }
        let text = line.trim_end_matches('\n');
        let event = StoredEvent::parse(text).ok_or_else(|| {
            Error::io(
                format!("reading {path:?}"),
                std::io::Error::other("a line is not a JSON event with a seq"),
            )
        })?;
        if event.seq < expected {
            continue;
        }
        if event.seq > expected {
            return Err(Error::io(
                format!("reading {path:?}"),
                std::io::Error::other(format!(
                    "seq {} follows {}; the log has a gap",
                    event.seq,
                    expected - 1
                )),
            ));
        }
        if tx.blocking_send(Ok(event)).is_err() {
            break;
        }
        expected += 1;
        sent += 1;
    }
    Ok(sent)
}
