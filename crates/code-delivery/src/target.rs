//! Where a code delivery goes: a OneBot group or private chat
//! (`{type: group|private, id}`, through `onebot.rs`), or a directory of the project
//! (`{type: directory, path}`, written through the store; `local_dir` is the same, as in
//! `deliver` nodes). The same target receives the
//! failure notice when an LLM request used all its attempts.

use bytes::Bytes;
use serde::Serialize;

use cairn_delivery::onebot::{
    self, FailureNotice, OneBotConfig, OneBotTarget, OutgoingFile, UploadStatus,
};
use cairn_graph::Target as TargetSpec;
use cairn_node::{NodeError, Scope};
use cairn_store_client::{PutOptions, Store};

/// The run a delivery belongs to.
pub struct Place<'a> {
    pub store: &'a Store,
    pub project: &'a str,
    pub run_id: &'a str,
    pub node_id: &'a str,
    /// Replace what an earlier attempt of the node wrote.
    pub overwrite: bool,
    /// The step delivering (its idempotency key; "" = none).
    pub step_key: &'a str,
}

/// A checked, rendered target.
#[derive(Debug)]
pub enum Target {
    Chat(Box<OneBotTarget>),
    /// A project directory (no trailing `/`).
    Directory(String),
}

/// How the archive was delivered (`end`'s upload status).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Delivery {
    /// `uploaded`, `sent_as_message` (OneBot fallback), `written` (directory) or `failed`.
    pub status: &'static str,
    /// `group:<id>`, `private:<id>` or the directory.
    pub location: String,
    /// The delivered copy's project path (directory targets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The OneBot action that delivered it, or the last one tried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// What failed, naming where the archive is kept for manual hand-over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub use cairn_graph::targets::check_code_delivery_target as check;

impl Target {
    /// The target a node names, its templates rendered.
    pub fn new(t: &TargetSpec, scope: &Scope, onebot: &OneBotConfig) -> Result<Target, NodeError> {
        match t.kind.as_str() {
            "group" | "private" => Ok(Target::Chat(Box::new(onebot::target_for(
                t, scope, onebot,
            )?))),
            "directory" | "local_dir" => {
                Ok(Target::Directory(cairn_delivery::target_dir(t, scope)?))
            }
            other => Err(NodeError::refused(format!(
                "target type `{other}` is not one of group, private, directory"
            ))),
        }
    }

    /// `group:<id>`, `private:<id>` or `directory:<path>`.
    pub fn describe(&self) -> String {
        match self {
            Target::Chat(c) => c.chat().to_string(),
            Target::Directory(d) => format!("directory:{d}"),
        }
    }

    /// Delivers the stored archive `name` (kept at `stored_path`). Never an Err: a failed
    /// delivery is a `failed` status with its error.
    pub async fn deliver(
        &self,
        place: &Place<'_>,
        name: &str,
        bytes: &Bytes,
        stored_path: &str,
    ) -> Delivery {
        match self {
            Target::Chat(chat) => {
                let receipt = chat
                    .send_file(&OutgoingFile {
                        name,
                        bytes,
                        project: place.project,
                        stored_path,
                        run_id: place.run_id,
                        step_key: place.step_key,
                    })
                    .await;
                Delivery {
                    status: match receipt.status {
                        UploadStatus::Uploaded => "uploaded",
                        UploadStatus::SentAsMessage => "sent_as_message",
                        UploadStatus::Failed => "failed",
                    },
                    location: receipt.chat,
                    path: None,
                    action: Some(receipt.action),
                    error: receipt.error,
                }
            }
            Target::Directory(dir) => {
                let to = format!("{dir}/{name}");
                let opts = PutOptions {
                    overwrite: place.overwrite,
                    run_id: place.run_id.to_owned(),
                    ..Default::default()
                };
                match place
                    .store
                    .put(place.project, &to, bytes.clone(), &opts)
                    .await
                {
                    Ok(put) => Delivery {
                        status: "written",
                        location: dir.clone(),
                        path: Some(put.path),
                        action: None,
                        error: None,
                    },
                    Err(s) => Delivery {
                        status: "failed",
                        location: dir.clone(),
                        path: None,
                        action: None,
                        error: Some(format!(
                            "writing {to}: {}; the archive is kept in the project at {stored_path} for manual delivery",
                            s.message()
                        )),
                    },
                }
            }
        }
    }

    /// Sends the failure notice; Ok says where it went.
    pub async fn notify(
        &self,
        place: &Place<'_>,
        notice: &FailureNotice<'_>,
    ) -> Result<String, String> {
        match self {
            Target::Chat(chat) => onebot::notify_failure(
                chat,
                notice.task_id,
                notice.stage,
                notice.error_summary,
                notice.retry_advice,
            )
            .await
            .map(|()| chat.chat().to_string())
            .map_err(|e| e.to_string()),
            Target::Directory(dir) => {
                let to = format!("{dir}/{}-failure.txt", place.node_id);
                let opts = PutOptions {
                    overwrite: true,
                    run_id: place.run_id.to_owned(),
                    ..Default::default()
                };
                place
                    .store
                    .put(place.project, &to, Bytes::from(notice.text() + "\n"), &opts)
                    .await
                    .map(|put| put.path)
                    .map_err(|s| format!("writing {to}: {}", s.message()))
            }
        }
    }
}
