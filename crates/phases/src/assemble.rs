//! Reading phase results: the `assemble` node's spec and the rules every result
//! is judged by. The node itself is nodes/assemble.rs.
//!
//! - A result that does not exist is `failed`; for an auto plan the expected keys come
//!   from the plan's `auto_tasks.selected_tasks`, for a tasks plan from `tasks[].rank`.
//! - A fail-safe placeholder (`placeholder: true`) is `failed` with its reason.
//! - A result its contract refuses is `failed` with the violations.
//! - `success`, `partial`, `failed`, `no_changes` mean what docs/phases.md says; `no_changes` counts as success.
//!   Anything else is `failed` (unknown status).
//! - File names and keys are compared with `-` read as `_`.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value};

use crate::contracts::Contracts;
use crate::normalize_key;

pub use cairn_graph::assemble::AssembleSpec;

/// The four statuses of a phase result.
pub const STATUSES: &[&str] = &["success", "partial", "failed", "no_changes"];

/// How one result reads.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// The expected file name (under results/).
    pub file: String,
    /// The file actually read (differs by `-`/`_` only), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<Value>,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// What the assemble step does with it: close, comment_partial, comment_failed, count, none.
    pub action: String,
}

/// Judges one result document (None = the file does not exist).
pub fn judge(
    name: &str,
    bytes: Option<&[u8]>,
    contracts: &Contracts,
) -> (String, Option<String>, Option<String>) {
    let failed = |why: String| ("failed".to_owned(), Some(why), None);
    let Some(bytes) = bytes else {
        return failed("missing: the result was never written".into());
    };
    let doc: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return failed(format!("not JSON: {e}")),
    };
    let Some(obj) = doc.as_object() else {
        return failed("not a JSON object".into());
    };
    let text = |k: &str| obj.get(k).and_then(Value::as_str).map(str::to_owned);
    if obj.get("placeholder").and_then(Value::as_bool) == Some(true) {
        let why = text("error").unwrap_or_else(|| "fail-safe placeholder".into());
        return failed(format!("no result: {why}"));
    }
    let violations = contracts.violations(name, &doc);
    if !violations.is_empty() {
        return failed(format!("schema violation: {}", violations.join("; ")));
    }
    let summary = text("summary").filter(|s| !s.is_empty());
    match text("status") {
        Some(s) if STATUSES.contains(&s.as_str()) => {
            let reason = if s == "failed" || s == "partial" {
                text("error").filter(|e| !e.is_empty())
            } else {
                None
            };
            (s, reason, summary)
        }
        Some(s) => (
            "failed".into(),
            Some(format!(
                "unknown status `{s}`; expected success, partial, failed or no_changes"
            )),
            summary,
        ),
        None => ("failed".into(), Some("no `status` field".into()), summary),
    }
}

/// The handling of each status for a tasks plan (Todoist tasks) and an auto plan (counters).
pub fn action(plan_type: &str, status: &str) -> &'static str {
    match (plan_type, status) {
        ("tasks", "success") => "close",
        ("tasks", "partial") => "comment_partial",
        ("tasks", "failed") => "comment_failed",
        ("auto", "success" | "no_changes") => "count",
        _ => "none",
    }
}

/// Which result file answers for expected `name`: the exact name, else one that differs only by
/// `-`/`_`.
pub fn find<'a>(name: &str, present: &'a BTreeMap<String, String>) -> Option<&'a String> {
    present.get(&normalize_key(name))
}

/// Index of present file names by their normalised form; an exact name wins over a look-alike.
pub fn index(names: impl IntoIterator<Item = String>) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for n in names {
        let norm = normalize_key(&n);
        let exact = norm == n;
        match out.get(&norm) {
            Some(existing) if *existing == norm => {}
            Some(_) if !exact => {}
            _ => {
                out.insert(norm, n);
            }
        }
    }
    out
}

/// The overall status: success when every result succeeded (or had no changes), failed when
/// none did, partial otherwise; with nothing expected, no_changes.
pub fn overall(verdicts: &[Verdict]) -> &'static str {
    if verdicts.is_empty() {
        return "no_changes";
    }
    let ok = verdicts
        .iter()
        .filter(|v| v.status == "success" || v.status == "no_changes")
        .count();
    if ok == verdicts.len() {
        "success"
    } else if ok == 0 && verdicts.iter().all(|v| v.status == "failed") {
        "failed"
    } else {
        "partial"
    }
}

/// Counts per status.
pub fn tally(verdicts: &[Verdict]) -> Value {
    let n = |s: &str| verdicts.iter().filter(|v| v.status == s).count();
    json!({"success": n("success"), "partial": n("partial"), "failed": n("failed"), "no_changes": n("no_changes")})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::Contract;

    fn contracts() -> Contracts {
        Contracts::compile(&[Contract {
            files: vec!["todoist-auto-*.json".into()],
            schema: Some(json!({"type": "object", "required": ["status", "summary"]})),
            schema_file: None,
        }])
        .unwrap()
    }

    fn j(name: &str, v: Value) -> (String, Option<String>, Option<String>) {
        judge(name, Some(v.to_string().as_bytes()), &contracts())
    }

    #[test]
    fn missing_results_are_failed() {
        let (s, why, _) = judge("todoist-result-1.json", None, &contracts());
        assert_eq!(s, "failed");
        assert!(why.unwrap().starts_with("missing"));
    }

    #[test]
    fn statuses_follow_seed_004() {
        for s in STATUSES {
            assert_eq!(j("x.json", json!({"status": s})).0, *s);
        }
        let (s, why, _) = j("x.json", json!({"status": "done"}));
        assert_eq!(s, "failed");
        assert!(why.unwrap().contains("unknown status `done`"));
        let (s, why, _) = j("x.json", json!({"summary": "?"}));
        assert_eq!(
            (s.as_str(), why.as_deref()),
            ("failed", Some("no `status` field"))
        );
        let (_, why, summary) = j(
            "x.json",
            json!({"status": "partial", "error": "2 of 3", "summary": "half"}),
        );
        assert_eq!(
            (why.as_deref(), summary.as_deref()),
            (Some("2 of 3"), Some("half"))
        );
        assert_eq!(j("x.json", json!([1])).0, "failed");
        let (s, why, _) = judge("x.json", Some(b"{oops"), &contracts());
        assert_eq!(s, "failed");
        assert!(why.unwrap().starts_with("not JSON"));
    }

    #[test]
    fn placeholders_and_schema_violations_are_failed_with_the_reason() {
        let (s, why, _) = j(
            "todoist-auto-a.json",
            json!({"status": "failed", "placeholder": true, "error": "node `a` finished without a result"}),
        );
        assert_eq!(s, "failed");
        assert!(why.unwrap().contains("node `a` finished without a result"));
        // success claimed, but the contract requires `summary`.
        let (s, why, _) = j("todoist-auto-a.json", json!({"status": "success"}));
        assert_eq!(s, "failed");
        let why = why.unwrap();
        assert!(
            why.starts_with("schema violation") && why.contains("summary"),
            "{why}"
        );
        // The same document under a name no contract covers is fine.
        assert_eq!(j("news.json", json!({"status": "success"})).0, "success");
    }

    #[test]
    fn names_match_with_hyphens_read_as_underscores() {
        let present = index([
            "todoist-auto-tech-research.json".to_owned(),
            "todoist-auto-log_audit.json".to_owned(),
        ]);
        assert_eq!(
            find("todoist-auto-tech_research.json", &present).unwrap(),
            "todoist-auto-tech-research.json"
        );
        assert_eq!(
            find("todoist-auto-log-audit.json", &present).unwrap(),
            "todoist-auto-log_audit.json"
        );
        assert!(find("todoist-auto-other.json", &present).is_none());
        // An exact underscore name wins over a look-alike, in any order.
        for order in [["a-b.json", "a_b.json"], ["a_b.json", "a-b.json"]] {
            let present = index(order.map(str::to_owned));
            assert_eq!(find("a_b.json", &present).unwrap(), "a_b.json");
        }
    }

    #[test]
    fn actions_and_overall_status() {
        assert_eq!(action("tasks", "success"), "close");
        assert_eq!(action("tasks", "no_changes"), "none");
        assert_eq!(action("tasks", "partial"), "comment_partial");
        assert_eq!(action("auto", "no_changes"), "count");
        assert_eq!(action("auto", "failed"), "none");
        let v = |s: &str| Verdict {
            file: "f".into(),
            found: None,
            key: None,
            rank: None,
            status: s.into(),
            reason: None,
            summary: None,
            action: "none".into(),
        };
        assert_eq!(overall(&[]), "no_changes");
        assert_eq!(overall(&[v("success"), v("no_changes")]), "success");
        assert_eq!(overall(&[v("success"), v("failed")]), "partial");
        assert_eq!(overall(&[v("partial")]), "partial");
        assert_eq!(overall(&[v("failed"), v("failed")]), "failed");
        assert_eq!(tally(&[v("failed"), v("success")])["failed"], 1);
    }
}
