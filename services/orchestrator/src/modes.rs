//! Built-in modes: `single`, `self_critique` and `team` as graphs embedded in
//! the binary (services/orchestrator/graphs/*.yaml), chosen by `SubmitRunRequest.mode`. The
//! prompt becomes `{{vars.prompt}}`; other vars work as for any graph (`reviews` of
//! self_critique, `max_tasks` of team).

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// Most reviews a self_critique run may ask for.
pub const MAX_REVIEWS: u32 = 10;

/// The built-in modes and their graphs.
pub const MODES: [(&str, &str); 3] = [
    ("single", include_str!("../graphs/single.yaml")),
    (
        "self_critique",
        include_str!("../graphs/self_critique.yaml"),
    ),
    ("team", include_str!("../graphs/team.yaml")),
];

/// The names of the built-in modes, comma-separated (for messages).
pub fn names() -> String {
    MODES.map(|(name, _)| name).join(", ")
}

/// A built-in mode ready to submit: its graph and the vars completed for it.
#[derive(Debug)]
pub struct BuiltIn {
    pub graph_yaml: &'static str,
    pub vars: BTreeMap<String, String>,
    /// `<mode>: <the prompt's first line, shortened>`.
    pub title: String,
}

/// Most characters of the prompt in a run title.
const TITLE_PROMPT_CHARS: usize = 60;

/// The graph of `mode` with `prompt` as `vars.prompt`. Refuses an unknown mode (listing the
/// known ones), a request that also carries a graph, and an empty prompt.
pub fn builtin(
    mode: &str,
    prompt: &str,
    graph_yaml: &str,
    vars: &BTreeMap<String, String>,
) -> Result<BuiltIn> {
    let Some((name, yaml)) = MODES.iter().find(|(name, _)| *name == mode.trim()) else {
        return Err(Error::field(
            "mode",
            format!("unknown mode `{mode}`; the built-in modes are: {}", names()),
        ));
    };
    if !graph_yaml.trim().is_empty() {
        return Err(Error::field(
            "graph_yaml",
            format!("both mode `{name}` and graph_yaml were given; send one of them (a mode is a built-in graph)"),
        ));
    }
    let prompt = if prompt.trim().is_empty() {
        vars.get("prompt").map(String::as_str).unwrap_or_default()
    } else {
        prompt
    };
    if prompt.trim().is_empty() {
        return Err(Error::InvalidArgument(format!(
            "mode `{name}` needs a prompt (cairn run --mode {name} --prompt \"...\")"
        )));
    }
    let mut vars = vars.clone();
    vars.insert("prompt".into(), prompt.to_owned());
    if *name == "self_critique" {
        let n = match vars.get("reviews") {
            Some(v) => v.trim().parse::<u32>().ok().filter(|n| (1..=MAX_REVIEWS).contains(n)).ok_or_else(|| {
                Error::field(
                    "vars.reviews",
                    format!("vars.reviews `{v}`: the number of reviews must be a whole number from 1 to {MAX_REVIEWS}"),
                )
            })?,
            None => 2,
        };
        let numbers: Vec<u32> = (1..=n).collect();
        vars.insert("reviews".into(), n.to_string());
        vars.insert(
            "review_numbers".into(),
            serde_json::Value::from(numbers).to_string(),
        );
    }
    let first = prompt.trim().lines().next().unwrap_or_default().trim();
    let mut shown: String = first.chars().take(TITLE_PROMPT_CHARS).collect();
    if shown.len() < first.len() {
        shown.push('…');
    }
    Ok(BuiltIn {
        graph_yaml: yaml,
        vars,
        title: format!("{name}: {shown}"),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use cairn_graph::{Graph, NodeKind};

    fn vars(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn every_mode_is_a_valid_graph() {
        for (name, _) in MODES {
            let b = builtin(name, "build a thing", "", &BTreeMap::new()).unwrap();
            let g = Graph::from_yaml(b.graph_yaml, "run-1", &b.vars)
                .unwrap_or_else(|e| panic!("mode {name}: {e}"));
            assert_eq!(g.mode, name);
            assert_eq!(g.vars.get("prompt").unwrap(), "build a thing");
        }
    }

    #[test]
    fn team_fans_out_with_map() {
        let b = builtin("team", "p", "", &BTreeMap::new()).unwrap();
        let g = Graph::from_yaml(b.graph_yaml, "r", &b.vars).unwrap();
        let maps: Vec<&str> = g
            .nodes
            .iter()
            .filter(|n| matches!(n.kind, NodeKind::Map(_)))
            .map(|n| n.id.as_str())
            .collect();
        assert_eq!(maps, ["tasks", "audits"]);
    }

    #[test]
    fn reviews_become_the_numbers_mapped_over() {
        let b = builtin("self_critique", "p", "", &vars(&[("reviews", "3")])).unwrap();
        assert_eq!(b.vars["review_numbers"], "[1,2,3]");
        let b = builtin("self_critique", "p", "", &BTreeMap::new()).unwrap();
        assert_eq!(b.vars["review_numbers"], "[1,2]");
        for bad in ["0", "11", "two", "-1"] {
            let e = builtin("self_critique", "p", "", &vars(&[("reviews", bad)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains("vars.reviews") && e.contains("1 to 10"), "{e}");
        }
    }

    #[test]
    fn refusals_say_what_to_do() {
        let e = builtin("duo", "p", "", &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown mode `duo`") && e.contains("single, self_critique, team"));
        let e = builtin("single", "p", "version: 1\nnodes: []", &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("both mode `single` and graph_yaml"), "{e}");
        let e = builtin("team", "  ", "", &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a prompt"), "{e}");
        let long = "x".repeat(100) + "\nsecond line";
        let t = builtin("single", &long, "", &BTreeMap::new())
            .unwrap()
            .title;
        assert_eq!(t, format!("single: {}…", "x".repeat(60)));
        // The prompt may come as a var too.
        let b = builtin("single", "", "", &vars(&[("prompt", "hi")])).unwrap();
        assert_eq!(b.vars["prompt"], "hi");
    }
}
