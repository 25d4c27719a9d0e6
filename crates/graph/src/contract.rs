//! Result contracts as graphs declare them (`contracts:`): result file globs under the run's
//! `results/` and their JSON Schemas, checked and compiled here; which result names and
//! outputs a node with `result:` has. Writing and judging results is the orchestrator's.

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::GraphError;

/// The outputs every node with `result:` has besides its own.
pub const RESULT_OUTPUTS: &[&str] = &["result", "result_path", "result_status"];

/// keys are compared in their underscore form.
pub fn normalize_key(key: &str) -> String {
    key.replace('-', "_")
}

/// A result file name: a relative path ending in `.json` that pathguard accepts.
pub fn check_result_name(name: &str) -> Result<(), String> {
    pathguard::validate(name).map_err(|rej| format!("`{name}`: {rej}"))?;
    if !name.ends_with(".json") {
        return Err(format!(
            "`{name}`: a result file is JSON and its name ends in `.json`"
        ));
    }
    Ok(())
}

/// Most schema errors reported for one result.
const MAX_REPORTED_ERRORS: usize = 8;

/// One contract of the graph's `contracts:` list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    /// Result file names it covers: globs relative to the run's `results/` (`todoist-auto-*.json`).
    #[serde(deserialize_with = "one_or_many")]
    pub files: Vec<String>,
    /// The JSON Schema (inline, or loaded from `schema_file` at submit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// A schema file relative to the graph's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_file: Option<String>,
}

fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

pub fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::validator_for(schema).map_err(|e| format!("not a valid JSON Schema: {e}"))
}

fn glob(pattern: &str) -> Result<Glob, String> {
    if pattern.is_empty()
        || pattern.starts_with('/')
        || pattern.contains('\\')
        || pattern
            .split('/')
            .any(|c| c == ".." || c == "." || c.is_empty())
    {
        return Err(format!(
            "`{pattern}` must be a relative name under results/ (a glob such as `todoist-auto-*.json`)"
        ));
    }
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| format!("`{pattern}` is not a valid glob: {e}"))
}

/// Graph validation of `contracts:` (a schema file is checked when it is loaded).
pub fn check_all(contracts: &[Contract]) -> Result<(), GraphError> {
    let err = |i: usize, field: &str, message: String| GraphError {
        position: None,
        node: None,
        field: Some(format!("contracts[{i}].{field}")),
        message,
    };
    for (i, c) in contracts.iter().enumerate() {
        if c.files.is_empty() {
            return Err(err(
                i,
                "files",
                "name at least one result file (glob)".into(),
            ));
        }
        for f in &c.files {
            glob(f).map_err(|m| err(i, "files", m))?;
        }
        match (&c.schema, &c.schema_file) {
            (None, None) => {
                return Err(err(
                    i,
                    "schema",
                    "set `schema` (inline JSON Schema) or `schema_file` (relative to the graph)"
                        .into(),
                ))
            }
            (Some(s), _) => {
                compile(s).map_err(|m| err(i, "schema", m))?;
            }
            (None, Some(f)) => {
                pathguard::validate(f)
                    .map_err(|rej| err(i, "schema_file", format!("`{f}`: {rej}")))?;
            }
        }
    }
    Ok(())
}

/// The graph's contracts, compiled.
pub struct Contracts {
    entries: Vec<(GlobSet, jsonschema::Validator, String)>,
}

impl Contracts {
    pub fn compile(contracts: &[Contract]) -> Result<Contracts, String> {
        let mut entries = Vec::with_capacity(contracts.len());
        for (i, c) in contracts.iter().enumerate() {
            let mut set = GlobSetBuilder::new();
            for f in &c.files {
                set.add(glob(f)?);
            }
            let set = set.build().map_err(|e| e.to_string())?;
            let schema = c.schema.as_ref().ok_or_else(|| {
                format!(
                    "contracts[{i}]: schema_file {:?} was not loaded at submit",
                    c.schema_file.as_deref().unwrap_or("")
                )
            })?;
            let label = c
                .schema_file
                .clone()
                .unwrap_or_else(|| format!("contracts[{i}]"));
            entries.push((set, compile(schema)?, label));
        }
        Ok(Contracts { entries })
    }

    /// Whether some contract covers result file `name`.
    pub fn covers(&self, name: &str) -> bool {
        self.entries.iter().any(|(set, _, _)| set.is_match(name))
    }

    /// The violations of `doc` against every contract covering `name` (empty = valid or no
    /// contract). Each names the place in the document and the schema it broke.
    pub fn violations(&self, name: &str, doc: &Value) -> Vec<String> {
        let mut out = Vec::new();
        for (set, validator, label) in &self.entries {
            if !set.is_match(name) {
                continue;
            }
            for e in validator.iter_errors(doc) {
                if out.len() == MAX_REPORTED_ERRORS {
                    out.push("(more errors not shown)".into());
                    return out;
                }
                let at = e.instance_path().to_string();
                let at = if at.is_empty() { "/".to_owned() } else { at };
                out.push(format!("{at}: {e} ({label})"));
            }
        }
        out
    }
}
