//! `map`: runs its body once per item with bounded parallelism. Items come from the graph, from
//! a template that renders to a JSON array, or from a JSON file in the project; items that did
//! not come from the graph are recorded (`map.items`), so a resumed run maps the same list.

use serde_json::Value;

use super::{NodeError, Scope};
use cairn_graph::{MapNode, MapOver, MAX_MAP_ITEMS};
use cairn_store_client::Store;

/// The items, and whether they must be recorded (not written in the graph).
pub async fn items(
    store: &Store,
    project: &str,
    scope: &Scope,
    spec: &MapNode,
) -> Result<(Vec<Value>, bool), NodeError> {
    let (items, recorded) = match &spec.over {
        MapOver::List(items) => (items.clone(), false),
        MapOver::Template(t) => match scope.render_value("over", t)? {
            Value::Array(a) => (a, true),
            Value::String(s) => match serde_json::from_str::<Value>(&s) {
                Ok(Value::Array(a)) => (a, true),
                _ => {
                    return Err(NodeError::refused(format!(
                        "field `over`: `{}` is not a JSON array",
                        t.source()
                    )))
                }
            },
            other => {
                return Err(NodeError::refused(format!(
                    "field `over`: `{}` gave {other}, not a list",
                    t.source()
                )))
            }
        },
        MapOver::File { file, pointer } => {
            let path = super::project_path(scope, "over.file", file, super::Access::Read)?;
            let bytes = store
                .get(project, &path)
                .await
                .map_err(|s| NodeError::from_status(&format!("reading {path}"), &s))?
                .ok_or_else(|| {
                    NodeError::refused(format!("field `over.file`: {path} does not exist"))
                })?;
            let doc: Value = serde_json::from_slice(&bytes).map_err(|e| {
                NodeError::refused(format!("field `over.file`: {path} is not JSON: {e}"))
            })?;
            let target = match pointer {
                Some(p) => doc
                    .pointer(p)
                    .cloned()
                    .ok_or_else(|| NodeError::refused(format!("{path} has nothing at {p}")))?,
                None => doc,
            };
            match target {
                Value::Array(a) => (a, true),
                _ => {
                    return Err(NodeError::refused(format!(
                        "field `over.file`: {path} does not hold a JSON array"
                    )))
                }
            }
        }
    };
    if items.len() > MAX_MAP_ITEMS {
        return Err(NodeError::refused(format!(
            "{} items; a map takes at most {MAX_MAP_ITEMS}",
            items.len()
        )));
    }
    Ok((items, recorded))
}
