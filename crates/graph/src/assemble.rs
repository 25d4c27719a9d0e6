//! The `assemble` node's spec: which result files a phase run expects, where the counters
//! and the report go. Judging the results is the orchestrator's.

use serde::{Deserialize, Serialize};

use crate::contract::check_result_name;
use crate::Template;

/// The `assemble` node (docs/phases.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssembleSpec {
    /// The plan's result file (under the run's results/); decides which results are expected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Template>,
    /// Result files expected whatever the plan (the digest's fetch results).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<Template>,
    /// Name of a tasks plan's results; `{rank}` is the task's rank.
    #[serde(default = "default_task_results")]
    pub task_results: String,
    /// Name of an auto plan's results; `{key}` is the task key.
    #[serde(default = "default_auto_results")]
    pub auto_results: String,
    /// Counters document to count auto successes in (default: the one the plan names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Template>,
    /// Where the Markdown report goes (default `docs/<run_id>/<node>.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<Template>,
}

fn default_task_results() -> String {
    "todoist-result-{rank}.json".into()
}

fn default_auto_results() -> String {
    "todoist-auto-{key}.json".into()
}

impl AssembleSpec {
    pub fn check(&self) -> Result<(), (String, String)> {
        for (field, pattern, hole) in [
            ("task_results", &self.task_results, "{rank}"),
            ("auto_results", &self.auto_results, "{key}"),
        ] {
            if !pattern.contains(hole) {
                return Err((field.into(), format!("`{pattern}` must contain `{hole}`")));
            }
            check_result_name(&pattern.replace(hole, "x")).map_err(|m| (field.into(), m))?;
        }
        if self.plan.is_none() && self.results.is_empty() {
            return Err((
                "plan".into(),
                "set `plan` (the plan's result file) or `results` (files to read), or both".into(),
            ));
        }
        Ok(())
    }

    pub fn templates_mut(&mut self) -> Vec<(String, &mut Template)> {
        let mut out: Vec<(String, &mut Template)> = Vec::new();
        if let Some(t) = &mut self.plan {
            out.push(("plan".into(), t));
        }
        for (i, t) in self.results.iter_mut().enumerate() {
            out.push((format!("results[{i}]"), t));
        }
        if let Some(t) = &mut self.counters {
            out.push(("counters".into(), t));
        }
        if let Some(t) = &mut self.report {
            out.push(("report".into(), t));
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn spec_checks() {
        let mut s = AssembleSpec {
            plan: Some(Template::literal("plan.json")),
            results: vec![],
            task_results: default_task_results(),
            auto_results: default_auto_results(),
            counters: None,
            report: None,
        };
        assert!(s.check().is_ok());
        s.auto_results = "todoist-auto.json".into();
        assert_eq!(s.check().unwrap_err().0, "auto_results");
        s.auto_results = "../{key}.json".into();
        assert_eq!(s.check().unwrap_err().0, "auto_results");
        s.auto_results = default_auto_results();
        s.plan = None;
        assert_eq!(s.check().unwrap_err().0, "plan");
    }
}
