//! Files too large to hold in memory, as they stream: a Put whose size and sha256 go after
//! its bytes (the store publishes nothing until they match), and a Get whose bytes are
//! handed on as they arrive but whose last chunk is held back until the whole file matched
//! its sha256 (a reader never gets all of a file that does not match).

use std::future::Future;
use std::io;

use bytes::Bytes;
use cairn_proto::v1::{
    get_response, put_request, GetResponse, PutDurability, PutEnd, PutHeader, PutRequest,
    PutResponse,
};
use cairn_sha256::Sha256;
use futures::{Stream, StreamExt};
use tonic::Status;

use crate::{PutOptions, Store};

/// What a file read must be.
#[derive(Clone, Debug)]
pub struct Expected {
    /// Lower-case hex sha256 of the whole file.
    pub sha256: String,
    pub size: u64,
}

impl Store {
    /// Writes `body` at `path` as it arrives; `end` then gives the size and sha256 of all of
    /// it (`digest_at_end`). The store publishes the file only when they match the bytes: a
    /// body cut short or an `end` of None publishes nothing. Never resent (a stream cannot be
    /// sent again): a Put that fails is the caller's to start over. `opts.with_run_events`
    /// is refused (its bytes could not be written again).
    pub async fn put_streamed(
        &self,
        project: &str,
        path: &str,
        opts: &PutOptions,
        body: impl Stream<Item = Bytes> + Send + 'static,
        end: impl Future<Output = Option<PutEnd>> + Send + 'static,
    ) -> Result<PutResponse, Status> {
        if opts.with_run_events {
            return Err(Status::invalid_argument(
                "a streamed Put is made durable before it replies: it cannot defer to its run's events",
            ));
        }
        let header = PutHeader {
            project_id: project.to_owned(),
            path: path.to_owned(),
            overwrite: opts.overwrite,
            expected_sha256: opts.expected_sha256.clone(),
            expected_size: None,
            allowed_prefixes: opts.allowed_prefixes.clone(),
            run_id: opts.run_id.clone(),
            create_project: true,
            durability: PutDurability::Sync as i32,
            fence: self.fence_for(project, path, &opts.run_id),
            if_sha256: opts.if_sha256.clone(),
            claim: String::new(),
            digest_at_end: true,
        };
        let first = PutRequest {
            msg: Some(put_request::Msg::Header(header)),
        };
        let chunks = body.map(|c| PutRequest {
            msg: Some(put_request::Msg::Chunk(c)),
        });
        let last = futures::stream::once(end).filter_map(|e| async move {
            e.map(|e| PutRequest {
                msg: Some(put_request::Msg::End(e)),
            })
        });
        let requests = futures::stream::iter([first]).chain(chunks).chain(last);
        self.client
            .clone()
            .put(requests)
            .await
            .map(|r| r.into_inner())
    }

    /// Reads `path` as [`checked`] hands it on (against `expect`, else the store's own
    /// sha256); None when there is no such file.
    pub async fn read_checked(
        &self,
        project: &str,
        path: &str,
        expect: Option<Expected>,
    ) -> Result<Option<impl Stream<Item = io::Result<Bytes>> + Send + 'static>, Status> {
        let opened = self.open_get(project, path).await?;
        Ok(opened.map(|stream| checked(stream, expect, path.to_owned())))
    }
}

/// The bytes of a Get's answer as they arrive, hashed on the way. A file the store says is
/// not `expect` is refused before any byte; otherwise the last chunk is held back until the
/// whole file matched `expect` (None: the size and sha256 the store sent first), so bytes
/// damaged behind the store's back, or a read that fails, end with an error naming `shown`
/// instead of that chunk.
pub fn checked<S>(
    stream: S,
    expect: Option<Expected>,
    shown: String,
) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static
where
    S: Stream<Item = Result<GetResponse, Status>> + Send + Unpin + 'static,
{
    struct Reading<S> {
        stream: S,
        expect: Option<Expected>,
        shown: String,
        hash: Sha256,
        seen: u64,
        held: Option<Bytes>,
    }
    let start = Reading {
        stream,
        expect,
        shown,
        hash: Sha256::new(),
        seen: 0,
        held: None,
    };
    futures::stream::unfold(Some(start), |state| async move {
        let mut r = state?;
        let fail = |r: &Reading<S>, what: String| {
            Some((
                Err(io::Error::other(format!("reading {}: {what}", r.shown))),
                None,
            ))
        };
        loop {
            let msg = match r.stream.next().await {
                Some(Ok(m)) => m,
                None => break,
                Some(Err(s)) => return fail(&r, s.message().to_owned()),
            };
            match msg.msg {
                Some(get_response::Msg::Info(info)) => match &r.expect {
                    Some(e)
                        if e.size != info.size_bytes
                            || (!info.sha256.is_empty() && info.sha256 != e.sha256) =>
                    {
                        let what = format!(
                            "the store holds {} bytes with sha256 {}, not the {} bytes with sha256 {} that were written",
                            info.size_bytes, info.sha256, e.size, e.sha256
                        );
                        return fail(&r, what);
                    }
                    Some(_) => {}
                    None => {
                        r.expect = Some(Expected {
                            sha256: info.sha256,
                            size: info.size_bytes,
                        })
                    }
                },
                Some(get_response::Msg::Chunk(c)) => {
                    r.hash.update(&c);
                    r.seen += c.len() as u64;
                    if let Some(prev) = r.held.replace(c) {
                        return Some((Ok(prev), Some(r)));
                    }
                }
                None => {}
            }
        }
        let Some(e) = r.expect.take() else {
            return fail(&r, "the store sent no file header".into());
        };
        let got = std::mem::take(&mut r.hash).finish_hex();
        if r.seen != e.size || (!e.sha256.is_empty() && got != e.sha256) {
            let what = format!(
                "it read back as {} bytes with sha256 {got}, not {} bytes with sha256 {}",
                r.seen, e.size, e.sha256
            );
            return fail(&r, what);
        }
        r.held.take().map(|last| (Ok(last), None))
    })
}
