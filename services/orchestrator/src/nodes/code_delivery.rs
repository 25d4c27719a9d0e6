//! `code_delivery`: the code delivery agent as a node (the work is in
//! `crate::code_delivery`).

use super::{NodeCtx, NodeError, NodeSuccess};
use crate::code_delivery::CodeDelivery;

pub async fn run(ctx: &NodeCtx, spec: &CodeDelivery) -> Result<NodeSuccess, NodeError> {
    crate::code_delivery::agent::run(ctx, spec).await
}
