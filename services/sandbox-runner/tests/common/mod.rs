//! Test support: a runner on 127.0.0.1 over real gRPC, for each backend this host offers.
//! Docker and gvisor: required when CAIRN_REQUIRE_DOCKER=1, otherwise skipped (with a `SKIP:`
//! line) when no engine or image, or no runsc (or not root), is there. Local: skipped when
//! bubblewrap is missing.
#![allow(dead_code, clippy::unwrap_used)]

pub mod snapshots;

use std::time::Duration;

use cairn_proto::sandbox_runner_client::SandboxRunnerClient;
use cairn_proto::{FileContent, Limits, RunRequest, RunResult};
use cairn_sandbox_runner::{BackendChoice, Config, RunnerHandle};
use tonic::transport::Channel;

/// The sandbox image tests use (CAIRN_SANDBOX_IMAGE, default cairn-sandbox:latest).
pub fn image() -> String {
    std::env::var("CAIRN_SANDBOX_IMAGE").unwrap_or_else(|_| "cairn-sandbox:latest".into())
}

pub fn docker_required() -> bool {
    std::env::var("CAIRN_REQUIRE_DOCKER")
        .map(|v| v == "1")
        .unwrap_or(false)
}

/// Is a Docker engine with the image reachable? Err(reason) when not.
pub async fn docker_ready() -> Result<(), String> {
    let client = bollard::Docker::connect_with_local_defaults().map_err(|e| e.to_string())?;
    let client = tokio::time::timeout(Duration::from_secs(5), client.negotiate_version())
        .await
        .map_err(|_| "docker engine did not answer".to_string())?
        .map_err(|e| e.to_string())?;
    client.inspect_image(&image()).await.map_err(|e| {
        format!(
            "image {} missing ({e}); build it with deploy/images/build-images.sh",
            image()
        )
    })?;
    Ok(())
}

pub fn bwrap_ready() -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d.join("bwrap").is_file()) {
        Ok(())
    } else {
        Err("bubblewrap (bwrap) is not installed".into())
    }
}

/// Can the gvisor backend run here (runsc installed, running as root)? Err(reason) when not.
pub fn gvisor_ready() -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if !std::env::split_paths(&path).any(|d| d.join("runsc").is_file()) {
        return Err("gVisor's runsc is not installed (apt-get install runsc)".into());
    }
    if !rustix::process::geteuid().is_root() {
        return Err("the gvisor backend needs root".into());
    }
    Ok(())
}

/// Is the gvisor backend usable? Panics when CAIRN_REQUIRE_DOCKER=1 and it is not; prints a
/// SKIP line otherwise.
pub fn gvisor_usable(test: &str) -> bool {
    match gvisor_ready() {
        Ok(()) => true,
        Err(reason) if docker_required() => {
            panic!("CAIRN_REQUIRE_DOCKER=1 but the gvisor backend is not usable: {reason}")
        }
        Err(reason) => {
            println!("SKIP: {test} [gvisor]: {reason}");
            false
        }
    }
}

/// The `--backend` value of a choice.
pub fn backend_name(b: BackendChoice) -> &'static str {
    match b {
        BackendChoice::Auto => "auto",
        BackendChoice::Docker => "docker",
        BackendChoice::Local => "local",
        BackendChoice::Gvisor => "gvisor",
    }
}

/// Host processes of the gvisor sandboxes of the runner with `work_root` (runsc run, its
/// gofer and sandbox all name runsc's state directory there).
pub fn gvisor_processes(work_root: &std::path::Path) -> Vec<i32> {
    processes_with(&format!(
        "--root={}",
        work_root.join("gvisor/state").display()
    ))
}

/// Ids in the runsc state of the gvisor runner with `work_root`.
pub async fn gvisor_sandboxes(work_root: &std::path::Path) -> Vec<String> {
    let out = tokio::process::Command::new("runsc")
        .arg(format!(
            "--root={}",
            work_root.join("gvisor/state").display()
        ))
        .args(["list", "--quiet"])
        .output()
        .await
        .unwrap();
    text(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_owned())
        .collect()
}

/// Is the program `marker` names running? On gvisor it runs in gVisor's kernel, out of the
/// host's process list: a sandbox of the runner that has been up for 700 ms counts.
pub async fn program_started(r: &TestRunner, marker: &str) -> bool {
    if !r.case.gvisor() {
        return !processes_with(marker).is_empty();
    }
    if gvisor_sandboxes(r.work_root.path()).await.is_empty() {
        return false;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    true
}

/// Waits (up to 10 s) until at most `n` gvisor sandboxes remain; returns how many there are.
pub async fn wait_for_gvisor_sandboxes(work_root: &std::path::Path, n: usize) -> usize {
    let t0 = std::time::Instant::now();
    loop {
        let left = gvisor_sandboxes(work_root).await.len();
        if left <= n || t0.elapsed() > Duration::from_secs(10) {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One backend setting to test: docker, local or gvisor, cold or from the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Case {
    pub backend: BackendChoice,
    pub pool: bool,
}

impl Case {
    pub fn docker(&self) -> bool {
        self.backend == BackendChoice::Docker
    }

    pub fn gvisor(&self) -> bool {
        self.backend == BackendChoice::Gvisor
    }

    /// The backend's name in results (`docker`, `local`, `gvisor`).
    pub fn name(&self) -> &'static str {
        backend_name(self.backend)
    }
}

/// The cases to test on this host, printing SKIP lines for the others.
pub async fn backends(test: &str) -> Vec<Case> {
    let mut out = Vec::new();
    match docker_ready().await {
        Ok(()) => {
            out.push(Case {
                backend: BackendChoice::Docker,
                pool: false,
            });
            out.push(Case {
                backend: BackendChoice::Docker,
                pool: true,
            });
        }
        Err(reason) if docker_required() => {
            panic!("CAIRN_REQUIRE_DOCKER=1 but docker is not usable: {reason}")
        }
        Err(reason) => println!("SKIP: {test} [docker]: {reason}"),
    }
    match bwrap_ready() {
        Ok(()) => {
            out.push(Case {
                backend: BackendChoice::Local,
                pool: false,
            });
            out.push(Case {
                backend: BackendChoice::Local,
                pool: true,
            });
        }
        Err(reason) => println!("SKIP: {test} [local]: {reason}"),
    }
    if gvisor_usable(test) {
        for pool in [false, true] {
            out.push(Case {
                backend: BackendChoice::Gvisor,
                pool,
            });
        }
    }
    out
}

/// Cases without the warm pool (sessions, process tests).
pub async fn cold_backends(test: &str) -> Vec<Case> {
    backends(test)
        .await
        .into_iter()
        .filter(|c| !c.pool)
        .collect()
}

pub async fn docker_only(test: &str) -> bool {
    match docker_ready().await {
        Ok(()) => true,
        Err(reason) if docker_required() => {
            panic!("CAIRN_REQUIRE_DOCKER=1 but docker is not usable: {reason}")
        }
        Err(reason) => {
            println!("SKIP: {test} [docker]: {reason}");
            false
        }
    }
}

pub fn config(backend: BackendChoice, work_root: &std::path::Path) -> Config {
    Config {
        backend,
        image: image(),
        work_root: work_root.to_path_buf(),
        // One export of the image for every test runner (made once, safe to share).
        gvisor_rootfs_cache: std::env::temp_dir().join("cairn-test-gvisor-rootfs"),
        kill_grace_ms: 500,
        ..Config::default()
    }
}

/// A runner serving on an ephemeral port.
pub struct TestRunner {
    pub case: Case,
    pub client: SandboxRunnerClient<Channel>,
    pub handle: RunnerHandle,
    pub work_root: tempfile::TempDir,
    pub addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
}

impl TestRunner {
    pub async fn start(case: Case) -> TestRunner {
        Self::start_with(case, |_| {}).await
    }

    pub async fn start_with(case: Case, tweak: impl FnOnce(&mut Config)) -> TestRunner {
        let work_root = tempfile::Builder::new()
            .prefix("cairn-sbx-test")
            .tempdir()
            .unwrap();
        let mut config = config(case.backend, work_root.path());
        config.pool_size = usize::from(case.pool);
        tweak(&mut config);
        let (server, handle) = cairn_sandbox_runner::sandbox_service(config).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            let mut host = cairn_server::Host::new();
            host.add(server);
            host.serve(listener, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let channel = cairn_server::connect(&addr).unwrap();
        let client = SandboxRunnerClient::new(channel)
            .max_decoding_message_size(64 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024);
        TestRunner {
            case,
            client,
            handle,
            work_root,
            addr,
            stop: Some(stop),
            served: Some(served),
        }
    }

    /// With the pool: waits until a warm container (or waiting sandbox) is ready, so the next
    /// run uses it.
    pub async fn ready(&self) {
        if !self.case.pool {
            return;
        }
        let t0 = std::time::Instant::now();
        loop {
            let info = self
                .client
                .clone()
                .get_runner_info(cairn_proto::GetRunnerInfoRequest {})
                .await
                .unwrap();
            if info.into_inner().warm_containers > 0 {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "no warm container after 60 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs `req` (from the warm pool in pool cases, which the result must confirm).
    pub async fn run(&self, req: RunRequest) -> RunResult {
        self.ready().await;
        let out = self.client.clone().run(req).await.unwrap().into_inner();
        let rj: serde_json::Value = serde_json::from_str(&out.result_json).unwrap();
        assert_eq!(rj["warm"], self.case.pool, "{:?}: warm pool use", self.case);
        out
    }

    /// The runner's GetRunnerInfo answer.
    pub async fn info(&self) -> cairn_proto::RunnerInfo {
        self.client
            .clone()
            .get_runner_info(cairn_proto::GetRunnerInfoRequest {})
            .await
            .unwrap()
            .into_inner()
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            let _ = served.await;
        }
        self.handle.shutdown().await;
    }
}

/// Six concurrent runs (each sleeps 0.5 s, then prints its index) on a full pool of two whose
/// items `pool_items` lists (pool containers or waiting-sandbox directories). Asserts that all
/// succeed, exactly two from the pool, and that no new pool item appears until the first cold
/// run is done (refills yield to the runs that missed the pool). Returns the items before.
pub async fn burst_of_six_on_a_pool_of_two<F, Fut>(
    r: &TestRunner,
    mut pool_items: F,
) -> std::collections::BTreeSet<String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::collections::BTreeSet<String>>,
{
    let before = pool_items().await;
    assert_eq!(before.len(), 2, "{before:?}");
    let mut calls: futures::stream::FuturesUnordered<_> = (0..6)
        .map(|i| {
            let mut client = r.client.clone();
            async move {
                let req = python(&format!("import time; time.sleep(0.5); print({i})"));
                (i, client.run(req).await.unwrap().into_inner())
            }
        })
        .collect();
    // The two warm runs answer first; until the first cold one (the 3rd reply) is done, the
    // other cold runs are still going.
    let mut outs = Vec::new();
    let mut seen = before.clone();
    while outs.len() < 3 {
        tokio::select! {
            done = futures::StreamExt::next(&mut calls) => outs.push(done.unwrap()),
            () = tokio::time::sleep(Duration::from_millis(20)) => seen.extend(pool_items().await),
        }
    }
    assert_eq!(
        seen, before,
        "a refill started while runs that missed the pool were still running cold"
    );
    while let Some(done) = futures::StreamExt::next(&mut calls).await {
        outs.push(done);
    }
    outs.sort_by_key(|(i, _)| *i);
    let mut warm = 0;
    for (i, out) in &outs {
        assert_eq!(text(&out.stdout), format!("{i}\n"), "{out:?}");
        let rj: serde_json::Value = serde_json::from_str(&out.result_json).unwrap();
        warm += usize::from(rj["warm"] == true);
    }
    assert_eq!(warm, 2, "the two pool items serve two runs");
    before
}

pub fn python(code: &str) -> RunRequest {
    RunRequest {
        language: "python".into(),
        code: code.into(),
        ..Default::default()
    }
}

pub fn bash(code: &str) -> RunRequest {
    RunRequest {
        language: "bash".into(),
        code: code.into(),
        ..Default::default()
    }
}

pub fn with_timeout(mut req: RunRequest, ms: u64) -> RunRequest {
    let mut limits = req.limits.take().unwrap_or_default();
    limits.timeout_ms = ms;
    req.limits = Some(limits);
    req
}

pub fn with_limits(mut req: RunRequest, limits: Limits) -> RunRequest {
    req.limits = Some(limits);
    req
}

pub fn input(path: &str, content: &[u8]) -> FileContent {
    FileContent {
        path: path.into(),
        content: content.to_vec().into(),
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Containers (any state) whose name contains `needle`.
pub async fn containers_named(needle: &str) -> Vec<String> {
    let client = bollard::Docker::connect_with_local_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap();
    let filters = std::collections::HashMap::from([("name".to_string(), vec![needle.to_string()])]);
    let opts = bollard::query_parameters::ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    client
        .list_containers(Some(opts))
        .await
        .unwrap()
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .collect()
}

/// Containers labelled with `runner_id`.
pub async fn containers_of(runner_id: &str) -> Vec<String> {
    containers_labelled(&[format!("cairn.runner_id={runner_id}")]).await
}

/// Names of the containers that carry every one of `labels` (`key=value`).
pub async fn containers_labelled(labels: &[String]) -> Vec<String> {
    let client = bollard::Docker::connect_with_local_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap();
    let filters = std::collections::HashMap::from([("label".to_string(), labels.to_vec())]);
    let opts = bollard::query_parameters::ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    client
        .list_containers(Some(opts))
        .await
        .unwrap()
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .collect()
}

/// Host processes whose command line contains `needle`.
/// Waits (at most `secs`) until no process names `needle` in three checks in a row, 100 ms
/// apart: a process in the middle of an exec or of its exit can read as having no command
/// line once. Returns what the last check found (empty: none left).
pub async fn settled_processes_with(needle: &str, secs: u64) -> Vec<i32> {
    let t0 = std::time::Instant::now();
    let mut clean = 0;
    loop {
        let seen = processes_with(needle);
        clean = if seen.is_empty() { clean + 1 } else { 0 };
        if clean == 3 || t0.elapsed().as_secs() >= secs {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn processes_with(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let me = std::process::id() as i32;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                out.push(pid);
            }
        }
    }
    out
}

/// Running containers labelled with `runner_id`.
pub async fn running_containers_of(runner_id: &str) -> Vec<String> {
    let client = bollard::Docker::connect_with_local_defaults()
        .unwrap()
        .negotiate_version()
        .await
        .unwrap();
    let filters = std::collections::HashMap::from([
        (
            "label".to_string(),
            vec![format!("cairn.runner_id={runner_id}")],
        ),
        ("status".to_string(), vec!["running".to_string()]),
    ]);
    let opts = bollard::query_parameters::ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    client
        .list_containers(Some(opts))
        .await
        .unwrap()
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .collect()
}

/// The cgroup directories a runner keeps for its sandboxes (`cairn-sandbox-<runner_id>` in each
/// hierarchy under /sys/fs/cgroup).
pub fn runner_cgroups(runner_id: &str) -> Vec<std::path::PathBuf> {
    fn walk(dir: &std::path::Path, name: &str, depth: usize, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if entry.file_name() == name {
                out.push(entry.path());
            } else if depth > 0 {
                walk(&entry.path(), name, depth - 1, out);
            }
        }
    }
    let mut out = Vec::new();
    let name = format!("cairn-sandbox-{runner_id}");
    walk(std::path::Path::new("/sys/fs/cgroup"), &name, 4, &mut out);
    out
}

/// The `cairn-gvisor-<runner_id>` directories of a gvisor runner, in every hierarchy.
pub fn gvisor_runner_cgroups(runner_id: &str) -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|h| h.path().join(format!("cairn-gvisor-{runner_id}")))
        .filter(|d| d.exists())
        .collect()
}

/// The sandbox cgroups runsc made for a gvisor runner (`cairn-gvisor-<runner_id>/*`).
pub fn gvisor_cgroups(runner_id: &str) -> Vec<std::path::PathBuf> {
    let name = format!("cairn-gvisor-{runner_id}");
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|h| {
            std::fs::read_dir(h.path().join(&name))
                .into_iter()
                .flatten()
        })
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// The sandbox cgroups of a runner (children of its `runner_cgroups`).
pub fn sandbox_cgroups(runner_id: &str) -> Vec<std::path::PathBuf> {
    runner_cgroups(runner_id)
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Removes what a runner killed with -9 leaves in /sys/fs/cgroup (its sandboxes' cgroups,
/// once their processes are gone, and its own directories), so tests leave nothing.
pub async fn remove_runner_cgroups(runner_id: &str) {
    let t0 = std::time::Instant::now();
    while !runner_cgroups(runner_id).is_empty() && t0.elapsed() < Duration::from_secs(10) {
        for dir in sandbox_cgroups(runner_id)
            .into_iter()
            .chain(runner_cgroups(runner_id))
        {
            let _ = std::fs::remove_dir(dir);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The gvisor backend's (runsc makes them as `cairn-gvisor-<runner_id>/<sandbox>`).
    let t0 = std::time::Instant::now();
    loop {
        let parents = gvisor_runner_cgroups(runner_id);
        if parents.is_empty() || t0.elapsed() > Duration::from_secs(10) {
            break;
        }
        for dir in gvisor_cgroups(runner_id).into_iter().chain(parents) {
            let _ = std::fs::remove_dir(dir);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
