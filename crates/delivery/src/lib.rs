//! Delivery targets of `deliver` nodes: `local_dir` (a directory inside the project, written
//! through the store) and OneBot v11 chats, `group` / `private` (onebot.rs;
//! endpoint and token from the `[onebot]` config section), and the `deliver` node kind
//! ([`node::DeliverKind`]). Depends on the node API (cairn-node), the graph language and the
//! store client; never on the orchestrator.

pub mod node;
pub mod onebot;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::Value;

use cairn_graph::{Target, Template};
use cairn_node::{NodeError, Scope};
use cairn_store_client::{PutOptions, Store};

/// What a delivery did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Receipt {
    /// Target type (`local_dir`, `group`, `private`).
    pub target: String,
    /// Where the files went (a project directory, `group:<id>` ...).
    pub location: String,
    /// What was delivered there.
    pub delivered: Vec<String>,
    /// Per-file receipts of chat targets (how each file went: uploaded or sent as a message).
    pub uploads: Vec<crate::onebot::UploadReceipt>,
}

/// The run on whose behalf a delivery happens.
pub struct DeliveryCtx<'a> {
    pub store: &'a Store,
    pub project: &'a str,
    pub run_id: &'a str,
    /// Replace files an earlier attempt delivered.
    pub overwrite: bool,
    /// The step delivering (its idempotency key; "" = none).
    pub step_key: &'a str,
}

/// One way to hand a run's files to someone.
pub trait DeliveryTarget: Send + Sync {
    fn kind(&self) -> &'static str;
    /// Delivers the project files `files`.
    fn deliver<'a>(
        &'a self,
        ctx: &'a DeliveryCtx<'a>,
        files: &'a [String],
    ) -> BoxFuture<'a, Result<Receipt, NodeError>>;
}

pub use cairn_graph::targets::check_deliver_target as check_target;

/// The project directory a `local_dir`/`directory` target names: `path` rendered, without a
/// trailing `/`, checked as a project path prefix.
pub fn target_dir(t: &Target, scope: &Scope) -> Result<String, NodeError> {
    let raw = t
        .fields
        .get("path")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let tpl = Template::parse(raw).map_err(NodeError::refused)?;
    let dir = scope
        .render("target.path", &tpl)?
        .trim_end_matches('/')
        .to_owned();
    pathguard::validate_prefix(&dir)
        .map_err(|rej| NodeError::refused(format!("target.path `{dir}`: {rej}")))?;
    cairn_node::check_access(
        &scope.graph.run_id,
        "target.path",
        &dir,
        cairn_node::Access::Write,
    )?;
    Ok(dir)
}

/// The target a node's (checked) spec names, its templates rendered; chat targets use the
/// `[onebot]` section.
pub fn target_for(
    t: &Target,
    scope: &Scope,
    onebot: &crate::onebot::OneBotConfig,
) -> Result<Box<dyn DeliveryTarget>, NodeError> {
    match t.kind.as_str() {
        "local_dir" => Ok(Box::new(LocalDir {
            dir: target_dir(t, scope)?,
        })),
        "group" | "private" => Ok(Box::new(crate::onebot::target_for(t, scope, onebot)?)),
        other => Err(NodeError::refused(format!(
            "delivery target type `{other}` is not available"
        ))),
    }
}

/// Copies files into a project directory (basename kept).
pub struct LocalDir {
    pub dir: String,
}

impl DeliveryTarget for LocalDir {
    fn kind(&self) -> &'static str {
        "local_dir"
    }

    fn deliver<'a>(
        &'a self,
        ctx: &'a DeliveryCtx<'a>,
        files: &'a [String],
    ) -> BoxFuture<'a, Result<Receipt, NodeError>> {
        Box::pin(async move {
            let mut delivered = Vec::new();
            let mut names = std::collections::HashSet::new();
            for f in files {
                let name = f.rsplit('/').next().unwrap_or(f);
                if !names.insert(name.to_owned()) {
                    return Err(NodeError::refused(format!(
                        "two files named `{name}` would land in {}; deliver them in separate nodes",
                        self.dir
                    )));
                }
                let bytes: Bytes = ctx
                    .store
                    .get(ctx.project, f)
                    .await
                    .map_err(|s| NodeError::from_status(&format!("reading {f}"), &s))?
                    .ok_or_else(|| NodeError::refused(format!("{f} does not exist")))?;
                let to = format!("{}/{name}", self.dir);
                let opts = PutOptions {
                    overwrite: ctx.overwrite,
                    run_id: ctx.run_id.to_owned(),
                    ..Default::default()
                };
                let put = ctx
                    .store
                    .put(ctx.project, &to, bytes, &opts)
                    .await
                    .map_err(|s| cairn_node::write_error(&to, &s))?;
                delivered.push(put.path);
            }
            Ok(Receipt {
                target: self.kind().into(),
                location: self.dir.clone(),
                delivered,
                uploads: Vec::new(),
            })
        })
    }
}
