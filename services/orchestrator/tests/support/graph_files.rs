//! What `cairn run` sends with a graph file: the files it names (kept apart from common/,
//! which the console's tests share without the phases crate).
#![allow(dead_code, clippy::unwrap_used)]

/// What `cairn run` sends with the graph in `dir/graph.yaml`: the files it names, read from
/// `dir` (the orchestrator never reads its host's files).
pub async fn graph_files(dir: &std::path::Path) -> Vec<cairn_proto::v1::InputFile> {
    let yaml = std::fs::read_to_string(dir.join("graph.yaml")).unwrap();
    let graph =
        cairn_graph::Graph::from_yaml(&yaml, "run", &std::collections::BTreeMap::new()).unwrap();
    cairn_phases::inputs::collect(dir, &graph).await.unwrap()
}
