//! The recorded provider of a replay: answers each request of a node attempt from the
//! exchange the recorded run made at the same node, attempt, turn and step (records.rs),
//! after checking that the request hashes to the recorded request's hash. It never calls a
//! model: a replay runs with every provider unreachable. A missing record, a damaged one or
//! a different request ends the request with an error saying which, unless the replay goes
//! on live after a divergence (`live_after`): then that request and every later one of the
//! attempt go to the live provider, and the divergence is reported once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use tonic::Code;

use super::records::{self, RecordError, RUN_ID_MARK};
use super::{AgentError, AgentReply, AgentRequest, AttemptObserver, NoObserver, Provider};
use cairn_store_client::Store;

/// The `llm` setting of a replay run: `recorded:<source run id>`, with `#sandbox=live`
/// and/or `#gates=live` when those run live, and last `#live_after=<provider setting>` when
/// the replay goes on live after a divergence. Only a replay sets it.
pub const SPEC_PREFIX: &str = "recorded:";

/// The part of a replay's setting naming the live provider (the rest of the setting).
const LIVE_AFTER: &str = "#live_after=";

/// A replay's `llm` setting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplaySpec {
    /// The recorded run.
    pub source: String,
    /// Sandbox steps run again instead of returning their recorded results.
    pub live_sandbox: bool,
    /// Gates wait for people instead of taking their recorded decisions.
    pub live_gates: bool,
    /// A request or step that differs from the records goes on live, to this provider
    /// setting (a node's own `llm:` first); None: it fails its node.
    pub live_after: Option<String>,
}

impl ReplaySpec {
    pub fn parse(spec: &str) -> Option<ReplaySpec> {
        let rest = spec.trim().strip_prefix(SPEC_PREFIX)?;
        // The live provider's setting is last and taken whole (a URL may hold a `#`).
        let (rest, live_after) = match rest.split_once(LIVE_AFTER) {
            Some((head, live)) => (head, Some(live.to_owned())),
            None => (rest, None),
        };
        let mut parts = rest.split('#');
        let source = parts.next()?.trim();
        if source.is_empty() {
            return None;
        }
        let mut out = ReplaySpec {
            source: source.to_owned(),
            live_after,
            ..ReplaySpec::default()
        };
        for p in parts {
            match p.trim() {
                "sandbox=live" => out.live_sandbox = true,
                "gates=live" => out.live_gates = true,
                _ => {}
            }
        }
        Some(out)
    }

    pub fn to_spec_string(&self) -> String {
        let mut s = format!("{SPEC_PREFIX}{}", self.source);
        if self.live_sandbox {
            s.push_str("#sandbox=live");
        }
        if self.live_gates {
            s.push_str("#gates=live");
        }
        if let Some(live) = &self.live_after {
            s.push_str(LIVE_AFTER);
            s.push_str(live);
        }
        s
    }
}

/// Where a replay left its records and went live, told once per node attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WentLive {
    pub node: String,
    pub attempt: u32,
    pub turn: u32,
    pub step: u32,
    /// `request` (it differs from the recorded one) or `missing` (no record of it).
    pub why: &'static str,
    /// Unified diff of the requests, recorded first (empty when no record).
    pub diff: String,
}

/// Where a replay going live left its records; `attempt` is the replaying attempt.
fn went_live(e: &RecordError, attempt: u32) -> WentLive {
    let (node, turn, step, why, diff) = match e {
        RecordError::Missing {
            node, turn, step, ..
        } => (node.clone(), *turn, *step, "missing", String::new()),
        RecordError::Diverged {
            node,
            turn,
            step,
            diff,
            ..
        } => (node.clone(), *turn, *step, "request", diff.clone()),
        RecordError::Corrupt { .. } => (String::new(), 0, 0, "corrupt", String::new()),
    };
    WentLive {
        node,
        attempt,
        turn,
        step,
        why,
        diff,
    }
}

/// Receives a replay's divergence before it goes live (the node records it as an event).
pub type OnLive = Arc<dyn Fn(WentLive) + Send + Sync>;

/// The live provider of a `live_after` replay and what to tell when it is first used.
pub struct LiveAfter {
    pub provider: Arc<dyn Provider>,
    pub on_live: OnLive,
}

/// The source run of a replay's `llm` setting, if it is one.
pub fn source_of(spec: &str) -> Option<String> {
    ReplaySpec::parse(spec).map(|r| r.source)
}

/// Answers one node attempt of a replay from the recorded run's exchanges.
pub struct Recorded {
    store: Store,
    project: String,
    /// The recorded instance's exchanges directory (in the source run).
    dir: String,
    attempt: u32,
    /// The provider's name as the recorded run knew it.
    name: String,
    /// Where a divergence goes on (`live_after`); None: it fails the request.
    live: Option<LiveAfter>,
    /// This attempt left its records: every later request goes live.
    went_live: AtomicBool,
    /// The exchange `load` read (turn, step 1), taken by the request it answers.
    first: std::sync::Mutex<Option<(u32, records::Exchange)>>,
}

impl Recorded {
    /// The recorded exchanges in `dir` (the source run's
    /// `agents/<instance>/runtime/exchanges`) for attempt `attempt` of a node at `turn`.
    /// The recorded provider's name is read from the attempt's first exchange.
    pub async fn load(
        store: Store,
        project: &str,
        dir: &str,
        attempt: u32,
        turn: u32,
    ) -> Result<Recorded, AgentError> {
        let mut r = Recorded {
            store,
            project: project.to_owned(),
            dir: dir.to_owned(),
            attempt,
            name: String::new(),
            live: None,
            went_live: AtomicBool::new(false),
            first: std::sync::Mutex::new(None),
        };
        r.name = match r.read(turn, 1).await? {
            Some(ex) => {
                let name = ex.provider.clone();
                *r.first.get_mut().unwrap_or_else(|p| p.into_inner()) = Some((turn, ex));
                name
            }
            None => format!("{SPEC_PREFIX}{dir}"),
        };
        Ok(r)
    }

    /// Requests that differ from the records (or have none) go to `live` instead of failing.
    pub fn live_after(mut self, live: LiveAfter) -> Recorded {
        self.live = Some(live);
        self
    }

    async fn read(&self, turn: u32, step: u32) -> Result<Option<records::Exchange>, AgentError> {
        let path = format!(
            "{}/{}",
            self.dir,
            records::file_name(self.attempt, turn, step)
        );
        match self.store.get(&self.project, &path).await {
            Ok(Some(bytes)) => Ok(Some(records::parse(&path, &bytes)?)),
            Ok(None) => Ok(None),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(AgentError::Unavailable(format!(
                "cannot read replay record {path}: {}",
                s.message()
            ))),
        }
    }
}

impl Provider for Recorded {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn complete<'a>(
        &'a self,
        request: &'a AgentRequest,
    ) -> BoxFuture<'a, Result<AgentReply, AgentError>> {
        self.complete_observed(request, &NoObserver)
    }

    fn complete_observed<'a>(
        &'a self,
        request: &'a AgentRequest,
        observer: &'a dyn AttemptObserver,
    ) -> BoxFuture<'a, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            let Some(live) = &self.live else {
                return self.answer_from_records(request, observer).await;
            };
            if !self.went_live.load(Ordering::SeqCst) {
                match self.answer_from_records(request, observer).await {
                    Err(AgentError::Record(r)) if r.left_records() => {
                        self.went_live.store(true, Ordering::SeqCst);
                        (live.on_live)(went_live(&r, self.attempt));
                    }
                    other => return other,
                }
            }
            live.provider.complete_observed(request, observer).await
        })
    }
}

impl Recorded {
    /// The recorded answer to `request`, or why there is none.
    async fn answer_from_records(
        &self,
        request: &AgentRequest,
        observer: &dyn AttemptObserver,
    ) -> Result<AgentReply, AgentError> {
        let step = super::replay::step_of(request);
        let loaded = match self.first.lock() {
            Ok(mut first) => first.take_if(|(turn, _)| step == 1 && *turn == request.turn),
            Err(_) => None,
        };
        let ex = match loaded {
            Some((_, ex)) => Some(ex),
            None => self.read(request.turn, step).await?,
        };
        let Some(ex) = ex else {
            return Err(RecordError::Missing {
                path: format!(
                    "{}/{}",
                    self.dir,
                    records::file_name(self.attempt, request.turn, step)
                ),
                node: request.node_id.clone(),
                attempt: self.attempt,
                turn: request.turn,
                step,
            }
            .into());
        };
        let mine = records::comparable(request);
        if records::hash(&mine) != ex.request_sha256 {
            return Err(RecordError::Diverged {
                node: request.node_id.clone(),
                attempt: self.attempt,
                turn: request.turn,
                step,
                diff: records::unified_diff(
                    &records::pretty(&ex.request),
                    &records::pretty(&mine),
                    "recorded",
                    "replay",
                ),
            }
            .into());
        }
        let run = request.run_id.as_str();
        for a in ex.attempts {
            let a = serde_json::to_value(a)
                .ok()
                .map(|v| records::replace_in(v, RUN_ID_MARK, run))
                .and_then(|v| serde_json::from_value(v).ok());
            if let Some(a) = a {
                observer.attempt(&a);
            }
        }
        match (ex.reply, ex.error) {
            (Some(reply), _) => {
                let v = serde_json::to_value(reply).unwrap_or_default();
                serde_json::from_value(records::replace_in(v, RUN_ID_MARK, run)).map_err(|e| {
                    AgentError::Unavailable(format!(
                        "replay record of node `{}`: {e}",
                        request.node_id
                    ))
                })
            }
            (None, Some(error)) => Err(AgentError::Replayed(error.replace(RUN_ID_MARK, run))),
            (None, None) => Err(RecordError::Corrupt {
                path: format!(
                    "{}/{}",
                    self.dir,
                    records::file_name(self.attempt, request.turn, step)
                ),
                line: 1,
                column: 1,
                message: "neither `reply` nor `error`".into(),
            }
            .into()),
        }
    }
}
