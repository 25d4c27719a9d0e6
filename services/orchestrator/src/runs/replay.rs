//! Replays and comparisons of runs: `ReplayRun` starts a run of a recorded run's graph whose
//! provider requests are answered from that run's exchange records (cairn_agents::recorded),
//! after checking that the records are there; `DiffRuns` loads two runs' records and hands
//! them to `compare.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_agents::records::EXCHANGES_DIR;
use cairn_proto::v1 as pb;
use serde_json::Value;

use super::{check_id, Runs, Submit};
use crate::error::{Error, Result};
use crate::gates::{Decision, Recorded};
use crate::rundir::RunDir;
use cairn_run_diff::{self as compare, FileSeen, Side};

/// Event types of a node that made provider requests (an `agent.started` with an `adapter`
/// is an external agent's turn instead).
const PROVIDER_EVENTS: &[&str] = &["agent.started", "code_delivery.started"];

/// A gate decision of the recorded run.
struct GateDecision {
    gate: String,
    decision: Decision,
    by: String,
    note: String,
    recorded: Recorded,
}

fn event_data(e: &pb::Event) -> serde_json::Map<String, Value> {
    match serde_json::from_str(&e.data_json) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    }
}

/// The recorded run's gate decisions in order, each with when it was made (the event's
/// `decided_at`; in runs recorded before events carried it, the gate's `decided_at` output,
/// else the event's time).
fn recorded_decisions(events: &[pb::Event], source: &str, replayed_by: &str) -> Vec<GateDecision> {
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let decision = match e.r#type.as_str() {
            "gate.approved" => Decision::Approve,
            "gate.rejected" => Decision::Reject,
            _ => continue,
        };
        let d = event_data(e);
        let text = |k: &str| {
            d.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let decided_at = d
            .get("decided_at")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| {
                events[i..]
                    .iter()
                    .find(|x| x.node_id == e.node_id && x.r#type == "node.completed")
                    .and_then(|x| {
                        event_data(x)
                            .get("outputs")
                            .and_then(|o| o.get("decided_at"))
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                    })
            })
            .unwrap_or_else(|| e.ts.clone());
        out.push(GateDecision {
            gate: text("gate_id"),
            decision,
            by: text("by"),
            note: text("note"),
            recorded: Recorded {
                decided_at,
                replayed_by: replayed_by.to_owned(),
                replay_of: source.to_owned(),
            },
        });
    }
    out
}

/// The recorded decisions a replay has not taken yet: per gate, its first decisions are
/// those the replay's own events (`taken`) show already made there.
fn remaining_decisions(recorded: Vec<GateDecision>, taken: &[pb::Event]) -> Vec<GateDecision> {
    let mut made: BTreeMap<String, usize> = BTreeMap::new();
    for e in taken {
        if matches!(e.r#type.as_str(), "gate.approved" | "gate.rejected") {
            let gate = event_data(e)
                .get("gate_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            *made.entry(gate).or_default() += 1;
        }
    }
    recorded
        .into_iter()
        .filter(|d| match made.get_mut(&d.gate) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .collect()
}

impl Runs {
    /// Starts the replay `req` describes (`replay_of`: the recorded run, same project):
    /// `vars` replace recorded variables, `graph_yaml` (with `files`) replaces the recorded
    /// graph, `live_*` say what runs live.
    pub async fn replay(self: &Arc<Self>, req: Submit) -> Result<pb::RunInfo> {
        let (project, source, by) = (
            req.project_id.clone(),
            req.replay_of.clone(),
            req.by.clone(),
        );
        let (project, source, by) = (project.as_str(), source.as_str(), by.as_str());
        check_id("project_id", project)?;
        check_id("run_id", source)?;
        if !req.llm.is_empty() && !req.live_after {
            return Err(Error::field(
                "llm",
                "llm names the provider a replay goes on to after a divergence: set live_after too (--live-after), or leave llm empty",
            ));
        }
        let events = self
            .b
            .store
            .read_events(project, source, 1)
            .await
            .map_err(Error::store(format!("reading the events of {source}")))?;
        if events.is_empty() {
            return Err(Error::RunNotFound {
                project: project.to_owned(),
                run_id: source.to_owned(),
            });
        }
        // Going on live covers what the records lack; otherwise every node that asked a
        // provider needs its records.
        if !req.live_after {
            self.check_records(project, source, &events, req.live_sandbox)
                .await?;
        }
        let live_gates = req.live_gates;
        let info = self.submit(req).await?;
        let decisions = recorded_decisions(&events, source, by);
        if !live_gates && !decisions.is_empty() {
            let runs = self.clone();
            let (project, run) = (project.to_owned(), info.run_id.clone());
            tokio::spawn(async move { runs.take_decisions(&project, &run, decisions).await });
        }
        Ok(info)
    }

    /// After replay `run` came back to life on this orchestrator (a restart, a failover):
    /// goes on taking the recorded run's gate decisions, less those the replay took already,
    /// unless its gates are live. Whoever drives a replay takes its recorded decisions.
    pub(super) async fn take_remaining_decisions(
        &self,
        project: &str,
        run: &str,
        llm: &str,
        created_by: &str,
    ) {
        let Some(spec) = cairn_agents::recorded::ReplaySpec::parse(llm) else {
            return;
        };
        if spec.live_gates {
            return;
        }
        let read = |id: String| async move {
            self.b
                .store
                .read_events(project, &id, 1)
                .await
                .map_err(|e| tracing::warn!(run, source = %id, error = %e, "a resumed replay could not read events; its gates wait for people"))
                .ok()
        };
        let (Some(source), Some(taken)) =
            (read(spec.source.clone()).await, read(run.to_owned()).await)
        else {
            return;
        };
        let decisions = remaining_decisions(
            recorded_decisions(&source, &spec.source, created_by),
            &taken,
        );
        if !decisions.is_empty() {
            self.take_decisions(project, run, decisions).await;
        }
    }

    /// Decides each gate of replay `run` as it blocks, with the recorded decisions in order,
    /// until the run ends. A gate without a recorded decision is left for people.
    /// (Boxed: deciding may bring the run to life, which may start this again elsewhere.)
    fn take_decisions<'a>(
        &'a self,
        project: &'a str,
        run: &'a str,
        mut decisions: Vec<GateDecision>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            let key = format!("{project}/{run}");
            if !self
                .deciding
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.clone())
            {
                return;
            }
            struct Done<'a>(&'a Runs, String);
            impl Drop for Done<'_> {
                fn drop(&mut self) {
                    let mut d = self.0.deciding.lock().unwrap_or_else(|e| e.into_inner());
                    d.remove(&self.1);
                }
            }
            let _done = Done(self, key);
            loop {
                // A stopped orchestrator decides nothing: whoever resumes the replay goes on.
                if self.shutdown.is_cancelled() {
                    return;
                }
                let Ok(info) = self.get(project, run).await else {
                    return;
                };
                let state = pb::TaskState::try_from(info.state).unwrap_or_default();
                if matches!(
                    state,
                    pb::TaskState::Completed | pb::TaskState::Failed | pb::TaskState::Canceled
                ) || decisions.is_empty()
                {
                    return;
                }
                for g in info
                    .gates
                    .iter()
                    .filter(|g| g.state == pb::GateState::Blocked as i32)
                {
                    let Some(i) = decisions.iter().position(|d| d.gate == g.id) else {
                        continue;
                    };
                    let d = decisions.remove(i);
                    if let Err(e) = self
                        .decide_as(
                            project,
                            run,
                            &d.gate,
                            d.decision,
                            &d.by,
                            &d.note,
                            Some(d.recorded),
                        )
                        .await
                    {
                        tracing::warn!(run, gate = %g.id, error = %e, "replay could not take a recorded gate decision");
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
    }

    /// Every node of `source` that asked a provider has exchange records, and (unless
    /// `live_sandbox`) every external agent node turn records; the message lists the missing
    /// ones (a run recorded before complete records has none).
    async fn check_records(
        &self,
        project: &str,
        source: &str,
        events: &[pb::Event],
        live_sandbox: bool,
    ) -> Result<()> {
        let dir = RunDir::new(source);
        // (node, the records directory, what it holds)
        let mut needed: Vec<(String, String, &str)> = Vec::new();
        for e in events {
            if !PROVIDER_EVENTS.contains(&e.r#type.as_str())
                || needed.iter().any(|(n, _, _)| *n == e.node_id)
            {
                continue;
            }
            let d = event_data(e);
            let instance = d
                .get("agent_instance")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| e.node_id.replace('.', "-"));
            if d.contains_key("adapter") {
                // An external agent: its turns run again with live sandbox steps.
                if !live_sandbox {
                    let prefix = dir.agent(&instance, cairn_node::layout::AGENT_TURNS_DIR);
                    needed.push((e.node_id.clone(), prefix, "external agent turns"));
                }
            } else {
                let prefix = dir.agent(&e.node_id.replace('.', "-"), EXCHANGES_DIR);
                needed.push((e.node_id.clone(), prefix, ""));
            }
        }
        if needed.is_empty() {
            return Ok(());
        }
        // One listing of every agent's records (files only, at any depth: a turn's records
        // are one directory each), however many nodes asked.
        let agents = dir.path("agents");
        let agents = agents.trim_end_matches('/');
        let files = self
            .b
            .store
            .list(project, agents, true)
            .await
            .map_err(Error::store(format!("listing {agents}/")))?;
        let files: Vec<&str> = files
            .iter()
            .filter(|e| e.kind == pb::EntryKind::File as i32)
            .map(|e| e.path.as_str())
            .collect();
        let mut missing = Vec::new();
        for (node, prefix, what) in &needed {
            let under = format!("{}/", prefix.trim_end_matches('/'));
            if !files.iter().any(|f| f.starts_with(&under)) {
                missing.push(if what.is_empty() {
                    format!("{prefix}/ (node `{node}`)")
                } else {
                    format!("{prefix}/ (node `{node}`, {what})")
                });
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::FailedPrecondition(format!(
            "run {source} cannot be replayed: its provider exchanges or external agent turns are not recorded (it ran before cairn recorded them, or they were deleted); missing: {}; re-run it live with `cairn runs rerun {source}` instead (or replay external agents live with --sandbox live)",
            missing.join(", ")
        )))
    }

    /// One run's records as the comparison reads them.
    async fn side(&self, project: &str, run_id: &str) -> Result<Side> {
        let (graph, _, state) = self.read_records(project, run_id).await?;
        let store = &self.b.store;
        let events = store
            .read_events(project, run_id, 1)
            .await
            .map_err(Error::store(format!("reading the events of {run_id}")))?;
        let mut vars = BTreeMap::new();
        if let Some(e) = events.iter().find(|e| e.r#type == "task.created") {
            if let Ok(Value::Object(d)) = serde_json::from_str::<Value>(&e.data_json) {
                if let Some(Value::Object(v)) = d.get("vars") {
                    for (k, x) in v {
                        let text = x.as_str().map_or_else(|| x.to_string(), str::to_owned);
                        vars.insert(k.clone(), text);
                    }
                }
            }
        }
        let mut files = BTreeMap::new();
        for (path, sha256) in compare::written_paths(&events) {
            let bytes = match store
                .get_at_most(project, &path, compare::MAX_DIFF_BYTES as u64)
                .await
            {
                Ok(b) => b.map(|b| b.to_vec()),
                Err(s) if s.code() == tonic::Code::ResourceExhausted => None,
                Err(s) => return Err(Error::store(format!("reading {path}"))(s)),
            };
            files.insert(path, FileSeen { sha256, bytes });
        }
        Ok(Side {
            run_id: run_id.to_owned(),
            state: state.state.as_str().to_owned(),
            error: state.error.clone().unwrap_or_default(),
            graph,
            vars,
            events,
            files,
        })
    }

    /// The comparison of two runs of `project`, and `b`'s verdict as a replay of `a`.
    pub async fn diff(&self, project: &str, a: &str, b: &str) -> Result<(Value, Value)> {
        let (sa, sb) = (self.side(project, a).await?, self.side(project, b).await?);
        let report = compare::diff(&sa, &sb);
        let verdict = compare::verdict(&sa, &sb, &report);
        Ok((report, verdict))
    }
}
