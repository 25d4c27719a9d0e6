//! The artifact-store as ingest sees it: a gRPC client with a deadline on every call and the
//! store's answers sorted into what ingest does with them (fail-open). Ingest never
//! touches a filesystem; every byte it writes goes through here.

use std::time::Duration;

use bytes::Bytes;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::{
    get_response, put_request, AppendEventsRequest, CreateProjectRequest, EntryKind, EventInput,
    GetRequest, ListRequest, PageRequest, PutHeader, PutRequest, PutResponse, StatRequest,
};
use cairn_server::retry::{Dependency, Safety};
use cairn_telemetry::TracedChannel;
use futures::StreamExt;
use tonic::Code;

use crate::block::reason;

/// Bytes per Put chunk (the store recommends 64 KiB - 1 MiB).
/// The dependency's name in logs and readiness.
pub const STORE: &str = "artifact-store";

const CHUNK_BYTES: usize = 256 << 10;

/// Largest message ingest accepts from the store (Get chunks are at most 1 MiB).
const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Why a store call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store refused with a reason word (`cairn-reason`): `exists`, `symlink_in_path`, ...
    #[error("{message}")]
    Refused {
        reason: String,
        code: Code,
        message: String,
    },
    /// Nothing at the path (or no such project).
    #[error("{0}")]
    NotFound(String),
    /// The store is down, unreachable, shutting down or did not answer in time.
    #[error("{0}")]
    Unavailable(String),
    /// Any other failure of the call (counted as `io_error`).
    #[error("{message}")]
    Failed { code: Code, message: String },
}

impl StoreError {
    /// The manifest reason word for a block this error kept from being written.
    pub fn reason(&self) -> &str {
        match self {
            StoreError::Refused { reason, .. } => reason,
            StoreError::Unavailable(_) => reason::STORE_UNAVAILABLE,
            StoreError::NotFound(_) | StoreError::Failed { .. } => reason::IO_ERROR,
        }
    }

    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }

    /// The store refused a fenced write: a newer claim on the run holds it.
    pub fn is_fenced(&self) -> bool {
        matches!(self, StoreError::Refused { reason, .. } if reason == reason::FENCED)
    }

    /// The store refused the ingest claim itself (expired, forged, another run's): every
    /// further write would be refused too.
    pub fn is_claim_refused(&self) -> bool {
        matches!(self, StoreError::Refused { reason, .. } if reason.starts_with("claim_"))
    }

    /// The store refused the caller's identity itself (`identity`): a caller that sent no
    /// claim where the store requires one.
    pub fn is_identity(&self) -> bool {
        matches!(self, StoreError::Refused { reason, .. } if reason == "identity")
    }

    /// The gRPC code the store answered with (Unavailable for a dead or silent store).
    pub fn code(&self) -> Code {
        match self {
            StoreError::Refused { code, .. } | StoreError::Failed { code, .. } => *code,
            StoreError::NotFound(_) => Code::NotFound,
            StoreError::Unavailable(_) => Code::Unavailable,
        }
    }

    fn from_status(status: tonic::Status) -> StoreError {
        let message = status.message().to_owned();
        match (cairn_proto::reason::of(&status), status.code()) {
            (Some(word), _) if word == reason::STORE_UNAVAILABLE => {
                StoreError::Unavailable(message)
            }
            (_, Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled) => {
                StoreError::Unavailable(format!("{:?}: {message}", status.code()))
            }
            // Nothing there (a file, or a project not made yet), whatever its reason word.
            (_, Code::NotFound) => StoreError::NotFound(message),
            (Some(word), code) => StoreError::Refused {
                reason: word,
                code,
                message,
            },
            // Without a reason word, the code still says what kind of refusal it was.
            (None, Code::AlreadyExists) => StoreError::Refused {
                reason: "exists".into(),
                code: Code::AlreadyExists,
                message,
            },
            (None, Code::FailedPrecondition) => StoreError::Refused {
                reason: "not_a_file".into(),
                code: Code::FailedPrecondition,
                message,
            },
            (None, code) => StoreError::Failed { code, message },
        }
    }
}

/// A client of the artifact-store with a per-call deadline.
#[derive(Clone)]
pub struct StoreClient {
    client: ArtifactStoreClient<TracedChannel>,
    timeout: Duration,
    /// The store as a dependency: outages are ridden out for its budget.
    store: Dependency,
}

impl StoreClient {
    /// A client over a (lazily connecting) channel; calls are not resent (see
    /// [`StoreClient::riding_out`]).
    pub fn new(channel: tonic::transport::Channel, timeout: Duration) -> StoreClient {
        let client = ArtifactStoreClient::new(cairn_telemetry::traced(channel))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        StoreClient {
            client,
            timeout,
            store: Dependency::new(STORE, Duration::ZERO),
        }
    }

    /// Calls that find the store away are resent while `store`'s outage budget lasts.
    pub fn riding_out(mut self, store: Dependency) -> StoreClient {
        self.store = store;
        self
    }

    /// The store as a dependency (readiness follows it).
    pub fn dependency(&self) -> &Dependency {
        &self.store
    }

    /// Runs `call` (each attempt within the deadline; a store that does not answer in time is
    /// unavailable), resending it while the store is away if `safety` allows.
    async fn timed<T, F, Fut>(
        &self,
        what: &str,
        safety: Safety,
        mut call: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut(ArtifactStoreClient<TracedChannel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let deadline = self.timeout;
        self.store
            .call(safety, what, || {
                let attempt = call(self.client.clone());
                async move {
                    match tokio::time::timeout(deadline, attempt).await {
                        Ok(result) => result,
                        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                            "no answer to {what} within {} ms (store_timeout_ms)",
                            deadline.as_millis()
                        ))),
                    }
                }
            })
            .await
            .map_err(StoreError::from_status)
    }

    /// Creates the project if needed (idempotent).
    pub async fn create_project(&self, project_id: &str) -> Result<(), StoreError> {
        let request = CreateProjectRequest {
            project_id: project_id.to_owned(),
        };
        self.timed("CreateProject", Safety::Idempotent, |mut client| {
            let request = request.clone();
            async move { client.create_project(request).await.map(|_| ()) }
        })
        .await
    }

    /// Streams `content` as one Put (header, then chunks). Ingest's Puts carry the expected
    /// digest, so a resent Put of bytes that landed is `unchanged`.
    pub async fn put(&self, header: PutHeader, content: Bytes) -> Result<PutResponse, StoreError> {
        let safety = if header.expected_sha256.is_empty() {
            Safety::Once
        } else {
            Safety::Idempotent
        };
        self.timed("Put", safety, |mut client| {
            let mut messages = vec![PutRequest {
                msg: Some(put_request::Msg::Header(header.clone())),
            }];
            let mut at = 0;
            while at < content.len() {
                let end = content.len().min(at + CHUNK_BYTES);
                messages.push(PutRequest {
                    msg: Some(put_request::Msg::Chunk(content.slice(at..end))),
                });
                at = end;
            }
            async move {
                client
                    .put(futures::stream::iter(messages))
                    .await
                    .map(tonic::Response::into_inner)
            }
        })
        .await
    }

    /// Reads a file: (size, sha256, the first `max + 1` bytes at most).
    pub async fn get(
        &self,
        project_id: &str,
        path: &str,
        max: u64,
    ) -> Result<(u64, String, Vec<u8>), StoreError> {
        let request = GetRequest {
            project_id: project_id.to_owned(),
            path: path.to_owned(),
            offset: 0,
            length: max.saturating_add(1),
        };
        self.timed("Get", Safety::Idempotent, |mut client| {
            let request = request.clone();
            async move {
                let mut stream = client.get(request).await?.into_inner();
                let (mut size, mut sha256, mut bytes) = (0, String::new(), Vec::new());
                while let Some(message) = stream.next().await {
                    match message?.msg {
                        Some(get_response::Msg::Info(info)) => {
                            size = info.size_bytes;
                            sha256 = info.sha256;
                        }
                        Some(get_response::Msg::Chunk(chunk)) => {
                            bytes.extend_from_slice(&chunk);
                            if bytes.len() as u64 > max {
                                break;
                            }
                        }
                        None => {}
                    }
                }
                Ok((size, sha256, bytes))
            }
        })
        .await
    }

    /// The sha256 of the file at `path`; None when nothing (or no regular file) is there.
    pub async fn stat_sha256(
        &self,
        project_id: &str,
        path: &str,
    ) -> Result<Option<String>, StoreError> {
        let request = StatRequest {
            project_id: project_id.to_owned(),
            path: path.to_owned(),
            include_sha256: true,
        };
        let stat = self
            .timed("Stat", Safety::Idempotent, |mut client| {
                let request = request.clone();
                async move { client.stat(request).await.map(tonic::Response::into_inner) }
            })
            .await;
        match stat {
            Ok(info) if info.kind == EntryKind::File as i32 => Ok(Some(info.sha256)),
            Ok(_) | Err(StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every file beneath `prefix` (all pages).
    pub async fn list_files(
        &self,
        project_id: &str,
        prefix: &str,
    ) -> Result<Vec<String>, StoreError> {
        let mut files = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = ListRequest {
                project_id: project_id.to_owned(),
                prefix: prefix.to_owned(),
                recursive: true,
                page: Some(PageRequest {
                    page_size: 10_000,
                    page_token: page_token.clone(),
                }),
            };
            let page = self
                .timed("List", Safety::Idempotent, |mut client| {
                    let request = request.clone();
                    async move { client.list(request).await.map(tonic::Response::into_inner) }
                })
                .await;
            let page = match page {
                Ok(page) => page,
                Err(StoreError::NotFound(_)) => return Ok(files),
                Err(e) => return Err(e),
            };
            files.extend(page.entries.into_iter().map(|e| e.path));
            if page.next_page_token.is_empty() {
                return Ok(files);
            }
            page_token = page.next_page_token;
        }
    }

    /// Appends events to the run's events.jsonl, in order, under the caller's ingest `claim`
    /// (empty = none): only while the claim's epoch is still the run's. The store does not
    /// recognise a batch sent twice, so it is resent only when it provably never reached the
    /// store.
    pub async fn append_events(
        &self,
        project_id: &str,
        run_id: &str,
        claim: &str,
        events: Vec<EventInput>,
    ) -> Result<(), StoreError> {
        let request = AppendEventsRequest {
            project_id: project_id.to_owned(),
            run_id: run_id.to_owned(),
            claim: claim.to_owned(),
            events,
            ..Default::default()
        };
        self.timed("AppendEvents", Safety::Once, |mut client| {
            let request = request.clone();
            async move { client.append_events(request).await.map(|_| ()) }
        })
        .await
    }
}
