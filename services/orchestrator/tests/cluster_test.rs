//! Orchestrator replicas over a real etcd on loopback: runs spread across three processes,
//! SubmitRun and gate decisions through a replica that does not drive the run, kill -9 of a
//! replica mid-run (its runs complete on the others, every node once, no gap in the events)
//! and a replica cut off from etcd fenced out and back in. Healing: the owner of a run paused
//! (SIGSTOP, then SIGCONT) 5, 10 and 15 s during a sandbox step, mid-chain and at a gate, cut
//! off from etcd and healed, restarted with the same member id, and a replica added: each
//! unfinished run is driven again within `lease_ttl + handover + 5 s` of the change and
//! completes once per node (a sandbox step delivered again under its step key, one
//! redelivery higher), with no gap in its events.
//!
//! Needs the `etcd` binary (scripts/setup.sh installs Debian's etcd-server); required when
//! CAIRN_REQUIRE_DOCKER=1 (CI), else skipped with a SKIP line.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{
    Event, GateDecisionRequest, GetRunRequest, LogStream, RunInfo, SubmitRunRequest, TaskState,
    WatchLogsRequest,
};
use common::*;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tonic::transport::Channel;

/// The replicas' lease TTL: 3 s, or CAIRN_TEST_LEASE_TTL_S (bench/failover.sh measures with
/// the default, 5).
fn ttl_s() -> u64 {
    std::env::var("CAIRN_TEST_LEASE_TTL_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// etcd as a child process with its data in a temporary directory.
struct Etcd {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn etcd_binary() -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("etcd"))
            .find(|p| p.is_file())
    })
}

async fn start_etcd() -> Option<Etcd> {
    start_etcd_with(None).await
}

/// Connect options for a client of an etcd serving mutual TLS with the PKI in `pki`;
/// `identity`: the PKI directory and identity whose certificate to present (None: none).
fn tls_options(
    pki: &std::path::Path,
    identity: Option<(&std::path::Path, &str)>,
) -> etcd_client::ConnectOptions {
    let ca = std::fs::read(pki.join("ca.pem")).unwrap();
    let mut tls =
        etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(ca));
    if let Some((holder, id)) = identity {
        let read = |f: String| std::fs::read(holder.join(f)).unwrap();
        tls = tls.identity(etcd_client::Identity::from_pem(
            read(format!("{id}.pem")),
            read(format!("{id}.key")),
        ));
    }
    etcd_client::ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(2))
}

/// etcd; with `pki`, serving mutual TLS with its `etcd` certificate and requiring a client
/// certificate of that CA.
async fn start_etcd_with(pki: Option<&std::path::Path>) -> Option<Etcd> {
    let Some(bin) = etcd_binary() else {
        assert!(
            !docker_required(),
            "etcd is required with CAIRN_REQUIRE_DOCKER=1: run scripts/setup.sh (installs etcd-server)"
        );
        eprintln!("SKIP: no etcd binary (install etcd-server, or run scripts/setup.sh)");
        return None;
    };
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let (client, peer) = (free_port(), free_port());
        let addr = format!("127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let scheme = if pki.is_some() { "https" } else { "http" };
        let mut cmd = Command::new(&bin);
        if let Some(pki) = pki {
            let file = |f: &str| pki.join(f).to_str().unwrap().to_owned();
            cmd.args([
                "--cert-file",
                &file("etcd.pem"),
                "--key-file",
                &file("etcd.key"),
            ])
            .args(["--trusted-ca-file", &file("ca.pem"), "--client-cert-auth"]);
        }
        let child = cmd
            .args([
                "--name",
                "t",
                "--data-dir",
                dir.path().to_str().unwrap(),
                "--listen-client-urls",
                &format!("{scheme}://{addr}"),
                "--advertise-client-urls",
                &format!("{scheme}://{addr}"),
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &format!("t={peer_url}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut etcd = Etcd {
            child,
            addr,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let opts = pki.map(|p| tls_options(p, Some((p, "cli"))));
            if let Ok(mut c) = etcd_client::Client::connect([etcd.addr.as_str()], opts).await {
                if c.get("probe", None).await.is_ok() {
                    return Some(etcd);
                }
            }
            if etcd.child.try_wait().unwrap().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = etcd.child.kill();
    }
    panic!("etcd never answered");
}

/// A TCP relay to etcd that the test can cut (a network partition of one replica).
struct Relay {
    addr: String,
    cut: watch::Sender<bool>,
}

impl Relay {
    async fn start(target: String) -> Arc<Relay> {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (cut, _) = watch::channel(false);
        let relay = Arc::new(Relay {
            addr: l.local_addr().unwrap().to_string(),
            cut,
        });
        let r = relay.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = l.accept().await else {
                    return;
                };
                if *r.cut.borrow() {
                    continue; // dropped: refused while cut
                }
                let mut cut = r.cut.subscribe();
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        relay
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

/// One orchestrator replica as its own process.
struct Replica {
    id: String,
    child: Child,
    client: OrchestratorClient<Channel>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Its log goes to `log` (read when a test fails).
fn spawn_replica(id: &str, store_addr: &str, etcd: &str, log: &std::path::Path) -> Replica {
    spawn_replica_with(id, store_addr, etcd, log, &[])
}

/// A replica process; `extra`: more arguments (e.g. `--tls-dir`).
fn spawn_replica_with(
    id: &str,
    store_addr: &str,
    etcd: &str,
    log: &std::path::Path,
    extra: &[&str],
) -> Replica {
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_cairn-orchestrator"))
        .args(extra)
        .args([
            "--listen",
            &addr,
            "--store-addr",
            store_addr,
            "--ingest-addr",
            "",
            "--set",
            &format!("cluster.etcd_endpoints={etcd}"),
            "--set",
            &format!("cluster.member_id={id}"),
            "--set",
            &format!("cluster.advertise_addr={addr}"),
            "--set",
            &format!("cluster.lease_ttl_s={}", ttl_s()),
            "--set",
            &format!(
                "cluster.handover_ms={}",
                std::env::var("CAIRN_TEST_HANDOVER_MS").unwrap_or_else(|_| "300".into())
            ),
            "--set",
            "snapshot_interval_ms=50",
        ])
        .env_remove("CAIRN_ORCHESTRATOR_CONFIG")
        .env_remove("CAIRN_CONFIG")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    Replica {
        id: id.to_owned(),
        child,
        client: OrchestratorClient::new(cairn_server::connect(&addr).unwrap()),
    }
}

/// Three replicas (each reaching etcd through its own relay), all in one membership.
struct Cluster {
    stack: Stack,
    _etcd: Etcd,
    etcd_addr: String,
    relays: Vec<Arc<Relay>>,
    replicas: Vec<Replica>,
}

impl Cluster {
    /// A replica process `id` reaching etcd through `relay`, with the cluster's runner.
    fn spawn(&self, id: &str, relay: &Relay, log_name: &str) -> Replica {
        let log = self.stack.dir.path().join(log_name);
        match &self.stack.sandbox_addr {
            Some(runner) => spawn_replica_with(
                id,
                &self.stack.store_addr,
                &relay.addr,
                &log,
                &["--sandbox-addr", runner],
            ),
            None => spawn_replica(id, &self.stack.store_addr, &relay.addr, &log),
        }
    }
}

async fn members(etcd: &str) -> Vec<String> {
    members_with(etcd, None).await.unwrap_or_default()
}

/// The member ids in etcd; Err when etcd cannot be reached or refuses the read.
async fn members_with(
    etcd: &str,
    opts: Option<etcd_client::ConnectOptions>,
) -> Result<Vec<String>, etcd_client::Error> {
    let mut c = etcd_client::Client::connect([etcd], opts).await?;
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_keys_only();
    let r = c.get("/cairn/orchestrator/members/", Some(opts)).await?;
    Ok(r.kvs()
        .iter()
        .map(|kv| {
            String::from_utf8_lossy(kv.key())
                .rsplit('/')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect())
}

async fn wait_members(etcd: &str, want: &[&str], secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let mut m = members(etcd).await;
        m.sort();
        if m == want {
            return;
        }
        assert!(Instant::now() < deadline, "members are {m:?}, not {want:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn start_cluster() -> Option<Cluster> {
    start_cluster_with(Sandbox::None, "").await
}

/// Three replicas over a real etcd; with `Sandbox::Required` a sandbox runner they all use
/// (None, with a SKIP line naming `test`, when no sandbox backend can run here).
async fn start_cluster_with(sandbox: Sandbox, test: &str) -> Option<Cluster> {
    let etcd = start_etcd().await?;
    // The stack's own orchestrator stays out of it: only the replicas drive runs.
    let stack = match Stack::try_start(Options {
        ingest: false,
        sandbox,
        tweak: |c| c.resume_on_start = false,
        ..Default::default()
    })
    .await
    {
        Ok(s) => s,
        Err(e) => {
            println!("SKIP: {test}: no sandbox backend can run here ({e})");
            return None;
        }
    };
    let mut cluster = Cluster {
        etcd_addr: etcd.addr.clone(),
        _etcd: etcd,
        stack,
        relays: Vec::new(),
        replicas: Vec::new(),
    };
    for i in 0..3 {
        let relay = Relay::start(cluster.etcd_addr.clone()).await;
        let id = format!("o{i}");
        cluster
            .replicas
            .push(cluster.spawn(&id, &relay, &format!("{id}.log")));
        cluster.relays.push(relay);
    }
    wait_members(&cluster.etcd_addr, &["o0", "o1", "o2"], 30).await;
    // Every replica has seen the others once its handover has passed.
    tokio::time::sleep(Duration::from_millis(800)).await;
    Some(cluster)
}

fn gated(run_tag: &str) -> String {
    format!(
        "title: gated {run_tag}\nnodes:\n\
         \x20 - {{id: a, type: write_file, path: \"docs/{{{{run_id}}}}/a.txt\", content: \"a\"}}\n\
         \x20 - {{id: g, type: gate, reason: \"check\", needs: [a]}}\n\
         \x20 - {{id: b, type: write_file, path: \"docs/{{{{run_id}}}}/b.txt\", content: \"b\", needs: [g]}}\n"
    )
}

fn chain(n: usize) -> String {
    let mut g = String::from("title: long\nnodes:\n");
    for i in 0..n {
        let needs = if i == 0 {
            String::new()
        } else {
            format!(", needs: [c{}]", i - 1)
        };
        g.push_str(&format!(
            "  - {{id: c{i}, type: write_file, path: \"docs/{{{{run_id}}}}/c{i}.txt\", content: \"c{i}\"{needs}}}\n"
        ));
    }
    g
}

async fn submit(c: &OrchestratorClient<Channel>, graph: String) -> RunInfo {
    c.clone()
        .submit_run(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: graph,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn get(c: &OrchestratorClient<Channel>, run: &str) -> Result<RunInfo, tonic::Status> {
    c.clone()
        .get_run(GetRunRequest {
            project_id: PROJECT.into(),
            run_id: run.into(),
        })
        .await
        .map(|r| r.into_inner())
}

/// Waits until `check` holds for the run as `c` reports it.
async fn wait_run(
    c: &OrchestratorClient<Channel>,
    run: &str,
    secs: u64,
    what: &str,
    check: impl Fn(&RunInfo) -> bool,
) -> RunInfo {
    wait_run_within(c, run, Duration::from_secs(secs), what, check).await
}

/// Waits at most `limit` until `check` holds for the run as `c` reports it.
async fn wait_run_within(
    c: &OrchestratorClient<Channel>,
    run: &str,
    limit: Duration,
    what: &str,
    check: impl Fn(&RunInfo) -> bool,
) -> RunInfo {
    let deadline = Instant::now() + limit;
    loop {
        let info = get(c, run).await;
        if let Ok(i) = &info {
            if check(i) {
                return i.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "run {run}: {what} not reached in {limit:?}: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn approve(run: &str, by: &str) -> GateDecisionRequest {
    GateDecisionRequest {
        project_id: PROJECT.into(),
        run_id: run.into(),
        gate_id: "g".into(),
        by: by.into(),
        note: String::new(),
    }
}

/// Nodes started and not finished in `events` (in flight when their replica died).
fn in_flight(events: &[Event]) -> Vec<String> {
    let mut open: BTreeMap<&str, usize> = BTreeMap::new();
    for e in events {
        match e.r#type.as_str() {
            "node.started" => *open.entry(&e.node_id).or_default() += 1,
            "node.completed" | "node.failed" => *open.entry(&e.node_id).or_default() -= 1,
            _ => {}
        }
    }
    open.into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(id, _)| id.to_owned())
        .collect()
}

/// No gap and no repeat in a run's sequence numbers; each node completed exactly once and
/// started once, except a node cut off in flight (`again`), which is started once more; one
/// `artifact.written` per file.
fn assert_once_and_gapless(run: &str, events: &[Event], nodes: usize, again: &[String]) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "run {run}: a gap in the events at {i}");
    }
    let mut started: HashMap<&str, usize> = HashMap::new();
    let mut completed: HashMap<&str, usize> = HashMap::new();
    for e in events {
        match e.r#type.as_str() {
            "node.started" => *started.entry(&e.node_id).or_default() += 1,
            "node.completed" => *completed.entry(&e.node_id).or_default() += 1,
            _ => {}
        }
    }
    assert_eq!(completed.len(), nodes, "run {run}: {completed:?}");
    assert!(
        completed.values().all(|&n| n == 1),
        "run {run}: a node completed twice: {completed:?}"
    );
    for (node, n) in &started {
        // Once, plus once per handover it was in flight at (a paused owner's run may move to
        // the adopter and back; each start carries the step's one key).
        let allowed = 1 + again.iter().filter(|a| a == node).count();
        assert!(
            *n <= allowed,
            "run {run}: node {node} started {n} times (in flight at the kill: {again:?})"
        );
    }
    let mut written: HashMap<String, usize> = HashMap::new();
    for e in events.iter().filter(|e| e.r#type == "artifact.written") {
        *written
            .entry(data(e)["path"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    assert!(
        written.values().all(|&n| n == 1),
        "run {run}: a file was written twice: {written:?}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| e.r#type == "task.completed")
            .count(),
        1,
        "run {run}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_spread_and_a_killed_replicas_runs_complete_on_the_others() {
    let Some(mut cl) = start_cluster().await else {
        return;
    };
    let entry = cl.replicas[0].client.clone();

    // Submitted through one replica, driven by all three (forwarded to each run's owner).
    let mut gated_runs = Vec::new();
    for i in 0..36 {
        let info = submit(&entry, gated(&i.to_string())).await;
        gated_runs.push(info.run_id);
    }
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for run in &gated_runs {
        let info = wait_run(&entry, run, 30, "input_required", |i| {
            i.state == TaskState::InputRequired as i32
        })
        .await;
        assert!(
            ["o0", "o1", "o2"].contains(&info.replica.as_str()),
            "{info:?}"
        );
        owners.entry(info.replica).or_default().push(run.clone());
    }
    assert_eq!(owners.len(), 3, "runs did not spread: {owners:?}");

    // A long run driven by a replica other than the entry one: the victim.
    let (long, victim) = loop {
        let info = submit(&entry, chain(150)).await;
        let info = wait_run(&entry, &info.run_id, 30, "an owner", |i| {
            !i.replica.is_empty()
        })
        .await;
        if info.replica != "o0" {
            break (info.run_id, info.replica);
        }
    };
    // Let it get somewhere, then kill -9 its replica.
    cl.stack.wait_completed_nodes(&long, 20, 60).await;
    let v = cl.replicas.iter_mut().find(|r| r.id == victim).unwrap();
    v.child.kill().unwrap();
    let killed = Instant::now();
    v.child.wait().unwrap();
    let before = cl.stack.events(&long).await;
    let seen = before.len();
    let cut_off = in_flight(&before);
    assert!(
        cut_off.len() <= 1,
        "a chain runs one node at a time: {cut_off:?}"
    );
    assert!(
        !cl.stack
            .events(&long)
            .await
            .iter()
            .any(|e| e.r#type == "task.completed"),
        "killed too late; make the chain longer"
    );

    // Failover: from the kill to the first event another replica records for the run.
    let failover = loop {
        if cl.stack.events(&long).await.len() > seen {
            break killed.elapsed();
        }
        // The lease lapses at most a TTL after the kill; that change heals within the bound.
        let bound = Duration::from_secs(ttl_s()) + heal_bound();
        assert!(
            killed.elapsed() < bound,
            "no replica took the run over within {bound:?} of the kill"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "failover: {} ms from kill -9 to the first event of the adopted run (lease_ttl_s = {})",
        failover.as_millis(),
        ttl_s()
    );
    let done = wait_run(&entry, &long, 120, "completed", |i| {
        i.state == TaskState::Completed as i32
    })
    .await;
    assert!(done.replica.is_empty() || done.replica != victim);
    assert_once_and_gapless(&long, &cl.stack.events(&long).await, 150, &cut_off);

    // A watch through a replica that does not drive the run follows it to its end.
    let watched = {
        let mut found = None;
        for run in &gated_runs {
            let info = get(&entry, run).await.unwrap();
            if !info.replica.is_empty() && info.replica != "o0" {
                found = Some(run.clone());
                break;
            }
        }
        found.expect("some gated run is driven by another replica than o0")
    };
    let mut watch = entry
        .clone()
        .watch_run(cairn_proto::v1::WatchRunRequest {
            project_id: PROJECT.into(),
            run_id: watched.clone(),
            from_seq: 1,
            follow_after_end: false,
        })
        .await
        .unwrap()
        .into_inner();

    // Every gated run is decided through the entry replica, whoever drives it now.
    for run in &gated_runs {
        let r = entry.clone().approve_gate(approve(run, "ann")).await;
        assert!(r.is_ok(), "approving {run} through o0: {r:?}");
    }
    for run in &gated_runs {
        wait_run(&entry, run, 60, "completed", |i| {
            i.state == TaskState::Completed as i32
        })
        .await;
        let events = cl.stack.events(run).await;
        assert_once_and_gapless(run, &events, 3, &[]);
        let approved = events.iter().find(|e| e.r#type == "gate.approved").unwrap();
        assert_eq!(data(approved)["by"], "ann", "{approved:?}");
    }
    let mut seen_types = Vec::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(30), watch.message())
        .await
        .expect("the watch through o0 stalled")
        .unwrap()
    {
        seen_types.push(e.r#type);
    }
    assert_eq!(
        seen_types.last().map(String::as_str),
        Some("task.completed"),
        "{seen_types:?}"
    );
    assert!(seen_types.iter().any(|t| t == "gate.approved"));
    // The victim's gated runs were among them: they moved.
    assert!(!owners[&victim].is_empty());
    wait_members(
        &cl.etcd_addr,
        &["o0", "o1", "o2"]
            .into_iter()
            .filter(|m| *m != victim)
            .collect::<Vec<_>>(),
        5,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_from_etcd_is_fenced_out_and_rejoins() {
    let Some(cl) = start_cluster().await else {
        return;
    };
    let entry = cl.replicas[0].client.clone();
    let mut runs = Vec::new();
    for i in 0..24 {
        runs.push(submit(&entry, gated(&i.to_string())).await.run_id);
    }
    let mut owner = HashMap::new();
    for run in &runs {
        let info = wait_run(&entry, run, 30, "input_required", |i| {
            i.state == TaskState::InputRequired as i32
        })
        .await;
        owner.insert(run.clone(), info.replica);
    }
    // Cut the replica that drives the most runs, other than the entry one.
    let (idx, cut_id) = (1..3)
        .map(|i| (i, cl.replicas[i].id.clone()))
        .max_by_key(|(_, id)| owner.values().filter(|o| *o == id).count())
        .unwrap();
    let theirs: Vec<String> = runs
        .iter()
        .filter(|r| owner[*r] == cut_id)
        .cloned()
        .collect();
    assert!(!theirs.is_empty(), "{owner:?}");
    cl.relays[idx].set_cut(true);
    let cut_at = Instant::now();

    // The cut-off replica stops answering for runs: out of the cluster, it cannot know who
    // drives them and must not drive them itself.
    let cut_client = cl.replicas[idx].client.clone();
    let deadline = Instant::now() + Duration::from_secs(ttl_s() * 3);
    let resume = cairn_proto::v1::RunActionRequest {
        project_id: PROJECT.into(),
        run_id: theirs[0].clone(),
        by: "ann".into(),
        reason: String::new(),
    };
    loop {
        // Harmless while it still drives the run (the run is live: nothing changes).
        let r = cut_client.clone().resume_run(resume.clone()).await;
        match r {
            Err(s) if s.code() == tonic::Code::Unavailable => {
                assert!(s.message().contains("not in the cluster"), "{s:?}");
                break;
            }
            other => {
                assert!(
                    Instant::now() < deadline,
                    "the cut-off replica still acts on runs: {other:?}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused = cut_client
        .clone()
        .approve_gate(approve(&theirs[0], "mallory"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    // Its runs move to the others within the lease and the handover.
    for run in &theirs {
        let info = wait_run(&entry, run, 15, "a new replica", |i| {
            !i.replica.is_empty() && i.replica != cut_id
        })
        .await;
        assert_ne!(info.replica, cut_id);
    }
    println!(
        "partition: runs of the cut-off replica driven elsewhere {} ms after the cut",
        cut_at.elapsed().as_millis()
    );
    wait_members(
        &cl.etcd_addr,
        &["o0", "o1", "o2"]
            .into_iter()
            .filter(|m| *m != cut_id)
            .collect::<Vec<_>>(),
        5,
    )
    .await;
    for run in &runs {
        entry
            .clone()
            .approve_gate(approve(run, "ann"))
            .await
            .unwrap();
    }
    for run in &runs {
        wait_run(&entry, run, 60, "completed", |i| {
            i.state == TaskState::Completed as i32
        })
        .await;
        let events = cl.stack.events(run).await;
        assert_once_and_gapless(run, &events, 3, &[]);
        assert!(
            !events.iter().any(|e| data(e)["by"] == "mallory"),
            "a decision sent to the cut-off replica was recorded"
        );
    }

    // Healed: it rejoins and answers again.
    cl.relays[idx].set_cut(false);
    wait_members(&cl.etcd_addr, &["o0", "o1", "o2"], 20).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match get(&cut_client, &runs[0]).await {
            Ok(info) => {
                assert_eq!(info.state, TaskState::Completed as i32);
                break;
            }
            Err(s) => assert!(Instant::now() < deadline, "{s:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With `[tls]` set a replica dials etcd over mutual TLS with the orchestrator certificate. That
/// etcd refuses a plaintext client, a client without a certificate and one whose certificate
/// another CA signed; a replica told to dial etcd in plaintext while TLS is set does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_reach_etcd_over_mutual_tls_and_etcd_refuses_everyone_else() {
    use cairn_server::pki::{self, PkiSpec};
    let dir = tempfile::tempdir().unwrap();
    let (ours, theirs) = (dir.path().join("pki"), dir.path().join("other"));
    pki::init(&PkiSpec::new(&ours)).unwrap();
    pki::init(&PkiSpec::new(&theirs)).unwrap();
    let Some(etcd) = start_etcd_with(Some(&ours)).await else {
        return;
    };
    // Membership needs no store: nothing listens at this address.
    let store = format!("127.0.0.1:{}", free_port());
    let tls_dir = ours.to_str().unwrap();
    let log = dir.path().join("o0.log");
    let _replica = spawn_replica_with("o0", &store, &etcd.addr, &log, &["--tls-dir", tls_dir]);
    let read = |opts| async {
        tokio::time::timeout(Duration::from_secs(5), members_with(&etcd.addr, opts)).await
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Ok(m)) = read(Some(tls_options(&ours, Some((&ours, "cli"))))).await {
            if m == ["o0"] {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the replica never joined over TLS: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (who, opts) in [
        ("plaintext", None),
        ("no client certificate", Some(tls_options(&ours, None))),
        (
            "another CA's certificate",
            Some(tls_options(&ours, Some((&theirs, "orchestrator")))),
        ),
    ] {
        let got = read(opts).await;
        assert!(!matches!(got, Ok(Ok(_))), "{who}: etcd answered {got:?}");
    }

    let out = Command::new(env!("CARGO_BIN_EXE_cairn-orchestrator"))
        .args([
            "--tls-dir",
            tls_dir,
            "--listen",
            "127.0.0.1:0",
            "--store-addr",
            &store,
        ])
        .args(["--ingest-addr", "", "--set"])
        .arg(format!("cluster.etcd_endpoints=http://{}", etcd.addr))
        .args(["--set", "cluster.advertise_addr=127.0.0.1:1"])
        .env_remove("CAIRN_ORCHESTRATOR_CONFIG")
        .env_remove("CAIRN_CONFIG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "started with a plaintext etcd: {err}"
    );
    assert!(err.contains(&format!("https://{}", etcd.addr)), "{err}");
}

/// A sandboxed program's live output is in the memory of the replica driving the run: asked
/// of another replica, WatchLogs is forwarded and the output arrives while the node runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_logs_of_a_run_come_through_a_replica_that_does_not_drive_it() {
    let Some(etcd) = start_etcd().await else {
        return;
    };
    let stack = match Stack::try_start(Options {
        ingest: false,
        sandbox: Sandbox::Required,
        tweak: |c| c.resume_on_start = false,
        ..Default::default()
    })
    .await
    {
        Ok(s) => s,
        Err(e) => {
            println!("SKIP: no sandbox backend can run here ({e})");
            return;
        }
    };
    let runner = stack.sandbox_addr.clone().unwrap();
    let replicas: Vec<Replica> = ["o0", "o1"]
        .iter()
        .map(|id| {
            let log = stack.dir.path().join(format!("{id}.log"));
            spawn_replica_with(
                id,
                &stack.store_addr,
                &etcd.addr,
                &log,
                &["--sandbox-addr", &runner],
            )
        })
        .collect();
    wait_members(&etcd.addr, &["o0", "o1"], 30).await;
    tokio::time::sleep(Duration::from_millis(800)).await;

    let graph = "nodes:\n  - id: job\n    type: sandbox_run\n    language: python\n    timeout_s: 60\n    code: |\n      import time\n      print('marker-early', flush=True)\n      time.sleep(3)\n      print('marker-late', flush=True)\n";
    // Submitted through o0 until o1 drives one.
    let mut run = None;
    for _ in 0..12 {
        let info = submit(&replicas[0].client, graph.into()).await;
        let info = wait_run(&replicas[0].client, &info.run_id, 30, "an owner", |i| {
            !i.replica.is_empty()
        })
        .await;
        if info.replica == "o1" {
            run = Some(info.run_id);
            break;
        }
    }
    let run = run.expect("no run driven by o1 in 12 submissions");
    let mut through_o0 = replicas[0].client.clone();
    let mut stream = through_o0
        .watch_logs(WatchLogsRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            node_id: "job".into(),
            follow: true,
            ..Default::default()
        })
        .await
        .expect("WatchLogs through o0")
        .into_inner();
    let mut out = String::new();
    let mut early_while_running = None;
    while let Some(c) = tokio::time::timeout(Duration::from_secs(60), stream.message())
        .await
        .expect("the stream ends by itself when the node does")
        .unwrap()
    {
        if c.stream == LogStream::Stdout as i32 {
            out.push_str(&String::from_utf8_lossy(&c.data));
        }
        if early_while_running.is_none() && out.contains("marker-early") {
            let info = get(&replicas[1].client, &run).await.unwrap();
            early_while_running = Some(info.state == TaskState::Working as i32);
        }
    }
    assert!(
        out.contains("marker-early") && out.contains("marker-late"),
        "{out:?}"
    );
    assert_eq!(
        early_while_running,
        Some(true),
        "the output did not come live"
    );
}

/// A chain of `n` write_file nodes, then a gate and one more node: the run is still
/// unfinished (at the gate) when a replica paused mid-chain comes back.
fn chain_then_gate(n: usize) -> String {
    let mut g = chain(n);
    g.push_str(&format!(
        "  - {{id: g, type: gate, reason: \"check\", needs: [c{}]}}\n\
         \x20 - {{id: z, type: write_file, path: \"docs/{{{{run_id}}}}/z.txt\", content: \"z\", needs: [g]}}\n",
        n - 1
    ));
    g
}

/// Sends `signal` to a replica's process.
fn signal(r: &Replica, signal: rustix::process::Signal) {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(r.child.id() as i32).unwrap(),
        signal,
    )
    .unwrap();
}

/// Submits `graph` through o0 until a run is driven by another replica; returns it and its
/// owner's index.
async fn run_driven_elsewhere(cl: &Cluster, graph: impl Fn() -> String) -> (String, usize) {
    let entry = &cl.replicas[0].client;
    for _ in 0..12 {
        let info = submit(entry, graph()).await;
        let info = wait_run(entry, &info.run_id, 30, "an owner", |i| {
            !i.replica.is_empty()
        })
        .await;
        if info.replica != "o0" {
            let idx = cl.replicas.iter().position(|r| r.id == info.replica);
            return (info.run_id, idx.unwrap());
        }
    }
    panic!("no run driven by a replica other than o0 in 12 submissions");
}

/// Nodes started more than once; each restart must follow a `task.resumed` (a node cut off
/// in flight by a handover is started once more by the next driver, never otherwise).
fn restarted_at_handovers(run: &str, events: &[Event]) -> Vec<String> {
    let mut open: HashMap<&str, bool> = HashMap::new();
    let mut resumed_since: HashMap<&str, bool> = HashMap::new();
    let mut again = Vec::new();
    for e in events {
        match e.r#type.as_str() {
            "task.resumed" => resumed_since.values_mut().for_each(|r| *r = true),
            "node.started" => {
                let id = e.node_id.as_str();
                if open.get(id).copied().unwrap_or(false) {
                    assert!(
                        resumed_since.get(id).copied().unwrap_or(false),
                        "run {run}: node {id} started again without a handover"
                    );
                    again.push(id.to_owned());
                }
                open.insert(id, true);
                resumed_since.insert(id, false);
            }
            "node.completed" | "node.failed" => {
                open.insert(&e.node_id, false);
            }
            _ => {}
        }
    }
    again
}

/// Approves the run's gate `g` through o0 and waits for the run to complete, with `nodes`
/// nodes each completed once, no gap, and a node started again only after a handover.
async fn approve_to_the_end(cl: &Cluster, run: &str, nodes: usize) -> Vec<Event> {
    let entry = &cl.replicas[0].client;
    entry
        .clone()
        .approve_gate(approve(run, "ann"))
        .await
        .unwrap();
    wait_run(entry, run, 30, "completed", |i| {
        i.state == TaskState::Completed as i32
    })
    .await;
    // Nothing moves after the end (no second driver left behind).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = cl.stack.events(run).await;
    let again = restarted_at_handovers(run, &events);
    assert_once_and_gapless(run, &events, nodes, &again);
    events
}

/// Healing bound after a membership change: the lease, the handover and 5 s.
fn heal_bound() -> Duration {
    Duration::from_secs(ttl_s() + 5) + Duration::from_millis(300)
}

/// Where its run is when the owner is stopped or cut off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Moment {
    /// During a node: a sandbox step is running (the runner goes on with it).
    Step,
    /// Mid-chain: write_file nodes one after another (inside one or between two).
    Chain,
    /// Between nodes: the run waits at its gate, no node in flight.
    Gate,
}

/// How long the sandbox step of `Moment::Step` runs.
const STEP_S: u64 = 4;

/// One sandbox step that runs `STEP_S` s and writes the step key and redelivery it was
/// given, then a gate and one more node.
fn step_then_gate() -> String {
    format!(
        "title: step\nnodes:\n\
         \x20 - id: step\n    type: sandbox_run\n    language: python\n    timeout_s: 120\n\
         \x20   allowed_prefixes: [\"docs/\"]\n    output_prefix: \"docs/{{{{run_id}}}}/step\"\n\
         \x20   code: |\n      import os, time\n      time.sleep({STEP_S})\n\
         \x20     open(\"/output/step.txt\", \"w\").write(os.environ[\"CAIRN_STEP_KEY\"] + \" \" + os.environ[\"CAIRN_STEP_REDELIVERY\"])\n\
         \x20 - {{id: g, type: gate, reason: \"check\", needs: [step]}}\n\
         \x20 - {{id: z, type: write_file, path: \"docs/{{{{run_id}}}}/z.txt\", content: \"z\", needs: [g]}}\n"
    )
}

impl Moment {
    /// The run's graph and its number of nodes.
    fn graph(self) -> (String, usize) {
        match self {
            Moment::Step => (step_then_gate(), 3),
            Moment::Chain => (chain_then_gate(40), 42),
            Moment::Gate => (gated("paused"), 3),
        }
    }

    /// The cluster that runs such a graph; None (SKIP) when a sandbox is needed and none can
    /// run here.
    async fn cluster(self, test: &str) -> Option<Cluster> {
        match self {
            Moment::Step => start_cluster_with(Sandbox::Required, test).await,
            _ => start_cluster().await,
        }
    }

    /// Waits until the run is at this moment.
    async fn reach(self, cl: &Cluster, run: &str) {
        match self {
            Moment::Step => {
                let deadline = Instant::now() + Duration::from_secs(60);
                while !cl
                    .stack
                    .events(run)
                    .await
                    .iter()
                    .any(|e| e.r#type == "sandbox_start" && e.node_id == "step")
                {
                    assert!(
                        Instant::now() < deadline,
                        "run {run}: the step never started"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Moment::Chain => cl.stack.wait_completed_nodes(run, 3, 30).await,
            Moment::Gate => {
                wait_run(&cl.replicas[0].client, run, 30, "input_required", |i| {
                    i.state == TaskState::InputRequired as i32
                })
                .await;
            }
        }
    }
}

/// Polls the run through `entry` for `during`; returns how long after the start a replica
/// other than `owner` was first seen driving it (None: not within `during`).
async fn first_driven_elsewhere(
    entry: &OrchestratorClient<Channel>,
    run: &str,
    owner: &str,
    during: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    let mut seen = None;
    while start.elapsed() < during {
        if seen.is_none() {
            let probe = tokio::time::timeout(Duration::from_secs(1), get(entry, run)).await;
            if let Ok(Ok(i)) = probe {
                if !i.replica.is_empty() && i.replica != owner {
                    seen = Some(start.elapsed());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen
}

/// The sandbox step was delivered under one step key, each delivery after the first one
/// redelivery higher, and its program's output is that of the delivery that completed.
async fn assert_one_key_per_step(cl: &Cluster, run: &str, events: &[Event]) {
    let key = format!("{run}/step/1");
    let deliveries: Vec<(String, u64)> = events
        .iter()
        .filter(|e| e.r#type == "node.started" && e.node_id == "step")
        .map(|e| {
            let d = data(e);
            (
                d["step_key"].as_str().unwrap_or_default().to_owned(),
                d["redelivery"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = (0..deliveries.len() as u64)
        .map(|r| (key.clone(), r))
        .collect();
    assert_eq!(deliveries, want, "run {run}: the step's deliveries");
    let last = deliveries.last().unwrap().1;
    assert_eq!(
        cl.stack
            .read_text(&format!("docs/{run}/step/step.txt"))
            .await,
        format!("{key} {last}"),
        "run {run}: the program saw the key and its redelivery"
    );
}

/// The replica driving a run is stopped (SIGSTOP: a paused container) for `pause` at `moment`
/// and then continued. Its lease lapses and another replica drives the run within the
/// healing bound of that change; once the paused one is back in the membership the run is
/// its own again and driven by it within the healing bound of the SIGCONT. The run then
/// completes with every node completed once, a node started again only after a handover (a
/// sandbox step under the same key, one redelivery higher), and no gap in its events.
async fn a_paused_owner_heals(pause: Duration, moment: Moment) {
    let test = format!("an owner paused {} s at {moment:?}", pause.as_secs());
    let Some(cl) = moment.cluster(&test).await else {
        return;
    };
    let entry = cl.replicas[0].client.clone();
    let (graph, nodes) = moment.graph();
    let (run, idx) = run_driven_elsewhere(&cl, || graph.clone()).await;
    moment.reach(&cl, &run).await;
    let owner = cl.replicas[idx].id.clone();
    signal(&cl.replicas[idx], rustix::process::Signal::STOP);
    // The lease lapses at most a TTL after the stop; that change heals within the bound.
    let taken = first_driven_elsewhere(&entry, &run, &owner, pause).await;
    signal(&cl.replicas[idx], rustix::process::Signal::CONT);
    let resumed = Instant::now();
    let adopt_bound = Duration::from_secs(ttl_s()) + heal_bound();
    if pause > adopt_bound {
        assert!(
            taken.is_some_and(|t| t <= adopt_bound),
            "{test}: run {run} not driven by another replica within {adopt_bound:?} of the stop (seen: {taken:?})"
        );
    }
    // Back in the membership: the run is its own again, and it drives it.
    let info = wait_run_within(
        &entry,
        &run,
        heal_bound(),
        "driven again by the replica that was paused",
        |i| i.replica == owner,
    )
    .await;
    println!(
        "{test}: run {run} driven by another replica {} after the stop; by {owner} again {} ms after SIGCONT ({})",
        taken.map_or("not".to_owned(), |t| format!("{} ms", t.as_millis())),
        resumed.elapsed().as_millis(),
        info.state
    );
    wait_run(&entry, &run, 60, "at its gate", |i| {
        i.state == TaskState::InputRequired as i32
    })
    .await;
    let events = approve_to_the_end(&cl, &run, nodes).await;
    if moment == Moment::Step {
        assert_one_key_per_step(&cl, &run, &events).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_5s_during_a_sandbox_step_heals() {
    a_paused_owner_heals(Duration::from_secs(5), Moment::Step).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_10s_during_a_sandbox_step_heals() {
    a_paused_owner_heals(Duration::from_secs(10), Moment::Step).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_15s_during_a_sandbox_step_heals() {
    a_paused_owner_heals(Duration::from_secs(15), Moment::Step).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_5s_mid_chain_heals() {
    a_paused_owner_heals(Duration::from_secs(5), Moment::Chain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_10s_mid_chain_heals() {
    a_paused_owner_heals(Duration::from_secs(10), Moment::Chain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_15s_mid_chain_heals() {
    a_paused_owner_heals(Duration::from_secs(15), Moment::Chain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_5s_at_a_gate_heals() {
    a_paused_owner_heals(Duration::from_secs(5), Moment::Gate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_10s_at_a_gate_heals() {
    a_paused_owner_heals(Duration::from_secs(10), Moment::Gate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_15s_at_a_gate_heals() {
    a_paused_owner_heals(Duration::from_secs(15), Moment::Gate).await;
}

/// The replica driving a run is cut off from etcd (a network partition: it still reaches the
/// store) at `moment` for `cut` s, then the cut heals. Another replica drives the run within
/// the healing bound of the lapsed lease, the cut-off one drives it again within the bound of
/// its rejoining, and the run completes once per node with no gap.
async fn a_partitioned_owner_heals(cut: Duration, moment: Moment) {
    let test = format!(
        "an owner cut off from etcd {} s at {moment:?}",
        cut.as_secs()
    );
    let Some(cl) = moment.cluster(&test).await else {
        return;
    };
    let entry = cl.replicas[0].client.clone();
    let (graph, nodes) = moment.graph();
    let (run, idx) = run_driven_elsewhere(&cl, || graph.clone()).await;
    moment.reach(&cl, &run).await;
    let owner = cl.replicas[idx].id.clone();
    cl.relays[idx].set_cut(true);
    let taken = first_driven_elsewhere(&entry, &run, &owner, cut).await;
    let adopt_bound = Duration::from_secs(ttl_s()) + heal_bound();
    assert!(
        taken.is_some_and(|t| t <= adopt_bound),
        "{test}: run {run} not driven by another replica within {adopt_bound:?} of the cut (seen: {taken:?})"
    );
    let others: Vec<&str> = ["o0", "o1", "o2"]
        .into_iter()
        .filter(|m| *m != owner)
        .collect();
    wait_members(&cl.etcd_addr, &others, 1).await;
    cl.relays[idx].set_cut(false);
    let healed = Instant::now();
    wait_run_within(
        &entry,
        &run,
        heal_bound(),
        "driven again by the replica that was cut off",
        |i| i.replica == owner,
    )
    .await;
    println!(
        "{test}: run {run} driven by another replica {} ms after the cut; by {owner} again {} ms after the heal",
        taken.unwrap().as_millis(),
        healed.elapsed().as_millis()
    );
    wait_members(&cl.etcd_addr, &["o0", "o1", "o2"], 1).await;
    wait_run(&entry, &run, 60, "at its gate", |i| {
        i.state == TaskState::InputRequired as i32
    })
    .await;
    let events = approve_to_the_end(&cl, &run, nodes).await;
    if moment == Moment::Step {
        assert_one_key_per_step(&cl, &run, &events).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_from_etcd_mid_chain_heals() {
    a_partitioned_owner_heals(Duration::from_secs(10), Moment::Chain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_from_etcd_during_a_sandbox_step_heals() {
    a_partitioned_owner_heals(Duration::from_secs(10), Moment::Step).await;
}

/// A replica joins a cluster whose runs wait at their gates: the runs it now owns are driven
/// by it within the healing bound of its joining, every run has one live driver, and all of
/// them complete once per node with no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_added_drives_the_runs_it_gains_within_the_bound() {
    let Some(mut cl) = start_cluster().await else {
        return;
    };
    let entry = cl.replicas[0].client.clone();
    let mut runs = Vec::new();
    for i in 0..24 {
        runs.push(submit(&entry, gated(&format!("added {i}"))).await.run_id);
    }
    for run in &runs {
        wait_run(&entry, run, 30, "input_required", |i| {
            i.state == TaskState::InputRequired as i32
        })
        .await;
    }
    let relay = Relay::start(cl.etcd_addr.clone()).await;
    let added = cl.spawn("o3", &relay, "o3.log");
    cl.replicas.push(added);
    cl.relays.push(relay);
    wait_members(&cl.etcd_addr, &["o0", "o1", "o2", "o3"], 30).await;
    let joined = Instant::now();
    let deadline = joined + heal_bound();
    let drivers = loop {
        let mut drivers = BTreeMap::new();
        for run in &runs {
            let replica = get(&entry, run)
                .await
                .map(|i| i.replica)
                .unwrap_or_default();
            drivers.insert(run.clone(), replica);
        }
        let settled =
            drivers.values().all(|r| !r.is_empty()) && drivers.values().any(|r| r == "o3");
        if settled {
            break drivers;
        }
        assert!(
            Instant::now() < deadline,
            "runs not all driven, o3 among the drivers, within {:?} of o3 joining: {drivers:?}",
            heal_bound()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "added o3: {} of {} runs driven by it {} ms after it joined",
        drivers.values().filter(|r| *r == "o3").count(),
        runs.len(),
        joined.elapsed().as_millis()
    );
    for run in &runs {
        approve_to_the_end(&cl, run, 3).await;
    }
}

/// The replica driving a run is killed and started again at once with the same member id
/// (a pod restarted in place): the run is driven again within the healing bound (counted from
/// when the new process holds the id) and completes with every node once and no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_restarted_with_the_same_member_id_heals() {
    let Some(mut cl) = start_cluster().await else {
        return;
    };
    let entry = cl.replicas[0].client.clone();
    let (run, idx) = run_driven_elsewhere(&cl, || chain_then_gate(40)).await;
    cl.stack.wait_completed_nodes(&run, 3, 30).await;
    let id = cl.replicas[idx].id.clone();
    let r = &mut cl.replicas[idx];
    r.child.kill().unwrap();
    r.child.wait().unwrap();
    cl.replicas[idx] = cl.spawn(&id, &cl.relays[idx], &format!("{id}-again.log"));
    let restarted = Instant::now();
    wait_run(
        &entry,
        &run,
        (heal_bound() + Duration::from_secs(ttl_s() + 1)).as_secs(),
        "driven again by the restarted replica, at its gate",
        |i| i.replica == id && i.state == TaskState::InputRequired as i32,
    )
    .await;
    println!(
        "restarted as {id}: run {run} driven again {} ms later",
        restarted.elapsed().as_millis()
    );
    approve_to_the_end(&cl, &run, 42).await;
}
