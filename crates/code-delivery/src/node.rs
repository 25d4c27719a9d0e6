//! `code_delivery`: the code delivery agent as a node (the work is in
//! `crate::code_delivery`).

use cairn_node::{NodeCtx, NodeError, NodeSuccess};

/// The `code_delivery` kind, with its configuration and the OneBot endpoint of chat targets.
pub struct CodeDeliveryKind {
    pub config: crate::CodeDeliveryConfig,
    pub onebot: cairn_delivery::onebot::OneBotConfig,
}

impl cairn_node::Kind for CodeDeliveryKind {
    fn type_name(&self) -> &'static str {
        "code_delivery"
    }

    fn check(&self, node: &cairn_graph::Node) -> Result<(), String> {
        match &node.kind {
            cairn_graph::NodeKind::CodeDelivery(c) => {
                c.llm.as_deref().map_or(Ok(()), cairn_agents::check_llm)
            }
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
                    crate::agent::run(ctx, spec, &self.config, &self.onebot).await
                }
                _ => Err(cairn_node::mismatch(self.type_name(), &ctx.node)),
            }
        })
    }
}
