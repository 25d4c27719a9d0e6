//! Result contracts: JSON Schemas a graph declares for the result files its nodes
//! write under the run's `results/`, and the fail-safe protocol of a node with `result:`:
//! a placeholder with `status: failed` is written before the node runs (fail-safe), and replaced by the node's result when it succeeds. A node that succeeds
//! without a result leaves the placeholder (with the reason), so a later phase reads `failed`.
//!
//! Schema violations never fail the node: the result is kept as written and reported, and the
//! assemble step reads it as failed with the reason (the final file is the truth).

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::inputs::{self, GraphFiles};
use crate::{check_result_name, results_path, RESULT_INVALID, RESULT_MISSING};
use crate::{RESULT_PLACEHOLDER, RESULT_WRITTEN};
use cairn_node::events::{now, Ev};
use cairn_node::{NodeCtx, NodeError, NodeSuccess};
use cairn_store_client::PutOptions;

/// Largest result document accepted from a node.
pub const MAX_RESULT_BYTES: usize = 1 << 20;
pub use cairn_graph::contract::{check_all, compile, Contract, Contracts};

/// Loads a contract's `schema_file` (relative to the graph) unless the schema is already there.
pub async fn load<F: GraphFiles>(contract: &mut Contract, files: &F) -> Result<(), String> {
    if contract.schema.is_some() {
        return Ok(());
    }
    let Some(file) = &contract.schema_file else {
        return Ok(());
    };
    let text = files.read(&inputs::resolve(None, file)?).await?;
    let schema: Value =
        serde_json::from_str(&text).map_err(|e| format!("{file} is not JSON: {e}"))?;
    compile(&schema).map_err(|e| format!("{file}: {e}"))?;
    contract.schema = Some(schema);
    Ok(())
}

/// The JSON document a node's text carries: the whole text (after any YAML front matter) when
/// it is JSON, else the last fenced block whose info string starts with `json` and whose body
/// is a JSON object. Err says why there is none.
pub fn extract_json(text: &str) -> Result<Value, String> {
    let body = strip_front_matter(text);
    if let Ok(v) = serde_json::from_str::<Value>(body.trim()) {
        return Ok(v);
    }
    let mut found = None;
    let mut blocks = 0;
    let mut lines = body.lines();
    while let Some(line) = lines.next() {
        let Some((ch, len, info)) = fence(line) else {
            continue;
        };
        let mut content = String::new();
        for inner in lines.by_ref() {
            if let Some((c2, l2, rest)) = fence(inner) {
                if c2 == ch && l2 >= len && rest.trim().is_empty() {
                    break;
                }
            }
            content.push_str(inner);
            content.push('\n');
        }
        let lang = info.split_whitespace().next().unwrap_or("");
        if !lang.eq_ignore_ascii_case("json") {
            continue;
        }
        blocks += 1;
        if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(&content) {
            found = Some(v);
        }
    }
    match found {
        Some(v) => Ok(v),
        None if blocks > 0 => Err(format!(
            "none of its {blocks} ```json block(s) holds a valid JSON object"
        )),
        None => Err("it is not JSON and has no ```json block".into()),
    }
}

fn strip_front_matter(text: &str) -> &str {
    let t = text.strip_prefix('\u{feff}').unwrap_or(text);
    if let Some(rest) = t.strip_prefix("---\n") {
        if let Some(end) = rest.find("\n---\n") {
            return &rest[end + 5..];
        }
    }
    t
}

/// A fence line (CommonMark: 0-3 spaces, 3+ backticks or tildes): (char, length, info).
fn fence(line: &str) -> Option<(char, usize, &str)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let t = &line[indent..];
    let ch = t.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = t.chars().take_while(|c| *c == ch).count();
    if len < 3 {
        return None;
    }
    Some((ch, len, t[len..].trim_end_matches('\r')))
}

/// The fail-safe placeholder of a node's result.
pub fn placeholder(node: &str, error: &str) -> Value {
    json!({
        "agent": node,
        "status": "failed",
        "placeholder": true,
        "summary": "",
        "error": error,
        "written_at": now(),
    })
}

/// The result file of one node attempt.
pub struct ResultSlot {
    pub name: String,
    pub path: String,
}

async fn put_json(ctx: &NodeCtx, path: &str, doc: &Value) -> Result<(), NodeError> {
    let opts = PutOptions {
        overwrite: true,
        run_id: ctx.run_id.clone(),
        ..Default::default()
    };
    let body = Bytes::from(format!("{doc:#}\n"));
    ctx.store()
        .put(&ctx.project, path, body, &opts)
        .await
        .map(|_| ())
        .map_err(|s| NodeError::from_status(&format!("writing result {path}"), &s))
}

/// Before the node runs: renders its `result:` and writes the placeholder (None when the node
/// declares no result).
pub async fn begin(ctx: &NodeCtx) -> Result<Option<ResultSlot>, NodeError> {
    let Some(t) = &ctx.node.result else {
        return Ok(None);
    };
    let name = ctx.scope.render("result", t)?;
    check_result_name(&name).map_err(|m| NodeError::refused(format!("field `result`: {m}")))?;
    let path = results_path(&ctx.run_id, &name);
    let doc = placeholder(
        &ctx.node_id,
        &format!(
            "fail-safe placeholder: node `{}` has not finished",
            ctx.node_id
        ),
    );
    put_json(ctx, &path, &doc).await?;
    ctx.progress
        .emit(Ev::new(RESULT_PLACEHOLDER, &ctx.node_id).with("path", path.as_str()));
    Ok(Some(ResultSlot { name, path }))
}

/// After the node's attempt: its result replaces the placeholder, or the placeholder is kept
/// with the reason. The node's own outcome is never changed by its result.
pub async fn finish(
    ctx: &NodeCtx,
    slot: ResultSlot,
    outcome: Result<NodeSuccess, NodeError>,
) -> Result<NodeSuccess, NodeError> {
    let mut success = match outcome {
        Ok(s) => s,
        Err(e) => {
            // Best effort: the placeholder says why (it already says failed).
            let doc = placeholder(
                &ctx.node_id,
                &format!("node `{}` failed: {}", ctx.node_id, e.message),
            );
            let _ = put_json(ctx, &slot.path, &doc).await;
            return Err(e);
        }
    };
    let found = match success.outputs.remove("result") {
        Some(v @ Value::Object(_)) => Ok(v),
        _ => node_document(ctx, &success.outputs).await?,
    };
    let doc = match found {
        Ok(v @ Value::Object(_)) if v.to_string().len() <= MAX_RESULT_BYTES => v,
        other => {
            let why = match other {
                Err(why) => why,
                Ok(Value::Object(_)) => format!("larger than {} KiB", MAX_RESULT_BYTES >> 10),
                Ok(_) => "its JSON is not an object".into(),
            };
            let error = format!(
                "node `{}` finished without a result ({why}); the fail-safe placeholder stays",
                ctx.node_id
            );
            put_json(ctx, &slot.path, &placeholder(&ctx.node_id, &error)).await?;
            success.events.push(
                Ev::new(RESULT_MISSING, &ctx.node_id)
                    .level(cairn_proto::v1::Level::Warning)
                    .with("path", slot.path.as_str())
                    .with("error", error.as_str()),
            );
            insert_outputs(&mut success.outputs, &slot, "failed", None);
            return Ok(success);
        }
    };
    put_json(ctx, &slot.path, &doc).await?;
    let contracts = Contracts::compile(&ctx.scope.graph.contracts)
        .map_err(|m| NodeError::refused(format!("contracts: {m}")))?;
    let violations = contracts.violations(&slot.name, &doc);
    let status = if violations.is_empty() {
        doc.get("status")
            .and_then(Value::as_str)
            .unwrap_or("failed")
            .to_owned()
    } else {
        success.events.push(
            Ev::new(RESULT_INVALID, &ctx.node_id)
                .level(cairn_proto::v1::Level::Warning)
                .with("path", slot.path.as_str())
                .with("errors", json!(violations)),
        );
        "failed".to_owned()
    };
    success.events.push(
        Ev::new(RESULT_WRITTEN, &ctx.node_id)
            .with("path", slot.path.as_str())
            .with("status", status.as_str())
            .with("valid", violations.is_empty())
            .with("contract", contracts.covers(&slot.name)),
    );
    insert_outputs(&mut success.outputs, &slot, &status, Some(doc));
    Ok(success)
}

fn insert_outputs(
    out: &mut Map<String, Value>,
    slot: &ResultSlot,
    status: &str,
    doc: Option<Value>,
) {
    out.insert("result".into(), doc.unwrap_or(Value::Null));
    out.insert("result_path".into(), slot.path.clone().into());
    out.insert("result_status".into(), status.into());
}

/// The JSON carried by the file the node wrote (`outputs.path`). Outer Err = the store failed.
async fn node_document(
    ctx: &NodeCtx,
    outputs: &Map<String, Value>,
) -> Result<Result<Value, String>, NodeError> {
    let Some(path) = outputs.get("path").and_then(Value::as_str) else {
        return Ok(Err("the node wrote no document".into()));
    };
    let bytes = ctx
        .store()
        .get(&ctx.project, path)
        .await
        .map_err(|s| NodeError::from_status(&format!("reading {path}"), &s))?;
    let Some(bytes) = bytes else {
        return Ok(Err(format!("{path} is gone")));
    };
    let text = String::from_utf8_lossy(&bytes);
    Ok(extract_json(&text).map_err(|why| format!("{path}: {why}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn contracts(schema: Value, files: &[&str]) -> Contracts {
        Contracts::compile(&[Contract {
            files: files.iter().map(|s| (*s).to_owned()).collect(),
            schema: Some(schema),
            schema_file: None,
        }])
        .unwrap()
    }

    #[test]
    fn whole_json_documents_and_front_matter() {
        assert_eq!(extract_json("{\"a\": 1}\n").unwrap(), json!({"a": 1}));
        let md = "---\ntitle: x\n---\n{\"status\": \"success\"}";
        assert_eq!(extract_json(md).unwrap(), json!({"status": "success"}));
    }

    #[test]
    fn the_last_json_block_wins() {
        let md =
            "Plan:\n\n```json\n{\"n\": 1}\n```\n\nFinal:\n\n````json result\n{\"n\": 2}\n````\n";
        assert_eq!(extract_json(md).unwrap(), json!({"n": 2}));
        let md = "```json\n{\"n\": 1}\n```\n```json\nnot json\n```\n";
        assert_eq!(extract_json(md).unwrap(), json!({"n": 1}));
    }

    #[test]
    fn no_result_says_why() {
        let e = extract_json("# Done\n\nI did it.\n").unwrap_err();
        assert!(e.contains("no ```json block"), "{e}");
        let e = extract_json("```json\n[1,\n```\n").unwrap_err();
        assert!(e.contains("1 ```json block"), "{e}");
        // A python block with JSON in it is not a result.
        let e = extract_json("```python\n{\"a\": 1}\n```\n").unwrap_err();
        assert!(e.contains("no ```json block"), "{e}");
    }

    #[test]
    fn fences_inside_other_fences_are_content() {
        let md = "````markdown\n```json\n{\"inner\": true}\n```\n````\n";
        assert!(extract_json(md).is_err());
    }

    #[test]
    fn violations_name_the_place_and_the_schema() {
        let c = contracts(
            json!({"type": "object", "required": ["status"], "properties": {
                "status": {"enum": ["success", "partial", "failed", "no_changes"]},
                "done_cert": {"type": "object", "properties": {"quality_score": {"type": "integer", "minimum": 1, "maximum": 5}}}
            }}),
            &["todoist-auto-*.json"],
        );
        assert!(c.covers("todoist-auto-x.json"));
        assert!(!c.covers("news.json"));
        assert!(!c.covers("sub/todoist-auto-x.json"));
        assert!(c
            .violations("todoist-auto-x.json", &json!({"status": "success"}))
            .is_empty());
        let v = c.violations(
            "todoist-auto-x.json",
            &json!({"status": "done", "done_cert": {"quality_score": 9}}),
        );
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().any(|e| e.starts_with("/status:")), "{v:?}");
        assert!(
            v.iter().any(|e| e.starts_with("/done_cert/quality_score:")),
            "{v:?}"
        );
        let v = c.violations("todoist-auto-x.json", &json!({}));
        assert!(v[0].starts_with("/:") && v[0].contains("status"), "{v:?}");
        // Files no contract covers are not checked.
        assert!(c.violations("news.json", &json!(42)).is_empty());
    }

    #[test]
    fn contract_checks() {
        let ok = Contract {
            files: vec!["a-*.json".into()],
            schema: Some(json!({"type": "object"})),
            schema_file: None,
        };
        assert!(check_all(std::slice::from_ref(&ok)).is_ok());
        let mut bad = ok.clone();
        bad.files = vec!["../x.json".into()];
        assert_eq!(
            check_all(&[bad]).unwrap_err().field.as_deref(),
            Some("contracts[0].files")
        );
        let mut bad = ok.clone();
        bad.schema = Some(json!({"type": "no-such-type"}));
        let e = check_all(&[bad]).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("contracts[0].schema"));
        assert!(
            e.message.contains("not a valid JSON Schema"),
            "{}",
            e.message
        );
        let mut bad = ok.clone();
        bad.schema = None;
        assert!(check_all(&[bad]).is_err());
        let mut bad = ok;
        bad.schema = None;
        bad.schema_file = Some("/etc/schema.json".into());
        assert!(check_all(&[bad]).is_err());
    }

    #[tokio::test]
    async fn schema_files_load_relative_to_the_graph() {
        let files = crate::inputs::Mem(
            [
                (
                    "contracts/a.schema.json",
                    r#"{"type": "object", "required": ["status"]}"#,
                ),
                ("contracts/bad.json", "{not json"),
            ]
            .into(),
        );
        let mut c = Contract {
            files: vec!["a.json".into()],
            schema: None,
            schema_file: Some("contracts/a.schema.json".into()),
        };
        load(&mut c, &files).await.unwrap();
        assert_eq!(c.schema.as_ref().unwrap()["required"], json!(["status"]));
        let compiled = Contracts::compile(&[c]).unwrap();
        assert_eq!(compiled.violations("a.json", &json!({})).len(), 1);
        let mut bad = Contract {
            files: vec!["a.json".into()],
            schema: None,
            schema_file: Some("contracts/bad.json".into()),
        };
        let e = load(&mut bad, &files).await.unwrap_err();
        assert!(e.contains("not JSON"), "{e}");
    }
}
