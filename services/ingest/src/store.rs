//! The artifact-store as ingest sees it: a gRPC client with a deadline on every call and the
//! store's answers sorted into what ingest does with them (seed 000: fail-open). Ingest never
//! touches a filesystem; every byte it writes goes through here.

use std::time::Duration;

use bytes::Bytes;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::{
    get_response, put_request, AppendEventsRequest, CreateProjectRequest, EventInput, GetRequest,
    PutHeader, PutRequest, PutResponse,
};
use cairn_telemetry::TracedChannel;
use futures::StreamExt;
use tonic::Code;

use crate::block::reason;

/// Bytes per Put chunk (the store recommends 64 KiB - 1 MiB).
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
            (Some(word), code) => StoreError::Refused {
                reason: word,
                code,
                message,
            },
            (None, Code::NotFound) => StoreError::NotFound(message),
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
}

impl StoreClient {
    /// A client over a (lazily connecting) channel.
    pub fn new(channel: tonic::transport::Channel, timeout: Duration) -> StoreClient {
        let client = ArtifactStoreClient::new(cairn_telemetry::traced(channel))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        StoreClient { client, timeout }
    }

    /// Runs `call` with the deadline; a store that does not answer in time is unavailable.
    async fn timed<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer to {what} within {} ms (store_timeout_ms)",
                self.timeout.as_millis()
            ))),
        }
    }

    /// Creates the project if needed (idempotent).
    pub async fn create_project(&self, project_id: &str) -> Result<(), StoreError> {
        let mut client = self.client.clone();
        let request = CreateProjectRequest {
            project_id: project_id.to_owned(),
        };
        self.timed("CreateProject", async move {
            client
                .create_project(request)
                .await
                .map(|_| ())
                .map_err(StoreError::from_status)
        })
        .await
    }

    /// Writes `content` as one file: the header, then chunks of at most 256 KiB.
    pub async fn put(&self, header: PutHeader, content: Bytes) -> Result<PutResponse, StoreError> {
        let mut messages = vec![PutRequest {
            msg: Some(put_request::Msg::Header(header)),
        }];
        let mut at = 0;
        while at < content.len() {
            let end = content.len().min(at + CHUNK_BYTES);
            messages.push(PutRequest {
                msg: Some(put_request::Msg::Chunk(content.slice(at..end))),
            });
            at = end;
        }
        let mut client = self.client.clone();
        self.timed("Put", async move {
            client
                .put(futures::stream::iter(messages))
                .await
                .map(tonic::Response::into_inner)
                .map_err(StoreError::from_status)
        })
        .await
    }

    /// Reads at most `max + 1` bytes of a file; returns (size of the whole file, sha256 of the
    /// whole file, bytes read). The caller compares the size with its limit.
    pub async fn get(
        &self,
        project_id: &str,
        path: &str,
        max: u64,
    ) -> Result<(u64, String, Vec<u8>), StoreError> {
        let mut client = self.client.clone();
        let request = GetRequest {
            project_id: project_id.to_owned(),
            path: path.to_owned(),
            offset: 0,
            length: max.saturating_add(1),
        };
        self.timed("Get", async move {
            let mut stream = client
                .get(request)
                .await
                .map_err(StoreError::from_status)?
                .into_inner();
            let (mut size, mut sha256, mut bytes) = (0, String::new(), Vec::new());
            while let Some(message) = stream.next().await {
                match message.map_err(StoreError::from_status)?.msg {
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
        })
        .await
    }

    /// Appends events to the run's events.jsonl, in order; `epoch` > 0 = only while that is
    /// still the run's writer epoch (ClaimRun).
    pub async fn append_events(
        &self,
        project_id: &str,
        run_id: &str,
        epoch: u64,
        events: Vec<EventInput>,
    ) -> Result<(), StoreError> {
        let mut client = self.client.clone();
        let request = AppendEventsRequest {
            project_id: project_id.to_owned(),
            run_id: run_id.to_owned(),
            epoch,
            publication_tokens: Vec::new(),
            events,
        };
        self.timed("AppendEvents", async move {
            client
                .append_events(request)
                .await
                .map(|_| ())
                .map_err(StoreError::from_status)
        })
        .await
    }
}
