//! Orchestrator replicas (`[orchestrator.cluster]`): membership in etcd and who drives which
//! run (a crate of its own: the orchestrator composes it).
//!
//! Each replica registers `<key_prefix>members/<member_id>` under a lease of `lease_ttl_s` and
//! keeps it alive; every replica watches the members and so knows the same set. A run belongs
//! to the member with the highest rendezvous score of (member id, project/run id), so a
//! member joining or leaving moves only its own share. The new owner claims the run in the
//! store (ClaimRun) before it reads and drives it, which fences the previous owner's appends
//! off; the store, not etcd, is what makes a stale driver harmless.
//!
//! A replica that has not renewed its lease for two thirds of the TTL stops driving (it may
//! be cut off from etcd while the others already see its lease expire) and rejoins with a new
//! lease once etcd answers again. Calls about a run another member drives are forwarded to it
//! (the orchestrator's service.rs); a replica out of the cluster refuses them with UNAVAILABLE.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_proto::v1::orchestrator_client::OrchestratorClient;

/// The identity peers present and are dialled as (the orchestrator's certificate).
const IDENTITY: &str = "orchestrator";
use cairn_sha256::Sha256;
use cairn_telemetry::TracedChannel;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    WatchOptions,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;

/// Whether an etcd endpoint (`host:port`, `http://host:port`) names this machine's loopback.
fn on_loopback(endpoint: &str) -> bool {
    let bare = endpoint.strip_prefix("http://").unwrap_or(endpoint);
    let host = bare.rsplit_once(':').map_or(bare, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `[orchestrator.cluster]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd client endpoints (`host:port`, `http://host:port` or `https://host:port`); empty =
    /// no replicas: this orchestrator drives every run of its store. With `[tls]` set, etcd is
    /// dialled over mutual TLS with the orchestrator's certificate and must serve one of the
    /// same CA naming the host dialled (`cairn certs init` issues `etcd`).
    pub etcd_endpoints: Vec<String>,
    /// This replica's name among the members, unique and stable across restarts (a pod or
    /// host name); empty = the host name.
    pub member_id: String,
    /// The address other replicas reach this one's gRPC service at (calls about runs this
    /// replica drives are forwarded there). Required with `etcd_endpoints`.
    pub advertise_addr: String,
    /// Seconds a replica's membership outlives its last lease renewal; its runs move to the
    /// others about this long after it dies. At least 2.
    pub lease_ttl_s: u64,
    /// Prefix of cairn's keys in etcd (several deployments may share one etcd).
    pub key_prefix: String,
    /// Milliseconds a replica waits after a membership change before adopting the runs it
    /// gained, so their previous owner has stopped driving them first.
    pub handover_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            etcd_endpoints: Vec::new(),
            member_id: String::new(),
            advertise_addr: String::new(),
            lease_ttl_s: 5,
            key_prefix: "/cairn/orchestrator/".into(),
            handover_ms: 1000,
        }
    }
}

impl ClusterConfig {
    pub fn is_on(&self) -> bool {
        self.endpoints().next().is_some()
    }

    /// Each key's value (flags set one key at a time: keys that go together are checked by
    /// [`ClusterConfig::check_complete`]).
    pub fn check(&self) -> Result<(), String> {
        if self.lease_ttl_s < 2 {
            return Err(format!(
                "cluster.lease_ttl_s is {}: use at least 2 (seconds)",
                self.lease_ttl_s
            ));
        }
        let id = &self.member_id;
        if !id.is_empty()
            && (id.len() > 128
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')))
        {
            return Err(format!(
                "cluster.member_id `{id}` must be at most 128 letters, digits, `.`, `_`, `-`"
            ));
        }
        if !self.key_prefix.starts_with('/') || !self.key_prefix.ends_with('/') {
            return Err(format!(
                "cluster.key_prefix `{}` must start and end with `/`",
                self.key_prefix
            ));
        }
        Ok(())
    }

    /// What replicas need together, checked when the orchestrator starts.
    pub fn check_complete(&self) -> Result<(), String> {
        self.check()?;
        if self.is_on() && self.advertise_addr.trim().is_empty() {
            return Err("cluster.advertise_addr is required with cluster.etcd_endpoints: the address the other replicas reach this one at (e.g. orchestrator-0.orchestrator:7070)".into());
        }
        Ok(())
    }

    /// How etcd is dialled, given whether `[tls]` is set: with TLS every endpoint is dialled
    /// over mutual TLS (an `http://` one is refused); without it an `https://` endpoint is
    /// refused (there is no certificate to present) and plaintext to an address beyond
    /// loopback is logged as a warning (keep etcd on a network only the replicas reach).
    pub fn check_transport(&self, tls: bool) -> Result<(), String> {
        for e in self.endpoints() {
            if tls && e.starts_with("http://") {
                return Err(format!(
                    "cluster.etcd_endpoints: `{e}` is plaintext while [tls] is set: write `https://{}` (or `{}`); replicas dial etcd with mutual TLS",
                    &e["http://".len()..],
                    &e["http://".len()..]
                ));
            }
            if !tls && e.starts_with("https://") {
                return Err(format!(
                    "cluster.etcd_endpoints: `{e}` needs a certificate to present: set [tls] (--tls-dir), or dial etcd in plaintext on loopback"
                ));
            }
            if !tls && !on_loopback(e) {
                tracing::warn!(endpoint = %e, "etcd is dialled in PLAINTEXT beyond loopback: whoever reaches it can end this replica's membership; set [tls] (etcd then serves a certificate of the cairn CA)");
            }
        }
        Ok(())
    }

    fn endpoints(&self) -> impl Iterator<Item = &str> {
        self.etcd_endpoints
            .iter()
            .map(|e| e.trim())
            .filter(|e| !e.is_empty())
    }

    /// The member id: as configured, else the host name.
    fn resolved_member_id(&self) -> String {
        if !self.member_id.is_empty() {
            return self.member_id.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        let clean: String = host
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '-'
                }
            })
            .take(128)
            .collect();
        if clean.is_empty() {
            "orchestrator".into()
        } else {
            clean
        }
    }
}

/// The members as this replica sees them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct View {
    /// True while this replica holds a live lease (its own entry is among the members).
    pub joined: bool,
    /// member id -> advertised address.
    pub members: BTreeMap<String, String>,
}

impl View {
    /// The member a run belongs to: the highest rendezvous score.
    pub fn owner(&self, project: &str, run_id: &str) -> Option<(&str, &str)> {
        self.members
            .iter()
            .max_by_key(|(id, _)| score(id, project, run_id))
            .map(|(id, addr)| (id.as_str(), addr.as_str()))
    }
}

fn score(member: &str, project: &str, run_id: &str) -> u64 {
    let d = Sha256::new()
        .chain(member.as_bytes())
        .chain(&[0u8])
        .chain(project.as_bytes())
        .chain(&[0u8])
        .chain(run_id.as_bytes())
        .finish();
    u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// Where a call about one run is answered.
pub enum Route {
    /// By this replica.
    Here,
    /// By the member that drives the run.
    Peer {
        member: String,
        client: Box<OrchestratorClient<TracedChannel>>,
    },
}

/// What a member's key holds.
#[derive(Serialize, Deserialize)]
struct Member {
    addr: String,
    /// Random per process: tells this process's own entry from another's of the same id.
    incarnation: String,
}

/// This replica's membership and view of the others.
pub struct Cluster {
    config: ClusterConfig,
    me: String,
    incarnation: String,
    view: watch::Sender<Arc<View>>,
    peers: Mutex<HashMap<String, OrchestratorClient<TracedChannel>>>,
    tls: Option<cairn_server::Tls>,
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Lost(String),
}

impl Cluster {
    /// Starts membership (in the background, retrying until etcd answers). `tls`: the identity
    /// calls to etcd and to peer replicas are made with.
    pub fn start(
        config: ClusterConfig,
        tls: Option<cairn_server::Tls>,
        shutdown: CancellationToken,
    ) -> Arc<Cluster> {
        let (view, _) = watch::channel(Arc::new(View::default()));
        let cluster = Arc::new(Cluster {
            me: config.resolved_member_id(),
            incarnation: uuid::Uuid::new_v4().simple().to_string(),
            config,
            view,
            peers: Mutex::new(HashMap::new()),
            tls,
        });
        let c = cluster.clone();
        tokio::spawn(async move { c.run(shutdown).await });
        cluster
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    pub fn view(&self) -> Arc<View> {
        self.view.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<View>> {
        self.view.subscribe()
    }

    /// Whether this replica drives `project/run_id` under the current view.
    pub fn owns(&self, project: &str, run_id: &str) -> bool {
        let v = self.view();
        v.joined
            && v.owner(project, run_id)
                .is_some_and(|(id, _)| id == self.me)
    }

    /// Where a call about `project/run_id` goes; an error while this replica is out of the
    /// cluster (it cannot know the owner, and must not drive the run).
    pub fn route(&self, project: &str, run_id: &str) -> Result<Route, String> {
        let v = self.view();
        if !v.joined {
            return Err(format!(
                "orchestrator replica `{}` is not in the cluster right now (no live etcd lease): retry, or call another replica",
                self.me
            ));
        }
        match v.owner(project, run_id) {
            Some((id, _)) if id == self.me => Ok(Route::Here),
            Some((id, addr)) => Ok(Route::Peer {
                member: id.to_owned(),
                client: Box::new(self.peer(addr)?),
            }),
            None => Ok(Route::Here),
        }
    }

    fn peer(&self, addr: &str) -> Result<OrchestratorClient<TracedChannel>, String> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = peers.get(addr) {
            return Ok(c.clone());
        }
        // Peers present the orchestrator's certificate whatever name they are dialled by: a
        // member entry written by anyone else gets no forwarded call (nor its token).
        let name = self.tls.as_ref().map(|_| IDENTITY);
        // Each new connection dials with the certificate files as they are then (renewals).
        let channel = cairn_server::connect_named(addr, self.tls.as_ref(), name)
            .map_err(|e| format!("replica address {addr}: {e}"))?;
        let client = OrchestratorClient::new(cairn_telemetry::traced(channel))
            .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES);
        peers.insert(addr.to_owned(), client.clone());
        Ok(client)
    }

    fn members_prefix(&self) -> String {
        format!("{}members/", self.config.key_prefix)
    }

    fn publish(&self, view: View) {
        self.view.send_if_modified(|cur| {
            if **cur == view {
                false
            } else {
                *cur = Arc::new(view);
                true
            }
        });
    }

    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(200);
        loop {
            let outcome = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = self.session(&shutdown) => r,
            };
            self.publish(View::default());
            match outcome {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(member = %self.me, error = %e, "out of the orchestrator cluster: this replica drives no run until it rejoins");
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// One lease's life: register, keep alive, follow the members. Ok when shut down.
    async fn session(&self, shutdown: &CancellationToken) -> Result<(), SessionError> {
        let ttl = Duration::from_secs(self.config.lease_ttl_s);
        let call = ttl / 3;
        // Renewals every third of the TTL; out after two thirds without one.
        let fence_after = ttl * 2 / 3;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(call)
            .with_keep_alive(call, call);
        if let Some(tls) = &self.tls {
            opts = opts.with_tls(tls.client());
        }
        let endpoints: Vec<&str> = self.config.endpoints().collect();
        let mut client = within(call, Client::connect(endpoints, Some(opts))).await?;
        let granted = within(
            call,
            client.lease_grant(self.config.lease_ttl_s as i64, None),
        )
        .await?;
        let lease = granted.id();
        let mut last_renewal = Instant::now();
        let result = async {
            self.register(&mut client, lease, ttl).await?;
            let (mut keeper, mut acks) = within(call, client.lease_keep_alive(lease)).await?;
            let (mut members, revision) = self.members(&mut client, call).await?;
            self.publish(View {
                joined: members.contains_key(&self.me),
                members: members.clone(),
            });
            tracing::info!(member = %self.me, members = members.len(), "joined the orchestrator cluster");
            let watch_opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(revision + 1);
            let mut watch =
                within(call, client.watch(self.members_prefix(), Some(watch_opts))).await?;
            let mut tick = tokio::time::interval(call);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut keeper_broken = false;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tick.tick() => {
                        if last_renewal.elapsed() > fence_after {
                            return Err(SessionError::Lost(format!(
                                "the lease was not renewed for {:?}",
                                last_renewal.elapsed()
                            )));
                        }
                        if keeper_broken {
                            if let Ok(Ok((k, a))) = timeout(call, client.lease_keep_alive(lease)).await {
                                (keeper, acks, keeper_broken) = (k, a, false);
                            }
                        }
                        if !keeper_broken && timeout(call, keeper.keep_alive()).await.map_or(true, |r| r.is_err()) {
                            keeper_broken = true;
                        }
                    }
                    ack = acks.message(), if !keeper_broken => match ack {
                        Ok(Some(r)) if r.ttl() > 0 => last_renewal = Instant::now(),
                        Ok(Some(_)) => return Err(SessionError::Lost("etcd says the lease expired".into())),
                        Ok(None) | Err(_) => keeper_broken = true,
                    },
                    w = watch.message() => {
                        let resp = match w {
                            Ok(Some(resp)) if !resp.canceled() => resp,
                            Ok(Some(resp)) => return Err(SessionError::Lost(format!("etcd ended the watch of the members: {}", resp.cancel_reason()))),
                            Ok(None) => return Err(SessionError::Lost("etcd ended the watch of the members".into())),
                            Err(e) => return Err(e.into()),
                        };
                        for e in resp.events() {
                            let Some(kv) = e.kv() else { continue };
                            let Some(id) = std::str::from_utf8(kv.key()).ok().and_then(|k| k.strip_prefix(&self.members_prefix())) else { continue };
                            match e.event_type() {
                                EventType::Put => {
                                    if let Ok(m) = serde_json::from_slice::<Member>(kv.value()) {
                                        members.insert(id.to_owned(), m.addr);
                                    }
                                }
                                EventType::Delete => {
                                    members.remove(id);
                                }
                            }
                        }
                        if !members.contains_key(&self.me) {
                            return Err(SessionError::Lost("this replica's member key was deleted".into()));
                        }
                        self.publish(View { joined: true, members: members.clone() });
                    }
                }
            }
        }
        .await;
        // Leaving (shutdown) or giving up: the lease goes now, not a TTL later.
        let _ = timeout(call, client.lease_revoke(lease)).await;
        result
    }

    /// Puts this replica's member key under `lease`, unless another live process holds the
    /// id (then waits for its lease, a TTL at most, before refusing).
    async fn register(
        &self,
        client: &mut Client,
        lease: i64,
        ttl: Duration,
    ) -> Result<(), SessionError> {
        let key = format!("{}{}", self.members_prefix(), self.me);
        let value = serde_json::to_vec(&Member {
            addr: self.config.advertise_addr.clone(),
            incarnation: self.incarnation.clone(),
        })
        .map_err(|e| SessionError::Lost(e.to_string()))?;
        let deadline = Instant::now() + ttl + Duration::from_secs(1);
        loop {
            let put = TxnOp::put(
                key.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            );
            let txn = Txn::new()
                .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
                .and_then([put.clone()])
                .or_else([TxnOp::get(key.clone(), None)]);
            let r = within(ttl / 3, client.txn(txn)).await?;
            if r.succeeded() {
                return Ok(());
            }
            let holder = r.op_responses().into_iter().find_map(|op| match op {
                etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
                _ => None,
            });
            let theirs = holder.and_then(|v| serde_json::from_slice::<Member>(&v).ok());
            if theirs
                .as_ref()
                .is_some_and(|m| m.incarnation == self.incarnation)
            {
                // Our own entry from an earlier lease: take it over.
                within(
                    ttl / 3,
                    client.put(
                        key.clone(),
                        value.clone(),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                )
                .await?;
                return Ok(());
            }
            if Instant::now() > deadline {
                let addr = theirs.map(|m| m.addr).unwrap_or_default();
                return Err(SessionError::Lost(format!(
                    "member_id `{}` is held by another live replica (at {addr}): give each replica its own cluster.member_id",
                    self.me
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn members(
        &self,
        client: &mut Client,
        call: Duration,
    ) -> Result<(BTreeMap<String, String>, i64), SessionError> {
        let prefix = self.members_prefix();
        let r = within(
            call,
            client.get(prefix.clone(), Some(GetOptions::new().with_prefix())),
        )
        .await?;
        let revision = r.header().map(|h| h.revision()).unwrap_or(0);
        let mut members = BTreeMap::new();
        for kv in r.kvs() {
            let Some(id) = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|k| k.strip_prefix(&prefix))
            else {
                continue;
            };
            if let Ok(m) = serde_json::from_slice::<Member>(kv.value()) {
                members.insert(id.to_owned(), m.addr);
            }
        }
        Ok((members, revision))
    }
}

async fn within<T>(
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, SessionError> {
    match timeout(limit, f).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(SessionError::Timeout(limit)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(ids: &[&str]) -> View {
        View {
            joined: true,
            members: ids
                .iter()
                .map(|i| (i.to_string(), format!("{i}:1")))
                .collect(),
        }
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_runs() {
        let three = view(&["a", "b", "c"]);
        let two = view(&["a", "c"]);
        let mut counts = BTreeMap::new();
        for i in 0..3000 {
            let run = format!("run-{i}");
            let before = three.owner("p", &run).unwrap().0.to_owned();
            let after = two.owner("p", &run).unwrap().0;
            if before != "b" {
                assert_eq!(before, after, "{run} moved although its owner stayed");
            }
            *counts.entry(before).or_insert(0) += 1;
        }
        // Roughly a third each.
        for (id, n) in counts {
            assert!((800..1200).contains(&n), "{id} owns {n} of 3000");
        }
        assert!(View::default().owner("p", "r").is_none());
    }

    #[test]
    fn configuration_is_checked() {
        let mut c = ClusterConfig::default();
        assert!(c.check_complete().is_ok(), "off by default");
        c.etcd_endpoints = vec!["127.0.0.1:2379".into()];
        assert!(c.check().is_ok(), "one key at a time");
        assert!(c.check_complete().unwrap_err().contains("advertise_addr"));
        c.advertise_addr = "127.0.0.1:50054".into();
        assert!(c.check_complete().is_ok());
        c.lease_ttl_s = 1;
        assert!(c.check().unwrap_err().contains("lease_ttl_s"));
        c.lease_ttl_s = 5;
        c.member_id = "a/b".into();
        assert!(c.check().unwrap_err().contains("member_id"));
        c.member_id = "orchestrator-0".into();
        c.key_prefix = "cairn".into();
        assert!(c.check().unwrap_err().contains("key_prefix"));
    }

    #[test]
    fn etcd_is_dialled_over_tls_when_tls_is_set() {
        let with = |e: &str| ClusterConfig {
            etcd_endpoints: vec![e.into()],
            ..ClusterConfig::default()
        };
        let err = with("http://etcd:2379").check_transport(true).unwrap_err();
        assert!(err.contains("https://etcd:2379"), "{err}");
        assert!(with("etcd:2379").check_transport(true).is_ok());
        assert!(with("https://etcd:2379").check_transport(true).is_ok());
        let err = with("https://etcd:2379")
            .check_transport(false)
            .unwrap_err();
        assert!(err.contains("--tls-dir"), "{err}");
        // Plaintext is allowed (beyond loopback with a warning).
        assert!(with("http://127.0.0.1:2379").check_transport(false).is_ok());
        assert!(with("etcd:2379").check_transport(false).is_ok());
        for (e, loopback) in [
            ("127.0.0.1:2379", true),
            ("http://localhost:2379", true),
            ("[::1]:2379", true),
            ("etcd:2379", false),
            ("http://10.0.0.5:2379", false),
        ] {
            assert_eq!(on_loopback(e), loopback, "{e}");
        }
    }
}
