//! docker compose end to end (issue 7): the images built from this checkout's `cairn` binary,
//! deploy/compose/docker-compose.yml brought up under a project name of its own, the CLI and
//! gRPC from the host against it, `down` leaving no sandbox container behind, and the backup
//! and restore commands of docs/operations.md run as written. Compose v2 (`docker compose`) is
//! used where the machine has it, else v1 (`docker-compose`); CAIRN_COMPOSE="docker-compose"
//! (or "docker compose") picks one. With CAIRN_REQUIRE_DOCKER=1 these tests must run;
//! otherwise each prints a `SKIP:` line when Docker, compose or the `cairn` binary is missing.
//! tests/compose_test.sh builds the binary first and runs them. Every stack makes its own PKI
//! (the compose `certs` service, into a directory of the test's) and is driven over mutual TLS
//! with the `cli` identity.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient;
use cairn_proto::v1::{
    CloseSessionRequest, ExecRequest, GateDecisionRequest, GetRunRequest, NodeState,
    OpenSessionRequest, ReadFileRequest, RunInfo, RunRequest, SubmitRunRequest, TaskState,
};
use cairn_server::{Tls, TlsConfig};

const RUNNERS: [&str; 2] = ["sandbox-runner-1", "sandbox-runner-2"];
const WITHOUT_ORCHESTRATOR: [&str; 4] = [
    "artifact-store",
    "ingest",
    "sandbox-runner-1",
    "sandbox-runner-2",
];
const ALL: [&str; 7] = [
    "artifact-store",
    "ingest",
    "etcd",
    "orchestrator",
    "orchestrator-2",
    "sandbox-runner-1",
    "sandbox-runner-2",
];
/// The login token of the stacks' consoles.
const CONSOLE_TOKEN: &str = "compose-console-token-0123456789";
/// Writes 100 files of 15 MB to /output until a write fails; prints `written BYTES ERROR`.
const OUTPUT_FILLER: &str = "import errno, os\n\
written, err = 0, 'none'\n\
chunk = b'x' * (1 << 20)\n\
try:\n\
\x20   for i in range(100):\n\
\x20       with open('/output/f%03d' % i, 'wb') as f:\n\
\x20           left = 15_000_000\n\
\x20           while left > 0:\n\
\x20               n = f.write(chunk[:min(left, len(chunk))])\n\
\x20               f.flush(); os.fsync(f.fileno())\n\
\x20               written += n; left -= n\n\
except OSError as e:\n\
\x20   err = errno.errorcode.get(e.errno, str(e.errno))\n\
print('written', written, err)\n";

/// Bytes of the regular files under `dir` (0 when it does not exist).
fn du(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => du(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

fn docker_required() -> bool {
    std::env::var("CAIRN_REQUIRE_DOCKER").is_ok_and(|v| v == "1")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn show(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `cmd` to its end or kills it after `limit` (no test may hang).
fn run(cmd: &mut Command, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = pipe(Box::new(child.stdout.take().unwrap()));
    let err = pipe(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let o = Output {
                status: child.wait().unwrap(),
                stdout: out.join().unwrap(),
                stderr: err.join().unwrap(),
            };
            panic!("{what} did not finish within {limit:?}: {}", show(&o));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn ok(cmd: &mut Command, limit: Duration) -> String {
    exits(cmd, 0, limit)
}

/// Runs `cmd`, which must exit with `code`; returns its stdout.
fn exits(cmd: &mut Command, code: i32, limit: Duration) -> String {
    let what = format!("{cmd:?}");
    let o = run(cmd, limit);
    assert_eq!(o.status.code(), Some(code), "{what}: {}", show(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn docker(args: &[&str]) -> String {
    ok(Command::new("docker").args(args), Duration::from_secs(60))
}

/// The compose command: CAIRN_COMPOSE when set, else v2 (`docker compose`) where it answers,
/// else v1 (`docker-compose`); None when neither does.
fn compose_command(answers: &dyn Fn(&str, &[&str]) -> bool) -> Option<Vec<String>> {
    choose_compose(&std::env::var("CAIRN_COMPOSE").unwrap_or_default(), answers)
}

fn choose_compose(chosen: &str, answers: &dyn Fn(&str, &[&str]) -> bool) -> Option<Vec<String>> {
    let words = |c: &str| c.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    let candidates = if chosen.trim().is_empty() {
        vec![words("docker compose"), words("docker-compose")]
    } else {
        vec![words(chosen)]
    };
    candidates.into_iter().find(|c| {
        let mut args: Vec<&str> = c[1..].iter().map(String::as_str).collect();
        args.push("version");
        answers(&c[0], &args)
    })
}

/// What the tests need from this machine.
struct Host {
    compose: Vec<String>,
    cairn: PathBuf,
}

impl Host {
    /// None (after a `SKIP:` line) when something is missing and Docker is not required.
    fn probe(test: &str) -> Option<Host> {
        let skip = |reason: String| -> Option<Host> {
            assert!(
                !docker_required(),
                "{test}: CAIRN_REQUIRE_DOCKER=1 but {reason}"
            );
            println!("SKIP: {test}: {reason}");
            None
        };
        let answers = |program: &str, args: &[&str]| {
            Command::new("timeout")
                .arg("20")
                .arg(program)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !answers("docker", &["info"]) {
            return skip("the Docker engine does not answer (docker info failed)".into());
        }
        let Some(compose) = compose_command(&answers) else {
            return skip(
                "neither `docker compose` (v2) nor docker-compose (v1) is installed".into(),
            );
        };
        let cairn = match std::env::var_os("CAIRN_BIN") {
            Some(p) => PathBuf::from(p),
            // target/debug/deps/compose_test-* -> target/debug/cairn
            None => std::env::current_exe()
                .unwrap()
                .parent()
                .unwrap()
                .parent()
                .unwrap()
                .join("cairn"),
        };
        if !cairn.is_file() {
            return skip(format!(
                "no cairn binary at {} (cargo build -p cairn-cli, or set CAIRN_BIN)",
                cairn.display()
            ));
        }
        Some(Host { compose, cairn })
    }

    fn cairn(&self) -> Command {
        let mut c = Command::new(&self.cairn);
        c.env_remove("CAIRN_ADDR").env_remove("CAIRN_PROJECT");
        c
    }

    /// Does this binary have `cairn serve orchestrator` and `cairn run`?
    fn orchestrator_missing(&self) -> Option<String> {
        let works = |args: &[&str]| {
            self.cairn()
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let mut missing = Vec::new();
        if !works(&["serve", "orchestrator", "--help"]) {
            missing.push("`cairn serve orchestrator`");
        }
        if !works(&["run", "--help"]) {
            missing.push("`cairn run`");
        }
        (!missing.is_empty())
            .then(|| format!("{} not in this cairn binary yet", missing.join(" and ")))
    }

    /// Can the CLI address each service on its own (store, ingest, runner in other containers)?
    fn cli_has_service_addrs(&self) -> bool {
        let o = run(self.cairn().arg("--help"), Duration::from_secs(10));
        let help = String::from_utf8_lossy(&o.stdout);
        help.contains("--store-addr") && help.contains("--sandbox-addr")
    }

    /// Builds cairn-sandbox and cairn (from this binary) unless up to date; one build at a time.
    fn build_images(&self) -> Duration {
        let t = Instant::now();
        let lock = std::env::temp_dir().join("cairn-build-images.lock");
        let out = ok(
            Command::new("flock")
                .arg(lock)
                .arg(repo().join("deploy/images/build-images.sh"))
                .arg("--service")
                .env("CAIRN_BINARY", &self.cairn),
            Duration::from_secs(480),
        );
        eprintln!("{out}");
        t.elapsed()
    }
}

/// One compose project (unique name, its own runner ids, sandbox directory and PKI), taken
/// down when dropped.
struct Stack {
    project: String,
    compose: Vec<String>,
    dir: tempfile::TempDir,
    docker_gid: u32,
    runner_ids: Vec<String>,
    down: bool,
}

impl Stack {
    fn new(host: &Host, tag: &str) -> Stack {
        let project = format!("cairn-test-{tag}-{}", std::process::id());
        let dir = tempfile::Builder::new()
            .prefix("cairn-compose-")
            .tempdir()
            .unwrap();
        std::fs::write(dir.path().join("empty.env"), "").unwrap();
        let docker_gid = std::fs::metadata("/var/run/docker.sock")
            .map(|m| m.gid())
            .unwrap_or(0);
        let runner_ids = (1..=2).map(|i| format!("{project}-runner-{i}")).collect();
        Stack {
            project,
            compose: host.compose.clone(),
            dir,
            docker_gid,
            runner_ids,
            down: false,
        }
    }

    fn compose(&self) -> Command {
        let mut c = Command::new(&self.compose[0]);
        c.args(&self.compose[1..])
            .arg("-f")
            .arg(repo().join("deploy/compose/docker-compose.yml"))
            .arg("-p")
            .arg(&self.project)
            // Not deploy/compose/.env: a developer's settings must not change the test.
            .arg("--env-file")
            .arg(self.dir.path().join("empty.env"))
            .env("CAIRN_DOCKER_GID", self.docker_gid.to_string())
            .env("CAIRN_SANDBOX_DIR", self.dir.path().join("sandbox"))
            .env("CAIRN_RUNNER_ID_PREFIX", &self.project)
            .env("CAIRN_PKI_DIR", self.pki())
            .env("CAIRN_STORE_VOLUME", self.volume())
            // Empty: any free port on 127.0.0.1 (see `port`).
            .env("CAIRN_STORE_PORT", "")
            .env("CAIRN_ORCHESTRATOR_PORT", "")
            .env("CAIRN_ORCHESTRATOR_2_PORT", "")
            .env("CAIRN_CONSOLE_PORT", "")
            .env("CAIRN_CONSOLE_TOKEN", CONSOLE_TOKEN);
        // The /metrics pages as well: several stacks run at once.
        for port in [
            "CAIRN_STORE_METRICS_PORT",
            "CAIRN_INGEST_METRICS_PORT",
            "CAIRN_ORCHESTRATOR_METRICS_PORT",
            "CAIRN_ORCHESTRATOR_2_METRICS_PORT",
        ] {
            c.env(port, "");
        }
        c
    }

    /// `bash` with `docker compose ...` and `docker-compose ...` both meaning this stack's
    /// compose (the commands of docs/operations.md, run as written), in directory `cwd`.
    fn shell(&self, cwd: &Path, script: &str) -> Command {
        let compose = self.compose();
        let quote =
            |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', "'\\''"));
        let argv: Vec<String> = std::iter::once(compose.get_program())
            .chain(compose.get_args())
            .map(quote)
            .collect();
        let wrappers = format!(
            "docker-compose() {{ command {} \"$@\"; }}\n\
             docker() {{ if [ \"${{1:-}}\" = compose ]; then shift; docker-compose \"$@\"; else command docker \"$@\"; fi; }}\n",
            argv.join(" ")
        );
        let mut c = Command::new("bash");
        c.current_dir(cwd)
            .args(["-euo", "pipefail", "-c"])
            .arg(format!("{wrappers}{script}"));
        for (k, v) in compose.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }

    /// The PKI the `certs` service writes for this stack.
    fn pki(&self) -> PathBuf {
        self.dir.path().join("pki")
    }

    /// The `cli` identity's files (written when the stack first comes up).
    fn tls(&self) -> Tls {
        TlsConfig::dir(self.pki().join("cli"))
            .load("cli")
            .unwrap()
            .expect("TLS settings")
    }

    /// The host's `cairn`, as the `cli` identity of this stack's PKI.
    fn cairn(&self, host: &Host) -> Command {
        let mut c = host.cairn();
        c.env("CAIRN_TLS_DIR", self.pki().join("cli"));
        c
    }

    fn run(&self, args: &[&str]) -> String {
        let o = run(self.compose().args(args), Duration::from_secs(240));
        assert!(
            o.status.success(),
            "compose {args:?} failed: {}\n--- logs ---\n{}",
            show(&o),
            self.logs()
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn logs(&self) -> String {
        let o = run(
            self.compose().args(["logs", "--no-color", "--tail", "60"]),
            Duration::from_secs(60),
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn up(&self, services: &[&str]) {
        let mut args = vec!["up", "-d"];
        args.extend_from_slice(services);
        self.run(&args);
    }

    fn container(&self, service: &str) -> String {
        let id = self.run(&["ps", "-q", service]).trim().to_owned();
        assert!(!id.is_empty(), "no container for {service}");
        id
    }

    /// Waits until every service's container is running and its HEALTHCHECK says healthy.
    fn wait_healthy(&self, services: &[&str], limit: Duration) {
        let deadline = Instant::now() + limit;
        let ids: Vec<(String, String)> = services
            .iter()
            .map(|s| (s.to_string(), self.container(s)))
            .collect();
        loop {
            let mut waiting = Vec::new();
            for (service, id) in &ids {
                let state = docker(&[
                    "inspect",
                    "-f",
                    "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}",
                    id,
                ]);
                match state.split_whitespace().collect::<Vec<_>>()[..] {
                    ["running", "healthy"] => {}
                    ["running", "unhealthy"] | ["exited", ..] | ["dead", ..] => {
                        panic!("{service} is {}:\n{}", state.trim(), self.logs())
                    }
                    _ => waiting.push(format!("{service}: {}", state.trim())),
                }
            }
            if waiting.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not healthy within {limit:?}: {waiting:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// 127.0.0.1:PORT published for the service's 7070.
    fn published(&self, service: &str) -> String {
        self.published_port(service, 7070)
    }

    /// 127.0.0.1:PORT published for the service's `port`.
    fn published_port(&self, service: &str, port: u16) -> String {
        let addr = self
            .run(&["port", service, &port.to_string()])
            .trim()
            .to_owned();
        assert!(
            addr.starts_with("127.0.0.1:"),
            "{service} published on {addr:?}, expected 127.0.0.1 only"
        );
        addr
    }

    /// The container's address on one of its networks (the host reaches compose bridge
    /// networks directly, internal ones included): for services that publish no port.
    fn reach(&self, service: &str) -> String {
        self.reach_port(service, 7070)
    }

    /// [`Stack::reach`] for another port of the service.
    fn reach_port(&self, service: &str, port: u16) -> String {
        let ips = docker(&[
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
            &self.container(service),
        ]);
        let ip = ips
            .split_whitespace()
            .next()
            .unwrap_or_else(|| panic!("{service} has no address"));
        format!("{ip}:{port}")
    }

    /// Names of sandbox containers (any state) labelled with this stack's runner ids.
    fn sandbox_containers(&self) -> Vec<String> {
        let mut names = Vec::new();
        for id in &self.runner_ids {
            let out = docker(&[
                "ps",
                "-a",
                "--filter",
                &format!("label=cairn.runner_id={id}"),
                "--format",
                "{{.Names}}",
            ]);
            names.extend(out.lines().map(str::to_owned));
        }
        names
    }

    fn volume(&self) -> String {
        format!("{}_store-data", self.project)
    }

    /// Files of project `default` in the store's named volume, read by a throwaway container.
    fn volume_files(&self) -> BTreeSet<String> {
        let base =
            std::env::var("CAIRN_BASE_IMAGE").unwrap_or_else(|_| "cairn-base:bookworm".into());
        let mount = format!("{}:/data:ro", self.volume());
        let root = "/data/projects/default/";
        let found = docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            &mount,
            &base,
            "find",
            root,
            "-type",
            "f",
        ]);
        found
            .lines()
            .filter_map(|l| l.strip_prefix(root))
            .map(str::to_owned)
            .collect()
    }

    /// `compose down -v`; returns how long it took.
    fn down(&mut self) -> Duration {
        let t = Instant::now();
        self.run(&["down", "-v", "--remove-orphans"]);
        self.down = true;
        t.elapsed()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if !self.down {
            let _ = run(
                self.compose()
                    .args(["down", "-v", "--remove-orphans", "-t", "5"]),
                Duration::from_secs(120),
            );
        }
        // Whatever a failed test left: never leak containers onto the engine.
        for name in self.sandbox_containers() {
            let _ = Command::new("docker")
                .args(["rm", "-f", "-v", &name])
                .output();
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A runner dialled by its container's address: its certificate names the identity.
async fn runner_client(addr: &str, tls: &Tls) -> SandboxRunnerClient<tonic::transport::Channel> {
    SandboxRunnerClient::new(
        cairn_server::endpoint(addr, Some(tls), Some("sandbox-runner"))
            .unwrap()
            .connect_lazy(),
    )
}

/// `docker-compose up`, then from the host: `cairn store` against the published store, `cairn
/// ingest` against the ingest container, code on both runners (sibling containers through the
/// host's Docker socket) and a session whose workspace is a host path, the files found in the
/// store's named volume; `docker-compose down -v` leaves no sandbox container and no volume.
#[test]
fn compose_stack_serves_the_cli_and_leaves_nothing_behind() {
    let test = "compose_stack_serves_the_cli_and_leaves_nothing_behind";
    let Some(host) = Host::probe(test) else {
        return;
    };
    let t0 = Instant::now();
    let images = host.build_images();

    let orchestrator_missing = host.orchestrator_missing();
    let services: &[&str] = match &orchestrator_missing {
        None => &ALL,
        Some(why) => {
            println!("SKIP: {test}: the orchestrator service is left out ({why})");
            &WITHOUT_ORCHESTRATOR
        }
    };
    let mut stack = Stack::new(&host, "cli");
    let t_up = Instant::now();
    stack.up(services);
    stack.wait_healthy(services, Duration::from_secs(120));
    let up = t_up.elapsed();
    let store = stack.published("artifact-store");
    if orchestrator_missing.is_none() {
        let orch = stack.published("orchestrator");
        ok(
            stack.cairn(&host).args(["--addr", &orch, "health"]),
            Duration::from_secs(20),
        );
    }
    let work = stack.dir.path();

    // The store, from the host through its published port.
    let hello = work.join("hello.txt");
    std::fs::write(&hello, "héllo from the host\n").unwrap();
    ok(
        stack
            .cairn(&host)
            .args(["--addr", &store, "store", "put"])
            .arg(&hello)
            .arg("docs/compose/hello.txt"),
        Duration::from_secs(30),
    );
    let got = work.join("got.txt");
    ok(
        stack
            .cairn(&host)
            .args(["--addr", &store, "store", "get", "docs/compose/hello.txt"])
            .arg(&got),
        Duration::from_secs(30),
    );
    assert_eq!(std::fs::read(&got).unwrap(), std::fs::read(&hello).unwrap());
    // Mutual TLS only: a plaintext client (no PKI) gets nothing from the published port.
    let plaintext = run(
        host.cairn()
            .env_remove("CAIRN_TLS_DIR")
            .args(["--addr", &store, "store", "get", "docs/compose/hello.txt"])
            .arg(work.join("plain.txt")),
        Duration::from_secs(30),
    );
    assert!(
        !plaintext.status.success() && !work.join("plain.txt").exists(),
        "a plaintext client read from the store: {}",
        show(&plaintext)
    );
    let health = runtime().block_on(async {
        let plain = cairn_server::connect(&store).unwrap();
        cairn_server::serving(plain, "", Duration::from_secs(10)).await
    });
    assert!(
        health.is_err(),
        "plaintext health check answered: {health:?}"
    );
    let refused = run(
        stack
            .cairn(&host)
            .args(["--addr", &store, "store", "put"])
            .arg(&got)
            .arg("docs/../escape.txt"),
        Duration::from_secs(30),
    );
    assert!(
        !refused.status.success(),
        "a traversal path was accepted: {}",
        show(&refused)
    );

    // ingest, in its container, writing through the store container.
    let run_id = format!("compose-{}", std::process::id());
    let doc = work.join("doc.md");
    std::fs::write(
        &doc,
        "# compose\n\n```python file=src/hello.py\nprint('hello from ingest')\n```\n\n```text file=../escape.txt\nno\n```\n",
    )
    .unwrap();
    // One block rejected: the command exits 4 (partial) and prints the manifest.
    let manifest = exits(
        stack
            .cairn(&host)
            // The container's address: its certificate names the service.
            .args(["--tls-server-name", "ingest"])
            // `cairn ingest` claims the run at the store first.
            .args(["--store-addr", &store])
            .args(["--addr", &stack.reach("ingest"), "--json", "ingest"])
            .arg(&doc)
            .args(["--run", &run_id, "--node", "n1"]),
        4,
        Duration::from_secs(30),
    );
    let manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    assert_eq!(manifest["summary"]["written"], 1, "{manifest}");
    assert_eq!(manifest["summary"]["rejected"], 1, "{manifest}");
    let listed = ok(
        stack
            .cairn(&host)
            .args(["--addr", &store, "store", "ls", "-r", "workspace"]),
        Duration::from_secs(30),
    );
    assert!(listed.contains("workspace/src/hello.py"), "{listed}");

    let rt = runtime();
    let tls = stack.tls();
    // A run that writes 100 files of 15 MB: the runner in its container may not mount, yet
    // /output holds at most max_total_output_bytes (256 MiB by default): ENOSPC, the result
    // says writable_area_full, nothing is published, and the runner's directory on the host
    // holds none of it. The runs below (runner-1 again) show the next run works.
    let full = rt
        .block_on(async {
            runner_client(&stack.reach("sandbox-runner-1"), &tls)
                .await
                .run(RunRequest {
                    run_id: run_id.clone(),
                    node_id: "fills-output".into(),
                    language: "python".into(),
                    code: OUTPUT_FILLER.into(),
                    ..Default::default()
                })
                .await
        })
        .unwrap_or_else(|e| panic!("the filling run: {e}\n{}", stack.logs()))
        .into_inner();
    let said = String::from_utf8_lossy(&full.stdout).into_owned();
    let written: u64 = said
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no written line: {said:?} {full:?}"));
    assert!(
        said.trim_end().ends_with("ENOSPC"),
        "100 x 15 MB were not stopped by ENOSPC: {said:?} stderr {:?}",
        String::from_utf8_lossy(&full.stderr)
    );
    assert!(written <= 256 << 20, "{written} bytes written past the cap");
    assert!(full.writable_area_full, "{full:?}");
    assert!(full.output_files.is_empty() && full.outputs_truncated);
    assert!(
        full.rejected_outputs.iter().all(|o| o.reason == "no_space")
            && !full.rejected_outputs.is_empty(),
        "{:?}",
        full.rejected_outputs
    );
    let on_host = du(&work.join("sandbox"));
    assert!(
        on_host < 16 << 20,
        "the runners' directories on the host hold {on_host} bytes"
    );

    // Both runners start sandboxes as siblings through the host's Docker socket.
    for (service, runner_id) in RUNNERS.iter().zip(&stack.runner_ids) {
        let addr = stack.reach(service);
        let result = rt.block_on(async {
            runner_client(&addr, &tls)
                .await
                .run(RunRequest {
                    run_id: run_id.clone(),
                    node_id: format!("on-{service}"),
                    language: "python".into(),
                    code: "print(1)\nopen('/output/result.txt', 'w').write('ok')\n".into(),
                    ..Default::default()
                })
                .await
        });
        let result = result
            .unwrap_or_else(|e| panic!("{service}: {e}\n{}", stack.logs()))
            .into_inner();
        assert_eq!(result.exit_code, 0, "{service}: {result:?}");
        // runner-1's area is fresh after the filling run above.
        assert!(!result.writable_area_full, "{service}: {result:?}");
        assert_eq!(String::from_utf8_lossy(&result.stdout), "1\n");
        assert_eq!(&result.runner_id, runner_id);
        assert_eq!(result.backend, "docker");
        let files: Vec<(&str, &[u8])> = result
            .output_files
            .iter()
            .map(|f| (f.path.as_str(), &f.content[..]))
            .collect();
        assert_eq!(files, vec![("result.txt", &b"ok"[..])]);
    }

    // A session's /workspace and /tmpfs are tmpfs mounts the engine makes (the runner may not
    // mount), of the cap each: the 100 x 15 MB stop at ENOSPC there too, the result says so,
    // the host holds none of it, and the runner's tools reach the files (it shares the host's
    // pid namespace).
    let addr = stack.reach("sandbox-runner-1");
    let session = rt.block_on(async {
        let mut c = runner_client(&addr, &tls).await;
        let s = c
            .open_session(OpenSessionRequest {
                run_id: run_id.clone(),
                node_id: "session".into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        let execs = c.clone();
        let exec = |command: String| {
            let (mut c, session_id) = (execs.clone(), s.session_id.clone());
            async move {
                c.exec(ExecRequest {
                    session_id,
                    command,
                    ..Default::default()
                })
                .await
                .map(|r| r.into_inner())
            }
        };
        let small = exec(
            "echo written > /workspace/a.txt && cat /workspace/a.txt && id -u && stat -f -c %T /workspace"
                .into(),
        )
        .await?;
        let read = c
            .read_file(ReadFileRequest {
                session_id: s.session_id.clone(),
                path: "a.txt".into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        let filled = exec(format!(
            "cd /workspace && python3 - <<'EOF'\n{}EOF\n",
            OUTPUT_FILLER.replace("/output/", "/workspace/")
        ))
        .await?;
        let on_host = du(&work.join("sandbox"));
        c.close_session(CloseSessionRequest {
            session_id: s.session_id,
        })
        .await?;
        Ok::<_, tonic::Status>((small, read, filled, on_host))
    });
    let (exec, read, filled, on_host) =
        session.unwrap_or_else(|e| panic!("session: {e}\n{}", stack.logs()));
    assert_eq!(exec.exit_code, 0, "{exec:?}");
    assert_eq!(
        String::from_utf8_lossy(&exec.stdout),
        "written\n10001\ntmpfs\n"
    );
    assert_eq!(&read.content[..], b"written\n");
    let said = String::from_utf8_lossy(&filled.stdout).into_owned();
    assert!(
        said.trim_end().ends_with("ENOSPC"),
        "a session's 100 x 15 MB were not stopped by ENOSPC: {said:?} stderr {:?}",
        String::from_utf8_lossy(&filled.stderr)
    );
    let written: u64 = said
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no written line: {said:?}"));
    assert!(written <= 256 << 20, "{written} bytes written past the cap");
    assert!(filled.writable_area_full, "{filled:?}");
    assert!(
        on_host < 16 << 20,
        "the runners' directories on the host hold {on_host} bytes while a session is full"
    );

    // `cairn sandbox run` needs the store and a runner, which compose puts at two addresses.
    if host.cli_has_service_addrs() {
        let sandbox_run = format!("{run_id}-cli");
        let out = ok(
            stack.cairn(&host).args([
                "--store-addr",
                &store,
                "--sandbox-addr",
                &stack.reach("sandbox-runner-2"),
                "--tls-server-name",
                "sandbox-runner",
                "--json",
                "sandbox",
                "run",
                "--code",
                "print(1)\nopen('/output/cli.txt', 'w').write('cli')",
                "--run",
                &sandbox_run,
            ]),
            Duration::from_secs(60),
        );
        let summary: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(summary["exit_code"], 0, "{summary}");
        ok(
            stack.cairn(&host).args([
                "--addr",
                &store,
                "store",
                "stat",
                &format!(".cairn/runs/{sandbox_run}/sandbox/result.json"),
            ]),
            Duration::from_secs(30),
        );
    } else {
        println!(
            "SKIP: {test}: `cairn sandbox run` against compose (the CLI has no --store-addr/--sandbox-addr to reach the store and a runner at different addresses)"
        );
    }

    // The files are in the named volume, where a backup would find them.
    let found = stack.volume_files();
    for path in [
        "docs/compose/hello.txt",
        "workspace/src/hello.py",
        &format!(".cairn/runs/{run_id}/ingest/n1.json"),
    ] {
        assert!(found.contains(path), "{path} not in the volume: {found:?}");
    }
    assert!(!found.iter().any(|p| p.contains("escape.txt")), "{found:?}");

    let down = stack.down();
    let left = stack.sandbox_containers();
    assert!(
        left.is_empty(),
        "sandbox containers left after down: {left:?}"
    );
    let volumes = docker(&[
        "volume",
        "ls",
        "-q",
        "--filter",
        &format!("name={}", stack.volume()),
    ]);
    assert!(
        volumes.trim().is_empty(),
        "volume left after down -v: {volumes}"
    );
    eprintln!(
        "{test}: images {:.1}s, up+healthy {:.1}s, down {:.1}s, total {:.1}s",
        images.as_secs_f64(),
        up.as_secs_f64(),
        down.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}

/// The README's example through compose: `cairn run examples/hello/graph.yaml` from the host
/// against the published orchestrator (agent replayed from its cassette, ingest, a sandbox run
/// on a runner container, the gate approved), completed, its files in the store's volume; then
/// the run in the console container (`cairn serve console`, published on 127.0.0.1, dialling
/// the services over mutual TLS): a login with its token and the run's page.
#[test]
fn compose_runs_the_example() {
    let test = "compose_runs_the_example";
    let Some(host) = Host::probe(test) else {
        return;
    };
    if let Some(why) = host.orchestrator_missing() {
        println!("SKIP: {test}: {why}");
        return;
    }
    host.build_images();
    let mut stack = Stack::new(&host, "example");
    let services = [&ALL[..], &["console"]].concat();
    stack.up(&services);
    stack.wait_healthy(&services, Duration::from_secs(120));
    let orch = stack.published("orchestrator");
    let run_id = format!("compose-example-{}", std::process::id());
    let t = Instant::now();
    let out = run(
        stack
            .cairn(&host)
            .args(["--addr", &orch, "--json", "run"])
            .arg(repo().join("examples/hello/graph.yaml"))
            .args(["--run-id", &run_id, "--approve-gates"]),
        Duration::from_secs(240),
    );
    assert!(
        out.status.success(),
        "cairn run of the example failed: {}\n--- logs ---\n{}",
        show(&out),
        stack.logs()
    );
    let info: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", show(&out)));
    assert_eq!(info["state"], "completed", "{info}");

    let found = stack.volume_files();
    for path in [
        format!("docs/hello/{run_id}/design.md"),
        format!("docs/hello/{run_id}/report.md"),
        "workspace/hello/greeter.py".to_string(),
        "workspace/hello/test_greeter.py".to_string(),
        format!(".cairn/runs/{run_id}/events.jsonl"),
    ] {
        assert!(
            found.contains(&path),
            "{path} not in the store volume: {found:?}"
        );
    }

    let console = stack.published_port("console", 7480);
    let page = runtime().block_on(console_run_page(&console, &run_id));
    assert!(page.contains(&run_id), "{page}");
    assert!(page.contains("completed"), "{page}");
    assert!(
        page.contains("task.completed"),
        "the run's events (events.jsonl, read from the store): {page}"
    );
    // Every service's /metrics counts the calls it served: published on loopback, the
    // runners' on their internal network only (a scraper joins it).
    for service in [
        "artifact-store",
        "orchestrator",
        "ingest",
        "sandbox-runner-1",
    ] {
        let at = if service.starts_with("sandbox-runner") {
            stack.reach_port(service, 9464)
        } else {
            stack.published_port(service, 9464)
        };
        let page = runtime().block_on(async {
            reqwest::get(format!("http://{at}/metrics"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        });
        assert!(
            page.contains("cairn_rpc_server_requests_total{"),
            "{service} /metrics: {page}"
        );
    }
    stack.down();
    let left = stack.sandbox_containers();
    assert!(
        left.is_empty(),
        "sandbox containers left after down: {left:?}"
    );
    eprintln!(
        "{test}: the example ran in {:.1}s",
        t.elapsed().as_secs_f64()
    );
}

/// Logs in to the console at `addr` (127.0.0.1:PORT) as a browser would (the login form's CSRF
/// token, the console's own Origin, the session cookie) and returns the page of `run_id` in
/// project `default`; a wrong token is refused first.
async fn console_run_page(addr: &str, run_id: &str) -> String {
    let base = format!("http://{addr}");
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    assert_eq!(ready.text().await.unwrap(), "ready\n");
    let cookie_of = |r: &reqwest::Response| {
        r.headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|v| v.strip_prefix("cairn_console="))
            .map(|v| v.split(';').next().unwrap_or_default().to_owned())
    };
    let run = format!("/projects/default/runs/{run_id}");
    let form = http
        .get(format!("{base}/login?next={run}"))
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), 200);
    let cookie = cookie_of(&form).expect("a session cookie");
    let body = form.text().await.unwrap();
    let csrf = body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the form's CSRF token")
        .to_owned();
    let login = |token: &'static str| {
        http.post(format!("{base}/login"))
            .header("cookie", format!("cairn_console={cookie}"))
            .header("origin", &base)
            .header("content-type", "application/x-www-form-urlencoded")
            // Every value is made of letters, digits, `-` and `/`: nothing to escape.
            .body(format!(
                "csrf={csrf}&name=compose&token={token}&next={}",
                run.replace('/', "%2F")
            ))
            .send()
    };
    assert_eq!(login("not-the-console-token").await.unwrap().status(), 401);
    let ok = login(CONSOLE_TOKEN).await.unwrap();
    assert_eq!(ok.status(), 303);
    assert_eq!(ok.headers()["location"], run.as_str());
    let session = cookie_of(&ok).expect("a new session cookie");
    let page = http
        .get(format!("{base}{run}"))
        .header("cookie", format!("cairn_console={session}"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    page.text().await.unwrap()
}

/// `docker-compose down` while sandboxes run: each runner gets SIGTERM and must remove its
/// containers (runs and sessions) before its stop_grace_period ends, else Docker SIGKILLs it
/// and they stay behind.
#[test]
fn compose_down_removes_sandboxes_in_flight() {
    let test = "compose_down_removes_sandboxes_in_flight";
    let Some(host) = Host::probe(test) else {
        return;
    };
    host.build_images();
    let mut stack = Stack::new(&host, "down");
    stack.up(&RUNNERS);
    stack.wait_healthy(&RUNNERS, Duration::from_secs(90));

    let rt = runtime();
    let tls = stack.tls();
    let mut calls = Vec::new();
    for service in RUNNERS {
        let addr = stack.reach(service);
        let tls = tls.clone();
        calls.push(rt.spawn(async move {
            runner_client(&addr, &tls)
                .await
                .run(RunRequest {
                    run_id: "down-test".into(),
                    node_id: "sleeper".into(),
                    language: "python".into(),
                    code: "import time\nprint('started', flush=True)\ntime.sleep(300)\n".into(),
                    limits: Some(cairn_proto::v1::Limits {
                        timeout_ms: 300_000,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
        }));
    }
    let addr = stack.reach("sandbox-runner-1");
    rt.block_on(async {
        runner_client(&addr, &tls)
            .await
            .open_session(OpenSessionRequest {
                run_id: "down-test".into(),
                node_id: "session".into(),
                ..Default::default()
            })
            .await
    })
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while stack.sandbox_containers().len() < 3 {
        assert!(
            Instant::now() < deadline,
            "sandboxes did not start: {:?}\n{}",
            stack.sandbox_containers(),
            stack.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let down = stack.down();
    let left = stack.sandbox_containers();
    assert!(
        left.is_empty(),
        "after `docker-compose down` ({down:.1?}) these sandbox containers are still there: {left:?}; \
         on SIGTERM the runner must stop and remove its sandboxes itself (in-flight runs included) \
         within its stop_grace_period (30 s)"
    );
    for call in calls {
        // The calls ended (with whatever answer) instead of hanging on a dead runner.
        let _ = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), call).await })
            .expect("Run call still open");
    }
    eprintln!(
        "{test}: down with 3 sandboxes in flight took {:.1}s",
        down.as_secs_f64()
    );
}

/// `cairn run` against compose while one runner is killed mid-run: the run completes on the
/// other runner; the restarted runner removes what its predecessor left; `down` leaves nothing.
#[test]
fn compose_run_completes_when_a_runner_dies() {
    let test = "compose_run_completes_when_a_runner_dies";
    let Some((host, mut stack)) = whole_stack(test, "failover") else {
        return;
    };
    let orch = stack.published("orchestrator");
    let store = stack.published("artifact-store");
    let runner_1 = stack.container("sandbox-runner-1");

    let log = stack.dir.path().join("cairn-run.log");
    let mut child = stack
        .cairn(&host)
        .args(["--addr", &orch, "--json", "run"])
        .arg(repo().join("tests/compose/failover.yaml"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .spawn()
        .unwrap();
    let output = |log: &Path| {
        format!(
            "{}\n{}",
            std::fs::read_to_string(log).unwrap_or_default(),
            std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
        )
    };

    // Kill runner 1 (SIGKILL: no clean-up) once it is running a node of the run.
    let label = |c: &str, key: &str| {
        docker(&[
            "inspect",
            "-f",
            &format!("{{{{index .Config.Labels \"{key}\"}}}}"),
            c,
        ])
        .trim()
        .to_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let run_id = loop {
        let busy = docker(&[
            "ps",
            "-q",
            "--filter",
            &format!("label=cairn.runner_id={}", stack.runner_ids[0]),
            "--filter",
            "label=cairn.kind=run",
        ]);
        if let Some(c) = busy.lines().next() {
            break label(c, "cairn.run_id");
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "cairn run ended ({status}) before runner 1 got work: {}\n{}",
                output(&log),
                stack.logs()
            );
        }
        assert!(
            Instant::now() < deadline,
            "runner 1 got no work: {}\n{}",
            output(&log),
            stack.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    docker(&["kill", &runner_1]);
    let killed = Instant::now();

    // Which runners ran nodes of this run (seen while their containers exist).
    let mut runners_seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        let ids = docker(&[
            "ps",
            "-a",
            "--filter",
            &format!("label=cairn.run_id={run_id}"),
            "--format",
            "{{.Label \"cairn.runner_id\"}}",
        ]);
        runners_seen.extend(ids.lines().map(str::to_owned));
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "cairn run did not end within 240 s: {}\n{}",
                output(&log),
                stack.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        status.success(),
        "cairn run failed ({status}): {}\n{}",
        output(&log),
        stack.logs()
    );
    assert!(
        runners_seen.contains(&stack.runner_ids[1]),
        "runner 2 ran nothing: {runners_seen:?}"
    );

    let rt = runtime();
    let info = rt
        .block_on(async {
            OrchestratorClient::new(cairn_server::connect_tls(&orch, Some(&stack.tls())).unwrap())
                .get_run(GetRunRequest {
                    project_id: "default".into(),
                    run_id: run_id.clone(),
                })
                .await
        })
        .unwrap()
        .into_inner();
    assert_eq!(info.state(), TaskState::Completed, "{info:?}");
    assert_eq!(info.nodes.len(), 6, "{info:?}");
    for node in &info.nodes {
        assert_eq!(node.state(), NodeState::Succeeded, "{node:?}");
    }
    // The node in flight on runner 1 when it died was tried again.
    let retried: Vec<&str> = info
        .nodes
        .iter()
        .filter(|n| n.attempts >= 2)
        .map(|n| n.id.as_str())
        .collect();
    assert!(
        !retried.is_empty(),
        "no node needed a second attempt, so none was cut off by the kill: {info:?}"
    );
    eprintln!(
        "{test}: run {run_id} completed {:.1}s after the kill; nodes retried: {retried:?}; runners seen: {runners_seen:?}",
        killed.elapsed().as_secs_f64()
    );
    let listed = ok(
        stack.cairn(&host).args([
            "--addr",
            &store,
            "store",
            "ls",
            "-r",
            &format!("docs/artifacts/{run_id}"),
        ]),
        Duration::from_secs(30),
    );
    for n in 1..=6 {
        assert!(
            listed.contains(&format!("docs/artifacts/{run_id}/n{n}/done.txt")),
            "n{n} output missing:\n{listed}"
        );
    }

    // The killed runner's sandbox outlived it; its successor (same runner id) removes it.
    stack.run(&["start", "sandbox-runner-1"]);
    stack.wait_healthy(&["sandbox-runner-1"], Duration::from_secs(60));
    let logs = stack.run(&["logs", "--no-color", "sandbox-runner-1"]);
    let sweeps: Vec<u64> = logs
        .lines()
        .filter_map(|l| l.split("sandbox-runner ready; removed ").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect();
    assert!(
        sweeps.len() >= 2 && sweeps[sweeps.len() - 1] >= 1,
        "the restarted runner removed none of its predecessor's containers (sweeps {sweeps:?}):\n{logs}"
    );
    let still = docker(&[
        "ps",
        "-a",
        "-q",
        "--filter",
        &format!("label=cairn.runner_id={}", stack.runner_ids[0]),
    ]);
    assert!(
        still.trim().is_empty(),
        "runner 1's leftovers survived its restart: {still}"
    );

    stack.down();
    let left = stack.sandbox_containers();
    assert!(
        left.is_empty(),
        "sandbox containers left after down: {left:?}"
    );
}

/// Two orchestrator replicas over etcd: runs submitted to one are driven by both; kill the
/// second replica's container and the first continues its runs, its gates decided through
/// the first all along.
#[test]
fn compose_orchestrator_replica_dies_and_the_other_continues_its_runs() {
    let test = "compose_orchestrator_replica_dies_and_the_other_continues_its_runs";
    let Some((_host, mut stack)) = whole_stack(test, "replicas") else {
        return;
    };
    let entry = stack.published("orchestrator");
    let second = stack.published("orchestrator-2");
    let tls = stack.tls();
    let rt = runtime();
    let client =
        |addr: &str| OrchestratorClient::new(cairn_server::connect_tls(addr, Some(&tls)).unwrap());
    // Channels need the runtime's reactor.
    let (c1, c2) = rt.block_on(async { (client(&entry), client(&second)) });
    let get = |c: &OrchestratorClient<tonic::transport::Channel>, run: &str| {
        let mut c = c.clone();
        let run = run.to_owned();
        rt.block_on(async move {
            c.get_run(GetRunRequest {
                project_id: "default".into(),
                run_id: run,
            })
            .await
            .map(|r| r.into_inner())
        })
    };
    let wait = |run: &str, what: &str, limit: Duration, ok: &dyn Fn(&RunInfo) -> bool| {
        let deadline = Instant::now() + limit;
        loop {
            let info = get(&c1, run);
            if let Ok(i) = &info {
                if ok(i) {
                    return i.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "run {run}: {what} not within {limit:?}: {info:?}\n{}",
                stack.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let graph = "title: replicas\nnodes:\n  - {id: a, type: write_file, path: \"docs/{{run_id}}/a.txt\", content: a}\n  - {id: g, type: gate, reason: check, needs: [a]}\n  - {id: b, type: write_file, path: \"docs/{{run_id}}/b.txt\", content: b, needs: [g]}\n";
    // Submitted through the first replica until the second drives some.
    let mut runs = Vec::new();
    for _ in 0..24 {
        let mut c = c1.clone();
        let info = rt
            .block_on(async move {
                c.submit_run(SubmitRunRequest {
                    project_id: "default".into(),
                    graph_yaml: graph.into(),
                    ..Default::default()
                })
                .await
            })
            .unwrap_or_else(|e| panic!("submit through orchestrator: {e:?}\n{}", stack.logs()))
            .into_inner();
        runs.push(info.run_id);
    }
    let mut by_second = Vec::new();
    for run in &runs {
        let info = wait(run, "input_required", Duration::from_secs(60), &|i| {
            i.state == TaskState::InputRequired as i32
        });
        assert!(
            ["orchestrator-1", "orchestrator-2"].contains(&info.replica.as_str()),
            "{info:?}"
        );
        // Either replica answers for every run.
        assert_eq!(get(&c2, run).unwrap().replica, info.replica);
        if info.replica == "orchestrator-2" {
            by_second.push(run.clone());
        }
    }
    assert!(
        !by_second.is_empty() && by_second.len() < runs.len(),
        "the runs did not spread over both replicas"
    );
    // etcd serves the replicas mutual TLS and, with its authentication on, to the orchestrator
    // identity alone: that certificate reads both members; etcd's own certificate (another
    // identity of the same CA), plaintext and a TLS client without a certificate are refused.
    let etcd = stack.container("etcd");
    for file in ["orchestrator.pem", "orchestrator.key"] {
        let copied = Command::new("docker")
            .args([
                "exec",
                "-i",
                &etcd,
                "sh",
                "-c",
                &format!("cat > /tmp/{file}"),
            ])
            .stdin(std::fs::File::open(stack.pki().join(file)).unwrap())
            .output()
            .unwrap();
        assert!(copied.status.success(), "{}", show(&copied));
    }
    let etcdctl = |args: &[&str]| {
        let mut cmd = Command::new("docker");
        cmd.args(["exec", &etcd, "etcdctl", "--command-timeout=3s"])
            .args(args)
            .args([
                "get",
                "--prefix",
                "--keys-only",
                "/cairn/orchestrator/members/",
            ]);
        cmd.output().unwrap()
    };
    let (tls, ca) = (
        "--endpoints=https://127.0.0.1:2379",
        "--cacert=/etc/cairn/pki/ca.pem",
    );
    let as_orchestrator = etcdctl(&[
        tls,
        ca,
        "--cert=/tmp/orchestrator.pem",
        "--key=/tmp/orchestrator.key",
    ]);
    let members = String::from_utf8_lossy(&as_orchestrator.stdout);
    assert!(
        as_orchestrator.status.success()
            && members.contains("orchestrator-1")
            && members.contains("orchestrator-2"),
        "{}",
        show(&as_orchestrator)
    );
    let as_etcd = etcdctl(&[
        tls,
        ca,
        "--cert=/etc/cairn/pki/etcd.pem",
        "--key=/etc/cairn/pki/etcd.key",
    ]);
    assert!(
        !as_etcd.status.success() && show(&as_etcd).contains("permission denied"),
        "{}",
        show(&as_etcd)
    );
    for refused in [
        etcdctl(&["--endpoints=http://127.0.0.1:2379"]),
        etcdctl(&[tls, ca]),
    ] {
        assert!(!refused.status.success(), "{}", show(&refused));
    }

    docker(&["kill", &stack.container("orchestrator-2")]);
    let killed = Instant::now();
    for run in &by_second {
        wait(run, "taken over", Duration::from_secs(30), &|i| {
            i.replica == "orchestrator-1"
        });
    }
    let failover = killed.elapsed();
    assert!(
        failover < Duration::from_secs(15),
        "the surviving replica took {failover:?} to continue the runs"
    );
    for run in &runs {
        let mut c = c1.clone();
        let run = run.clone();
        rt.block_on(async move {
            c.approve_gate(GateDecisionRequest {
                project_id: "default".into(),
                run_id: run,
                gate_id: "g".into(),
                by: "ann".into(),
                note: String::new(),
            })
            .await
        })
        .unwrap_or_else(|e| panic!("approve: {e:?}\n{}", stack.logs()));
    }
    for run in &runs {
        let done = wait(run, "completed", Duration::from_secs(60), &|i| {
            i.state == TaskState::Completed as i32
        });
        for node in &done.nodes {
            assert_eq!(node.state(), NodeState::Succeeded, "{node:?}");
        }
    }
    eprintln!(
        "{test}: {} of {} runs on orchestrator-2 continued by orchestrator-1 {:.1}s after the kill",
        by_second.len(),
        runs.len(),
        failover.as_secs_f64()
    );
    stack.down();
}

/// Every service of the stack up and healthy, images built; None (after a SKIP line) where
/// Docker or the orchestrator's binary is missing.
fn whole_stack(test: &str, tag: &str) -> Option<(Host, Stack)> {
    let host = Host::probe(test)?;
    if let Some(why) = host.orchestrator_missing() {
        println!("SKIP: {test}: {why}");
        return None;
    }
    host.build_images();
    let stack = Stack::new(&host, tag);
    stack.up(&ALL);
    stack.wait_healthy(&ALL, Duration::from_secs(120));
    Some((host, stack))
}

/// The failover graph is one the orchestrator accepts (checked without Docker).
#[test]
fn failover_graph_is_valid() {
    let yaml = std::fs::read_to_string(repo().join("tests/compose/failover.yaml")).unwrap();
    let graph = cairn_graph::Graph::from_yaml(&yaml, "r1", &Default::default())
        .unwrap_or_else(|e| panic!("tests/compose/failover.yaml: {e:?}"));
    assert_eq!(graph.nodes.len(), 6);
}

/// The shell block of docs/operations.md marked `<!-- test: NAME -->` (the line before its
/// fence), so the test runs exactly what the page tells operators to run.
fn documented(name: &str) -> String {
    let doc = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let marker = format!("<!-- test: {name} -->");
    let after = doc
        .split_once(&marker)
        .unwrap_or_else(|| panic!("docs/operations.md has no {marker}"))
        .1;
    let body = after
        .trim_start()
        .strip_prefix("```sh\n")
        .unwrap_or_else(|| panic!("{marker} must be followed by a ```sh block"));
    body.split_once("\n```")
        .unwrap_or_else(|| panic!("{marker}: unterminated block"))
        .0
        .to_owned()
}

/// A stack named `name` serving only the store, `content` put at docs/backup/kept.txt; the
/// store's published address.
fn store_with_kept_file(host: &Host, name: &str, content: &str) -> (Stack, String) {
    let store_only = ["artifact-store"];
    let stack = Stack::new(host, name);
    stack.up(&store_only);
    stack.wait_healthy(&store_only, Duration::from_secs(90));
    let store = stack.published("artifact-store");
    let file = stack.dir.path().join("kept.txt");
    std::fs::write(&file, content).unwrap();
    ok(
        stack
            .cairn(host)
            .args(["--addr", &store, "store", "put"])
            .arg(&file)
            .arg("docs/backup/kept.txt"),
        Duration::from_secs(30),
    );
    (stack, store)
}

/// The names of the files in `dir`, which must be one documented backup, `cairn-store-*<suffix>`.
fn the_backup_made(dir: &Path, suffix: &str) -> Vec<String> {
    let archives: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        archives.len() == 1
            && archives[0].starts_with("cairn-store-")
            && archives[0].ends_with(suffix),
        "the documented backup made {archives:?}"
    );
    archives
}

/// docs/operations.md's backup of the compose store, run as written against one stack, and its
/// restore into a fresh stack (another volume, another PKI): the file put before the backup is
/// read back over gRPC from the restored store.
#[test]
fn compose_backup_and_restore_as_documented() {
    let test = "compose_backup_and_restore_as_documented";
    let backup = documented("compose-backup");
    let restore = documented("compose-restore");
    let Some(host) = Host::probe(test) else {
        return;
    };
    host.build_images();
    let store_only = ["artifact-store"];
    let backups = tempfile::Builder::new()
        .prefix("cairn-backup-")
        .tempdir()
        .unwrap();
    let content = format!("kept across a restore {}\n", std::process::id());

    let (mut first, _) = store_with_kept_file(&host, "backup", &content);
    ok(
        &mut first.shell(backups.path(), &backup),
        Duration::from_secs(120),
    );
    let archives = the_backup_made(backups.path(), ".tgz");
    first.down();

    let second = Stack::new(&host, "restore");
    second.up(&store_only);
    second.wait_healthy(&store_only, Duration::from_secs(90));
    let store = second.published("artifact-store");
    let got = second.dir.path().join("got.txt");
    let get = |stack: &Stack, store: &str| {
        run(
            stack
                .cairn(&host)
                .args(["--addr", store, "store", "get", "docs/backup/kept.txt"])
                .arg(&got),
            Duration::from_secs(30),
        )
    };
    assert!(
        !get(&second, &store).status.success(),
        "a fresh stack already has the file"
    );
    ok(
        second
            .shell(backups.path(), &restore)
            .env("BACKUP", &archives[0]),
        Duration::from_secs(180),
    );
    second.wait_healthy(&store_only, Duration::from_secs(90));
    // The port may change when the store's container restarts.
    let store = second.published("artifact-store");
    let out = get(&second, &store);
    assert!(
        out.status.success(),
        "restored store: {}\n{}",
        show(&out),
        second.logs()
    );
    assert_eq!(std::fs::read_to_string(&got).unwrap(), content);
    // The restored directories are the store's (uid 10002): it writes into them.
    ok(
        second
            .cairn(&host)
            .args(["--addr", &store, "store", "put"])
            .arg(&got)
            .arg("docs/backup/after-restore.txt"),
        Duration::from_secs(30),
    );
}

/// docs/operations.md's online backup, run as written from the host against a serving store,
/// and its restore into a fresh stack's empty store: the file put before the backup is read
/// back, and a second restore into the now non-empty store is refused.
#[test]
fn compose_online_backup_and_restore_as_documented() {
    let test = "compose_online_backup_and_restore_as_documented";
    let backup = documented("compose-online-backup");
    let restore = documented("compose-online-restore");
    let Some(host) = Host::probe(test) else {
        return;
    };
    host.build_images();
    let store_only = ["artifact-store"];
    let backups = tempfile::Builder::new()
        .prefix("cairn-online-backup-")
        .tempdir()
        .unwrap();
    let content = format!("kept across an online restore {}\n", std::process::id());
    // The documented commands run with `cairn` on PATH, the store's address and the `cli`
    // certificate in the environment, as the text says.
    let bin = host.cairn.parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let shell = |stack: &Stack, script: &str, store: &str| {
        let mut c = stack.shell(backups.path(), script);
        c.env("PATH", &path)
            .env("CAIRN_ADDR", store)
            .env("CAIRN_TLS_DIR", stack.pki().join("cli"))
            .env_remove("CAIRN_PROJECT");
        c
    };

    let (mut first, store) = store_with_kept_file(&host, "online-backup", &content);
    ok(
        &mut shell(&first, &backup, &store),
        Duration::from_secs(120),
    );
    let archives = the_backup_made(backups.path(), ".tar.gz");
    first.down();

    let second = Stack::new(&host, "online-restore");
    second.up(&store_only);
    second.wait_healthy(&store_only, Duration::from_secs(90));
    let store = second.published("artifact-store");
    let mut restoring = shell(&second, &restore, &store);
    restoring.env("BACKUP", &archives[0]);
    ok(&mut restoring, Duration::from_secs(120));
    let got = second.dir.path().join("got.txt");
    ok(
        second
            .cairn(&host)
            .args(["--addr", &store, "store", "get", "docs/backup/kept.txt"])
            .arg(&got),
        Duration::from_secs(30),
    );
    assert_eq!(std::fs::read_to_string(&got).unwrap(), content);
    let mut again = shell(&second, &restore, &store);
    again.env("BACKUP", &archives[0]);
    let out = run(&mut again, Duration::from_secs(60));
    assert!(
        out.status.code() == Some(5)
            && String::from_utf8_lossy(&out.stderr).contains("the store already has"),
        "a restore into a store with the projects: {}",
        show(&out)
    );
}

/// v2 is preferred where both answer; CAIRN_COMPOSE picks one; nothing when neither answers.
#[test]
fn compose_v2_is_preferred_over_v1() {
    let both = |_: &str, _: &[&str]| true;
    let v1_only = |p: &str, _: &[&str]| p == "docker-compose";
    let neither = |_: &str, _: &[&str]| false;
    assert_eq!(choose_compose("", &both).unwrap(), ["docker", "compose"]);
    assert_eq!(choose_compose("", &v1_only).unwrap(), ["docker-compose"]);
    assert_eq!(
        choose_compose("docker-compose", &both).unwrap(),
        ["docker-compose"]
    );
    assert_eq!(choose_compose("docker compose", &v1_only), None);
    assert_eq!(choose_compose("", &neither), None);
    // What `answers` is asked: `docker compose version`, `docker-compose version`.
    let asked = std::cell::RefCell::new(Vec::new());
    let record = |p: &str, a: &[&str]| {
        asked.borrow_mut().push(format!("{p} {}", a.join(" ")));
        false
    };
    choose_compose("", &record);
    assert_eq!(
        *asked.borrow(),
        ["docker compose version", "docker-compose version"]
    );
}
