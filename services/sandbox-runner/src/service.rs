//! The gRPC face of the runner (sandbox.proto): decode, call the runner, encode. Streaming
//! calls run in a task that is aborted when the client goes away, so its sandbox is removed.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use cairn_proto as pb;
use cairn_proto::reason;
use cairn_proto::sandbox_runner_server::SandboxRunner;
use cairn_sha256::Sha256;
use futures::{Stream, StreamExt};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};

use crate::error::Error;
use crate::runner::Runner;

/// Size of the chunks Pack and PauseSession stream.
const PACK_CHUNK: usize = 256 * 1024;

#[derive(Clone)]
pub struct SandboxService {
    runner: Arc<Runner>,
}

impl SandboxService {
    pub fn new(runner: Arc<Runner>) -> Self {
        SandboxService { runner }
    }
}

type Responses<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl SandboxRunner for SandboxService {
    async fn run(
        &self,
        request: Request<pb::RunRequest>,
    ) -> Result<Response<pb::RunResult>, Status> {
        let req = request.into_inner();
        cairn_telemetry::record_ids("", &req.run_id, &req.node_id);
        Ok(Response::new(self.runner.run(req, None).await?))
    }

    type RunStreamStream = Responses<pb::RunStreamResponse>;

    async fn run_stream(
        &self,
        request: Request<pb::RunRequest>,
    ) -> Result<Response<Self::RunStreamStream>, Status> {
        let (tx, rx) = mpsc::channel(64);
        let runner = self.runner.clone();
        let heartbeat = runner.heartbeat_interval();
        let req = request.into_inner();
        cairn_telemetry::record_ids("", &req.run_id, &req.node_id);
        // In the call's span: the run's logs carry its trace id.
        let task = tokio::spawn(tracing::Instrument::in_current_span(async move {
            let (live_tx, mut live_rx) = mpsc::channel::<pb::OutputChunk>(64);
            let forward = {
                let tx = tx.clone();
                async move {
                    let started = std::time::Instant::now();
                    // Without heartbeats the ticker never fires.
                    let period = heartbeat.unwrap_or(std::time::Duration::from_secs(86_400));
                    let mut ticks = tokio::time::interval(period);
                    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        let msg = tokio::select! {
                            chunk = live_rx.recv() => match chunk {
                                Some(chunk) => pb::run_stream_response::Msg::Output(chunk),
                                None => break,
                            },
                            _ = ticks.tick(), if heartbeat.is_some() => {
                                pb::run_stream_response::Msg::Heartbeat(pb::Heartbeat {
                                    interval_ms: period.as_millis() as u64,
                                    elapsed_ms: started.elapsed().as_millis() as u64,
                                })
                            }
                        };
                        let msg = pb::RunStreamResponse { msg: Some(msg) };
                        if tx.send(Ok(msg)).await.is_err() {
                            break;
                        }
                    }
                }
            };
            let run = async move {
                let result = runner.run(req, Some(&live_tx)).await;
                drop(live_tx);
                result
            };
            let (result, ()) = tokio::join!(run, forward);
            let msg = result
                .map(|r| pb::RunStreamResponse {
                    msg: Some(pb::run_stream_response::Msg::Result(r)),
                })
                .map_err(Status::from);
            let _ = tx.send(msg).await;
        }));
        Ok(Response::new(Box::pin(AbortOnDrop {
            inner: ReceiverStream::new(rx),
            task,
        })))
    }

    async fn open_session(
        &self,
        request: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        Ok(Response::new(
            self.runner.open_session(request.into_inner()).await?,
        ))
    }

    async fn exec(
        &self,
        request: Request<pb::ExecRequest>,
    ) -> Result<Response<pb::ExecResult>, Status> {
        Ok(Response::new(self.runner.exec(request.into_inner()).await?))
    }

    async fn read_file(
        &self,
        request: Request<pb::ReadFileRequest>,
    ) -> Result<Response<pb::ReadFileResponse>, Status> {
        Ok(Response::new(
            self.runner.read_file(request.into_inner()).await?,
        ))
    }

    async fn write_file(
        &self,
        request: Request<pb::WriteFileRequest>,
    ) -> Result<Response<pb::WriteFileResponse>, Status> {
        let request = request.into_inner();
        reason::known::<pb::WriteMode>("mode", request.mode)?;
        Ok(Response::new(self.runner.write_file(request).await?))
    }

    async fn glob(
        &self,
        request: Request<pb::GlobRequest>,
    ) -> Result<Response<pb::GlobResponse>, Status> {
        Ok(Response::new(self.runner.glob(request.into_inner()).await?))
    }

    async fn grep(
        &self,
        request: Request<pb::GrepRequest>,
    ) -> Result<Response<pb::GrepResponse>, Status> {
        Ok(Response::new(self.runner.grep(request.into_inner()).await?))
    }

    type PackStream = Responses<pb::PackResponse>;

    async fn pack(
        &self,
        request: Request<pb::PackRequest>,
    ) -> Result<Response<Self::PackStream>, Status> {
        let request = request.into_inner();
        reason::known::<pb::ArchiveFormat>("format", request.format)?;
        let packed = self.runner.pack(request).await?;
        let (tx, rx) = mpsc::channel(4);
        let task = tokio::spawn(async move {
            let chunk = |c: bytes::Bytes| pb::PackResponse {
                msg: Some(pb::pack_response::Msg::Chunk(c)),
            };
            let Some((sha256, size_bytes)) = send_file(&packed.path, "archive", &tx, chunk).await
            else {
                return;
            };
            let summary = pb::PackSummary {
                archive_name: packed.name.clone(),
                digest: Some(pb::Digest { sha256, size_bytes }),
                entries: packed.report.entries,
                excluded: packed.report.excluded,
                refused: packed
                    .report
                    .refused
                    .iter()
                    .map(|r| pb::RejectedOutput {
                        path: r.path.clone(),
                        reason: r.reason.clone(),
                    })
                    .collect(),
            };
            let _ = tx
                .send(Ok(pb::PackResponse {
                    msg: Some(pb::pack_response::Msg::Summary(summary)),
                }))
                .await;
            drop(packed);
        });
        Ok(Response::new(Box::pin(AbortOnDrop {
            inner: ReceiverStream::new(rx),
            task,
        })))
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let closed = self
            .runner
            .close_session(&request.into_inner().session_id)
            .await?;
        Ok(Response::new(pb::CloseSessionResponse { closed }))
    }

    async fn touch_session(
        &self,
        request: Request<pb::TouchSessionRequest>,
    ) -> Result<Response<pb::TouchSessionResponse>, Status> {
        let idle_timeout_ms = self
            .runner
            .touch_session(&request.into_inner().session_id)?;
        Ok(Response::new(pb::TouchSessionResponse { idle_timeout_ms }))
    }

    type PauseSessionStream = Responses<pb::SnapshotPart>;

    async fn pause_session(
        &self,
        request: Request<pb::PauseSessionRequest>,
    ) -> Result<Response<Self::PauseSessionStream>, Status> {
        use pb::snapshot_part::Msg;
        let req = request.into_inner();
        let (header_tx, header_rx) = tokio::sync::oneshot::channel();
        let (chunks_tx, mut chunks) = mpsc::channel::<bytes::Bytes>(8);
        let (tx, rx) = mpsc::channel(8);
        let runner = self.runner.clone();
        // Runs to its end whatever the client does (a checkpoint is never left half handled);
        // a client that leaves stops the bytes, and the pause ends with an error.
        let task = tokio::spawn(async move {
            let (end_tx, end_rx) = tokio::sync::oneshot::channel();
            let pausing = runner.pause_session(
                &req.session_id,
                req.files_only,
                req.keep_open,
                header_tx,
                chunks_tx,
                end_tx,
            );
            let tx2 = tx.clone();
            // The chunks, then the end as soon as the snapshot is whole (the runner may still
            // be clearing up): true when the end was delivered.
            let forwarding = async move {
                while let Some(c) = chunks.recv().await {
                    if tx2.send(Ok(part(Msg::Chunk(c)))).await.is_err() {
                        return false; // the client left: dropping `chunks` stops the writing
                    }
                }
                match end_rx.await {
                    Ok(end) => tx2.send(Ok(part(Msg::End(end)))).await.is_ok(),
                    Err(_) => false,
                }
            };
            let (paused, delivered) = tokio::join!(pausing, forwarding);
            let sent = match paused {
                Ok(sent) => sent,
                Err(e) if delivered => {
                    tracing::warn!(session_id = %req.session_id, error = %e, "clearing up after a delivered snapshot failed");
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Err(Status::from(e))).await;
                    return;
                }
            };
            // Delivered: a files-only session ends here (one with memory ended at its
            // checkpoint), unless it was a checkpoint of a session that goes on.
            if delivered && !sent.memory && !req.keep_open {
                if let Err(e) = runner.close_session(&req.session_id).await {
                    tracing::warn!(session_id = %req.session_id, error = %e, "closing a paused session failed");
                }
            }
        });
        let header = match header_rx.await {
            Ok(h) => h,
            // The pause ended before its checkpoint was taken: its error is the answer.
            Err(_) => {
                let mut rx = rx;
                let _ = task.await;
                return Err(match rx.recv().await {
                    Some(Err(status)) => status,
                    _ => Status::internal("the pause ended before its snapshot began"),
                });
            }
        };
        let first = futures::stream::iter([Ok(part(Msg::Header(header)))]);
        let stream = futures::StreamExt::chain(first, ReceiverStream::new(rx));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn resume_session(
        &self,
        request: Request<tonic::Streaming<pb::SnapshotPart>>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        let mut parts = request.into_inner();
        let first = parts.message().await?.ok_or_else(|| {
            Status::from(Error::invalid(
                "ResumeSession got no message: send the SnapshotHeader first, then the bytes",
            ))
        })?;
        let Some(pb::snapshot_part::Msg::Header(header)) = first.msg else {
            return Err(
                Error::invalid("ResumeSession's first message must be the SnapshotHeader").into(),
            );
        };
        let t0 = std::time::Instant::now();
        let mut received = self.runner.begin_resume(header)?;
        let mut end = None;
        while let Some(part) = parts.message().await? {
            if end.is_some() && part.msg.is_some() {
                return Err(Error::invalid(
                    "ResumeSession got a message after the SnapshotEnd: the end comes last",
                )
                .into());
            }
            match part.msg {
                Some(pb::snapshot_part::Msg::Chunk(c)) => received.push(&c)?,
                Some(pb::snapshot_part::Msg::End(e)) => end = Some(e),
                Some(pb::snapshot_part::Msg::Header(_)) => {
                    return Err(Error::invalid(
                        "ResumeSession got a second SnapshotHeader: send one header, then bytes",
                    )
                    .into())
                }
                None => {}
            }
        }
        let received_ms = t0.elapsed().as_millis() as u64;
        let info = self
            .runner
            .resume_session(received, end, first.session_id, first.copies)
            .await?;
        tracing::info!(
            session_id = %info.session_id,
            copies = 1 + info.copies.len(),
            received_ms,
            total_ms = t0.elapsed().as_millis() as u64,
            "snapshot resumed"
        );
        Ok(Response::new(info))
    }

    async fn get_runner_info(
        &self,
        _request: Request<pb::GetRunnerInfoRequest>,
    ) -> Result<Response<pb::RunnerInfo>, Status> {
        Ok(Response::new(self.runner.info()))
    }
}

/// One message of a snapshot's stream.
fn part(msg: pb::snapshot_part::Msg) -> pb::SnapshotPart {
    pb::SnapshotPart {
        msg: Some(msg),
        ..Default::default()
    }
}

/// Streams the file at `path` in chunks made by `wrap`; returns its sha256 (hex) and size,
/// or None when it could not be read (the error was sent) or the client left.
async fn send_file<T>(
    path: &std::path::Path,
    what: &str,
    tx: &mpsc::Sender<Result<T, Status>>,
    wrap: impl Fn(bytes::Bytes) -> T,
) -> Option<(String, u64)> {
    let send_err = |e: std::io::Error| {
        reason::status(
            Code::Internal,
            format!("reading the {what}: {e}"),
            "io_error",
        )
    };
    let mut file = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) => {
            let _ = tx.send(Err(send_err(e))).await;
            return None;
        }
    };
    let (mut size, mut hasher) = (0u64, Sha256::new());
    loop {
        let mut buf = vec![0u8; PACK_CHUNK];
        let n = match file.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                let _ = tx.send(Err(send_err(e))).await;
                return None;
            }
        };
        buf.truncate(n);
        hasher.update(&buf);
        size += n as u64;
        if tx.send(Ok(wrap(buf.into()))).await.is_err() {
            return None;
        }
    }
    Some((hasher.finish_hex(), size))
}

/// A response stream that aborts its producing task when the client drops it.
struct AbortOnDrop<S> {
    inner: S,
    task: tokio::task::JoinHandle<()>,
}

impl<S: Stream + Unpin> Stream for AbortOnDrop<S> {
    type Item = S::Item;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

impl<S> Drop for AbortOnDrop<S> {
    fn drop(&mut self) {
        self.task.abort();
    }
}
