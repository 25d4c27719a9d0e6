//! Delivery targets as graphs write them (`{type: local_dir, path}`, `{type: group|private,
//! id}`, `{type: directory, path}`): the checks made at submit time. Delivering is the
//! orchestrator's business.

use serde_json::Value;

use crate::{Target, Template};

/// A chat id of a `group` / `private` target: a positive number.
pub fn check_chat(kind: &str, id: i64) -> Result<(), String> {
    if id <= 0 {
        return Err(format!("a {kind} id must be a positive number, not {id}"));
    }
    match kind {
        "group" | "private" => Ok(()),
        other => Err(format!(
            "target type `{other}` is not a chat; use group or private"
        )),
    }
}

/// Checks a target at submit time.
pub fn check_deliver_target(t: &Target) -> Result<(), String> {
    match t.kind.as_str() {
        "local_dir" => {
            for k in t.fields.keys() {
                if k != "path" {
                    return Err(format!(
                        "unknown field `{k}` of a local_dir target; it has `path`"
                    ));
                }
            }
            let path = t
                .fields
                .get("path")
                .and_then(Value::as_str)
                .ok_or("a local_dir target needs `path` (a project directory)")?;
            let tpl = Template::parse(path)?;
            if tpl.is_static() {
                let p = path.trim_end_matches('/');
                pathguard::validate_prefix(p).map_err(|rej| format!("`{path}`: {rej}"))?;
            }
            crate::check_write_template(path)
        }
        "group" | "private" => check_chat_target(t),
        other => Err(format!(
            "delivery target type `{other}` is not known; supported: local_dir, group, private"
        )),
    }
}

/// Checks a target at submit time.
pub fn check_code_delivery_target(t: &Target) -> Result<(), String> {
    match t.kind.as_str() {
        "group" | "private" => check_chat_target(t),
        "directory" | "local_dir" => {
            if let Some(k) = t.fields.keys().find(|k| *k != "path") {
                return Err(format!(
                    "unknown field `{k}` of a directory target; it has `path`"
                ));
            }
            let path = t.fields.get("path").and_then(Value::as_str).ok_or(
                "a directory target needs `path` (a directory of the project, e.g. out/{{run_id}})",
            )?;
            let tpl = Template::parse(path)?;
            if tpl.is_static() {
                pathguard::validate_prefix(path.trim_end_matches('/'))
                    .map_err(|rej| format!("`{path}`: {rej}"))?;
            }
            crate::check_write_template(path)
        }
        other => Err(format!(
            "target type `{other}` is not one of group, private, directory"
        )),
    }
}

/// Checks a `group` / `private` target at submit time: one field `id`, a positive integer
/// or a template.
pub fn check_chat_target(t: &Target) -> Result<(), String> {
    for k in t.fields.keys() {
        if k != "id" {
            return Err(format!(
                "unknown field `{k}` of a {} target; it has `id`",
                t.kind
            ));
        }
    }
    match t.fields.get("id") {
        Some(Value::Number(n)) => {
            let id = n
                .as_i64()
                .ok_or_else(|| format!("`{n}` is not a {} id", t.kind))?;
            check_chat(&t.kind, id)
        }
        Some(Value::String(s)) => {
            let tpl = Template::parse(s)?;
            if tpl.refs().next().is_none() {
                let id = s
                    .trim()
                    .parse::<i64>()
                    .map_err(|_| format!("`{s}` is not a {} id (a number)", t.kind))?;
                check_chat(&t.kind, id)?;
            }
            Ok(())
        }
        _ => Err(format!(
            "a {} target needs `id` (the {} number)",
            t.kind,
            if t.kind == "group" { "group" } else { "user" }
        )),
    }
}
