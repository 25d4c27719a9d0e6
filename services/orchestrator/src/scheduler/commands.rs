//! A live run's answers to the outside world: info, gate decisions, rework, cancel and the
//! human events recorded in order with the run's own.

use std::collections::HashSet;

use cairn_proto::v1 as pb;
use serde_json::{json, Value};

use super::{Command, Driver};
use crate::error::{Error, Result};
use crate::gates::{self, Decision};
use crate::nodes;
use crate::run::{EventView, NodeState, TaskState};
use cairn_graph::{ErrorKind, NodeKind};
use cairn_node::events::{self as ev, now, Ev};

impl Driver {
    pub(super) async fn command(&mut self, c: Command) {
        match c {
            Command::Info(reply) => {
                let _ = reply.send(self.info());
            }
            Command::Decide {
                gate,
                decision,
                by,
                note,
                note_ref,
                at,
                recorded,
                reply,
            } => {
                let r = self
                    .decide(
                        &gate,
                        decision,
                        &by,
                        &note,
                        note_ref.as_deref(),
                        &at,
                        recorded.as_ref(),
                    )
                    .await;
                let _ = reply.send(r);
            }
            Command::Rework {
                node,
                by,
                note,
                note_ref,
                from_snapshot,
                reply,
            } => {
                let r = self
                    .rework(&node, &by, &note, note_ref.as_deref(), from_snapshot)
                    .await;
                let _ = reply.send(r);
            }
            Command::Cancel { by, reason, reply } => {
                if self.state.state.is_final() {
                    let _ = reply.send(Ok(self.info()));
                    return;
                }
                if self.canceling.is_none() {
                    self.canceling =
                        Some((if by.is_empty() { "human".into() } else { by }, reason));
                    self.cancel_running(None);
                }
                self.cancel_replies.push(reply);
            }
            Command::Record { event, reply } => {
                let ts = now();
                self.state.apply(&EventView::live(&event, &ts));
                self.dirty = true;
                let r = self
                    .rec
                    .record(&event)
                    .await
                    .map_err(|e| Error::Unavailable(e.to_string()));
                let _ = reply.send(r);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn decide(
        &mut self,
        gate: &str,
        d: Decision,
        by: &str,
        note: &str,
        note_ref: Option<&str>,
        at: &str,
        recorded: Option<&gates::Recorded>,
    ) -> Result<pb::RunInfo> {
        if self.state.state.is_final() || self.canceling.is_some() || self.failing.is_some() {
            return Err(Error::FailedPrecondition(format!(
                "run {} is {}; its gates can no longer be decided",
                self.state.run_id,
                if self.canceling.is_some() {
                    "being canceled"
                } else if self.failing.is_some() {
                    "failing"
                } else {
                    self.state.state.as_str()
                }
            )));
        }
        gates::check_decidable(&self.state, gate)?;
        let by = if by.is_empty() { "human" } else { by };
        let mut event = gates::decision_event(d, gate, by, note, note_ref).with("decided_at", at);
        if let Some(r) = recorded {
            event = event
                .with("replayed_by", r.replayed_by.as_str())
                .with("replay_of", r.replay_of.as_str());
        }
        let decided_at = at.to_owned();
        self.emit(event);
        let (on_reject, resumes) = match self.graph.node(gate).map(|n| &n.kind) {
            Some(NodeKind::Gate(g)) => (g.on_reject, false),
            Some(NodeKind::ExternalAgent(x)) => (x.on_reject, true),
            _ => (cairn_graph::OnReject::Fail, false),
        };
        match (d, on_reject) {
            _ if resumes => {
                // The node asked mid-way: whatever the decision, it runs again and acts on it
                // (resumes its agent, or ends it and fails on a rejection); the fold of the
                // decision made it pending. A fresh retry budget for that phase.
                self.tries.remove(gate);
                if self.state.blocked_gates().next().is_none() && self.failing.is_none() {
                    self.emit(Ev::run(ev::TASK_WORKING).with("by", by));
                }
                if let Some(i) = self.graph.position(gate) {
                    self.consider(i);
                }
            }
            (Decision::Approve, _) | (Decision::Reject, cairn_graph::OnReject::Continue) => {
                let approved = d == Decision::Approve;
                self.emit(Ev::new(ev::NODE_COMPLETED, gate).with(
                    "outputs",
                    Value::Object(nodes::gate::outputs(approved, by, note, &decided_at)),
                ));
                if self.state.blocked_gates().next().is_none() && self.failing.is_none() {
                    self.emit(Ev::run(ev::TASK_WORKING).with("by", by));
                }
                self.after_finish(gate);
            }
            (Decision::Reject, cairn_graph::OnReject::Fail) => {
                let why = format!(
                    "gate `{gate}` rejected by {by}{}",
                    if note.is_empty() {
                        String::new()
                    } else {
                        format!(": {note}")
                    }
                );
                self.emit(
                    Ev::new(ev::NODE_FAILED, gate)
                        .level(pb::Level::Error)
                        .with("error", why.clone())
                        .with("kind", ErrorKind::Refused.as_str())
                        .with("will_retry", false),
                );
                self.fail(why);
            }
        }
        self.rec
            .flush()
            .await
            .map_err(|e| Error::Unavailable(e.to_string()))?;
        Ok(self.info())
    }

    async fn rework(
        &mut self,
        node: &str,
        by: &str,
        note: &str,
        note_ref: Option<&str>,
        from_snapshot: bool,
    ) -> Result<pb::RunInfo> {
        if self.graph.node(node).is_none() {
            return Err(Error::NodeNotFound {
                project: self.state.project.clone(),
                run_id: self.state.run_id.clone(),
                node: node.to_owned(),
                what: "node",
                hint: " (map items are reworked through their map)",
            });
        }
        if self.canceling.is_some() || self.state.state == TaskState::Canceled {
            return Err(Error::FailedPrecondition(format!(
                "run {} is canceled; submit it again instead",
                self.state.run_id
            )));
        }
        let start_from = match from_snapshot {
            false => None,
            true => Some(
                self.state
                    .node(node)
                    .and_then(|n| n.snapshot.clone())
                    .ok_or_else(|| {
                        Error::FailedPrecondition(format!(
                            "node `{node}` of run {} took no session snapshot to start from: only code_delivery nodes with checkpoint_every_s or pause_after_ms take them; rework it without --from-snapshot",
                            self.state.run_id
                        ))
                    })?,
            ),
        };
        let ids = self.graph.downstream(node);
        let set: HashSet<String> = ids.iter().cloned().collect();
        // Attempts of these nodes in flight are abandoned (their completion is ignored).
        let stale: Vec<String> = self
            .running
            .keys()
            .filter(|id| {
                set.contains(*id)
                    || crate::run::split_item(id).is_some_and(|(m, _)| set.contains(m))
            })
            .cloned()
            .collect();
        for id in stale {
            if let Some(r) = self.running.remove(&id) {
                r.cancel.cancel();
                self.task_ids.remove(&r.task);
                if crate::run::split_item(&id).is_none() {
                    self.running_nodes = self.running_nodes.saturating_sub(1);
                }
            }
        }
        for id in &ids {
            if let Some(i) = self.graph.position(id) {
                self.ready.remove(&i);
            }
            if self.maps.remove(id).is_some() {
                self.running_nodes = self.running_nodes.saturating_sub(1);
            }
            self.tries.remove(id);
            self.waiting_retry.remove(id);
        }
        self.retry_at.retain(|_, id| {
            !set.contains(id) && !crate::run::split_item(id).is_some_and(|(m, _)| set.contains(m))
        });
        self.tries
            .retain(|id, _| !crate::run::split_item(id).is_some_and(|(m, _)| set.contains(m)));
        let by = if by.is_empty() { "human" } else { by };
        let mut e = Ev::new(ev::REWORK_REQUESTED, node)
            .with("target", node)
            .with("by", by)
            .with("note", note)
            .with("nodes", json!(ids));
        if let Some(r) = note_ref {
            e = e.with("note_ref", r);
        }
        if let Some(from) = start_from {
            e = e.with("from_snapshot", json!(from));
        }
        self.emit(e);
        // A failure caused by a reworked node no longer stands.
        if self.failing.is_some()
            && self
                .state
                .nodes
                .iter()
                .all(|n| n.state != NodeState::Failed)
        {
            self.failing = None;
        }
        if self.state.blocked_gates().next().is_some()
            && self.state.state != TaskState::InputRequired
        {
            self.emit(Ev::run(ev::TASK_INPUT_REQUIRED));
        }
        self.refresh_all();
        self.rec
            .flush()
            .await
            .map_err(|e| Error::Unavailable(e.to_string()))?;
        Ok(self.info())
    }
}
