//! `code_delivery`: the code delivery agent as a node (the work is in
//! `crate::code_delivery`).

use super::{NodeCtx, NodeError, NodeSuccess};

/// The `code_delivery` kind, with its configuration and the OneBot endpoint of chat targets.
pub struct CodeDeliveryKind {
    pub config: crate::code_delivery::CodeDeliveryConfig,
    pub onebot: crate::onebot::OneBotConfig,
}

impl cairn_node::Kind for CodeDeliveryKind {
    fn type_name(&self) -> &'static str {
        "code_delivery"
    }

    fn check(&self, node: &cairn_graph::Node) -> Result<(), String> {
        match &node.kind {
            cairn_graph::NodeKind::CodeDelivery(c) => c
                .llm
                .as_deref()
                .map_or(Ok(()), super::agent_task::check_llm),
            _ => Ok(()),
        }
    }

    fn run<'a>(
        &'a self,
        ctx: &'a NodeCtx,
    ) -> cairn_node::BoxFuture<'a, Result<NodeSuccess, NodeError>> {
        Box::pin(async move {
            match &ctx.node.kind {
                cairn_graph::NodeKind::CodeDelivery(spec) => {
                    crate::code_delivery::agent::run(ctx, spec, &self.config, &self.onebot).await
                }
                _ => Err(cairn_node::mismatch(self.type_name(), &ctx.node)),
            }
        })
    }
}
