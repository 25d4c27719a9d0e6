//! The `cairn` binary over a data root, with none of the caller's cairn environment.
#![allow(dead_code, clippy::unwrap_used)]

use assert_cmd::Command;

pub mod procs;

pub fn cairn(data: &std::path::Path) -> Command {
    let mut cmd = Command::cargo_bin("cairn").unwrap();
    cmd.env_remove("CAIRN_ADDR")
        .env_remove("CAIRN_PROJECT")
        .env_remove("CAIRN_CONFIG")
        .env("RUST_LOG", "error")
        .arg("--data-root")
        .arg(data);
    cmd
}

/// The checkout's root (examples/ and docs/ are found from there).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `cairn` run from the checkout's root, so the examples' relative paths resolve.
pub fn cairn_in_repo(data: &std::path::Path) -> Command {
    let mut cmd = cairn(data);
    cmd.current_dir(repo_root());
    cmd
}

/// The events of `run` in `project`, read back through `cairn --json store events`.
pub fn events(data: &std::path::Path, project: &str, run: &str) -> Vec<serde_json::Value> {
    let out = cairn(data)
        .args(["-p", project, "--json", "store", "events", run])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Kills the child process when dropped, however the test ends.
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port free on 127.0.0.1 a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `cairn up --no-console` on a free loopback port, with `extra` arguments: the process, its
/// address and its start-up lines (through the `trust:` line). Its stderr is read to the end
/// by a thread, so the child never blocks on, nor writes into, a closed pipe; a `cairn up`
/// that never says where it listens fails the test instead of hanging it.
pub fn up(data: &std::path::Path, extra: &[&std::ffi::OsStr]) -> (Killed, String, String) {
    up_on(data, &["--listen".as_ref(), "127.0.0.1:0".as_ref()], extra)
}

/// [`up`] listening where `listen` says (e.g. `--socket PATH`).
pub fn up_on(
    data: &std::path::Path,
    listen: &[&std::ffi::OsStr],
    extra: &[&std::ffi::OsStr],
) -> (Killed, String, String) {
    up_full(data, listen, extra, &[])
}

/// [`up`] with configuration variables (`CAIRN_<SERVICE>_<KEY>`) set.
pub fn up_env(data: &std::path::Path, env: &[(&str, &str)]) -> (Killed, String, String) {
    up_full(
        data,
        &["--listen".as_ref(), "127.0.0.1:0".as_ref()],
        &[],
        env,
    )
}

fn up_full(
    data: &std::path::Path,
    listen: &[&std::ffi::OsStr],
    extra: &[&std::ffi::OsStr],
    env: &[(&str, &str)],
) -> (Killed, String, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("cairn"))
        .envs(env.iter().copied())
        .env_remove("CAIRN_ADDR")
        .env_remove("CAIRN_PROJECT")
        .env_remove("CAIRN_CONFIG")
        .env_remove("CAIRN_TLS_DIR")
        .env_remove("CAIRN_TOKENS_FILE")
        .env_remove("CAIRN_ORCHESTRATOR_AUTH_TOKENS_FILE")
        .env("RUST_LOG", "error")
        .arg("--data-root")
        .arg(data)
        .args(["up", "--no-console"])
        .args(listen)
        .args(extra)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let killed = Killed(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let mut said = String::new();
    let mut addr = None;
    while let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(60)) {
        said.push_str(&line);
        said.push('\n');
        if let Some(rest) = line.strip_prefix("cairn is up on ") {
            addr = rest.split_whitespace().next().map(str::to_owned);
        }
        if line.starts_with("trust: ") {
            break;
        }
    }
    std::thread::spawn(move || for _ in rx {});
    let addr = addr.unwrap_or_else(|| panic!("cairn up says where it listens: {said}"));
    (killed, addr, said)
}

/// Docker and the cairn-sandbox:latest image are there for sandbox commands; with
/// CAIRN_REQUIRE_DOCKER=1 their absence fails the test instead.
pub fn sandbox_available() -> bool {
    let docker = std::process::Command::new("docker")
        .args(["image", "inspect", "cairn-sandbox:latest"])
        .output()
        .is_ok_and(|o| o.status.success());
    if std::env::var("CAIRN_REQUIRE_DOCKER").as_deref() == Ok("1") {
        assert!(docker, "CAIRN_REQUIRE_DOCKER=1 but Docker or the cairn-sandbox:latest image is missing (run scripts/setup.sh)");
        return true;
    }
    docker
}
