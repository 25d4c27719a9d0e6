//! A map node's life in its run's driver: its items listed (or read back on a resume), started
//! within its parallelism as they come up, and the map completed once every item has ended.

use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::{json, Value};

use super::{Driver, MapRun};
use crate::nodes::{self, NodeError, Scope};
use crate::run::NodeState;
use cairn_graph::Node;
use cairn_node::events::{self as ev, Ev};

impl Driver {
    pub(super) async fn start_map(
        &mut self,
        node: &Node,
        spec: &cairn_graph::MapNode,
        scope: &Scope,
    ) -> std::result::Result<(), NodeError> {
        let attempt = self.next_attempt(&node.id);
        let existing = self.state.node(&node.id).and_then(|r| r.items.clone());
        let items: Vec<Value> = match &existing {
            // Resumed: the same items as before; finished ones are not redone.
            Some(recorded) => match &recorded.list {
                Some(list) => list.clone(),
                None => match &spec.over {
                    cairn_graph::MapOver::List(l) => l.clone(),
                    _ => {
                        nodes::map::items(&self.b.store, &self.state.project, scope, spec)
                            .await?
                            .0
                    }
                },
            },
            None => {
                let (items, record) =
                    nodes::map::items(&self.b.store, &self.state.project, scope, spec).await?;
                let mut e = Ev::new(ev::MAP_ITEMS, &node.id).with("count", items.len());
                if record {
                    e = e.with("items", Value::Array(items.clone()));
                }
                self.emit(
                    Ev::new(ev::NODE_STARTED, &node.id)
                        .with("node_type", "map")
                        .with("attempt", attempt),
                );
                self.emit(e);
                let pending = (0..items.len()).collect();
                self.maps.insert(
                    node.id.clone(),
                    MapRun {
                        items: Arc::new(items),
                        pending,
                        running: 0,
                        parallelism: spec.parallelism as usize,
                    },
                );
                self.running_nodes += 1;
                self.maybe_finish_map(&node.id);
                return Ok(());
            }
        };
        self.emit(
            Ev::new(ev::NODE_STARTED, &node.id)
                .with("node_type", "map")
                .with("attempt", attempt)
                .with("resumed", true),
        );
        let pending: VecDeque<usize> = existing
            .map(|r| {
                r.records
                    .iter()
                    .enumerate()
                    .filter(|(_, it)| it.state == NodeState::Pending)
                    .map(|(i, _)| i)
                    .collect()
            })
            .unwrap_or_default();
        self.maps.insert(
            node.id.clone(),
            MapRun {
                items: Arc::new(items),
                pending,
                running: 0,
                parallelism: spec.parallelism as usize,
            },
        );
        self.running_nodes += 1;
        self.maybe_finish_map(&node.id);
        Ok(())
    }

    pub(super) fn item_finished(&mut self, map_id: &str) {
        if let Some(mr) = self.maps.get_mut(map_id) {
            mr.running = mr.running.saturating_sub(1);
        }
        self.maybe_finish_map(map_id);
    }

    pub(super) fn maybe_finish_map(&mut self, map_id: &str) {
        let Some(mr) = self.maps.get(map_id) else {
            return;
        };
        if mr.running > 0 || !mr.pending.is_empty() {
            return;
        }
        let Some(rec) = self.state.node(map_id) else {
            return;
        };
        let records = rec
            .items
            .as_ref()
            .map(|i| i.records.clone())
            .unwrap_or_default();
        if records.iter().any(|r| !r.state.is_done()) {
            return; // a failure is being handled
        }
        self.maps.remove(map_id);
        self.running_nodes = self.running_nodes.saturating_sub(1);
        let succeeded = records
            .iter()
            .filter(|r| r.state == NodeState::Succeeded)
            .count();
        let items: Vec<Value> = records.into_iter().map(|r| r.outputs).collect();
        let outputs = json!({"count": items.len(), "succeeded": succeeded, "items": items});
        self.emit(Ev::new(ev::NODE_COMPLETED, map_id).with("outputs", outputs));
        self.after_finish(map_id);
    }
}
