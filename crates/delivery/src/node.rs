//! `deliver`: hands files to a delivery target (delivery.rs): a project directory or a OneBot
//! group / private chat. A file that cannot be delivered fails the node with the reason and
//! the file's stored path.

use serde_json::json;

use crate::{target_for, DeliveryCtx};
use cairn_graph::Deliver;
use cairn_node::events::{Ev, DELIVERY_COMPLETED};
use cairn_node::{expand_files, NodeCtx, NodeError, NodeSuccess};

pub async fn run(
    ctx: &NodeCtx,
    spec: &Deliver,
    onebot: &crate::onebot::OneBotConfig,
) -> Result<NodeSuccess, NodeError> {
    let files = expand_files(ctx, "files", &spec.files).await?;
    if files.is_empty() {
        return Err(NodeError::refused(
            "field `files`: nothing to deliver (no file matched)",
        ));
    }
    let target = target_for(&spec.target, &ctx.scope, onebot)?;
    let dctx = DeliveryCtx {
        store: ctx.store(),
        project: &ctx.project,
        run_id: &ctx.run_id,
        overwrite: ctx.reset,
        step_key: &ctx.step.key,
    };
    let receipt = target.deliver(&dctx, &files).await?;
    let mut out = NodeSuccess::default();
    out.outputs
        .insert("target".into(), receipt.target.clone().into());
    out.outputs
        .insert("location".into(), receipt.location.clone().into());
    out.outputs
        .insert("delivered".into(), json!(receipt.delivered));
    let mut done = Ev::new(DELIVERY_COMPLETED, &ctx.node_id)
        .with("target", receipt.target)
        .with("location", receipt.location)
        .with("files", json!(receipt.delivered));
    if !receipt.uploads.is_empty() {
        // Chat targets: how each file went (uploaded / sent_as_message, the action used).
        out.outputs.insert("uploads".into(), json!(receipt.uploads));
        done = done.with("uploads", json!(receipt.uploads));
    }
    out.events.push(done);
    Ok(out)
}

/// The `deliver` kind, with the OneBot endpoint chat targets use.
pub struct DeliverKind {
    pub onebot: crate::onebot::OneBotConfig,
}

impl cairn_node::Kind for DeliverKind {
    fn type_name(&self) -> &'static str {
        "deliver"
    }

    fn run<'a>(
        &'a self,
        ctx: &'a NodeCtx,
    ) -> cairn_node::BoxFuture<'a, Result<NodeSuccess, NodeError>> {
        Box::pin(async move {
            match &ctx.node.kind {
                cairn_graph::NodeKind::Deliver(spec) => run(ctx, spec, &self.onebot).await,
                _ => Err(cairn_node::mismatch(self.type_name(), &ctx.node)),
            }
        })
    }
}
