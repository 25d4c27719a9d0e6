//! `condition`: evaluates `if` and picks a branch; the nodes of the branch not taken are
//! skipped (and recorded as skipped) by the scheduler. Pure: runs inline, no I/O.

use serde_json::{Map, Value};

use super::{NodeError, Scope};
use cairn_graph::Condition;

/// The condition's value and outputs (`value`, `branch`).
pub fn evaluate(scope: &Scope, spec: &Condition) -> Result<(bool, Map<String, Value>), NodeError> {
    let value = scope.eval("if", &spec.cond)?;
    let mut out = Map::new();
    out.insert("value".into(), value.into());
    out.insert("branch".into(), if value { "then" } else { "else" }.into());
    Ok((value, out))
}

/// The nodes the branch not taken names.
pub fn not_taken(spec: &Condition, value: bool) -> &[String] {
    if value {
        &spec.otherwise
    } else {
        &spec.then
    }
}
