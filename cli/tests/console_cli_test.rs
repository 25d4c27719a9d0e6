//! The web console from the command line: `cairn up` fails at once, with the reason and
//! nothing left running, when its console cannot start; `cairn serve console` serves it on its
//! own against running services (a gRPC client only), configured by file, environment and
//! flags, with the probes answering and the pages behind a login; `cairn health --http` checks
//! it as a container health check does.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{cairn, free_port, Killed};
use predicates::prelude::*;

const TOKEN: &str = "console-cli-test-token-0123";

fn bin() -> Command {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("cairn"));
    c.env_remove("CAIRN_ADDR")
        .env_remove("CAIRN_CONFIG")
        .env_remove("CAIRN_CONSOLE_TOKEN")
        .env_remove("CAIRN_CONSOLE_TOKEN_FILE")
        .env_remove("CAIRN_TOKENS_FILE")
        .env("RUST_LOG", "error");
    c
}

/// Runs `cmd` to its end (at most `limit`, else the test fails); exit code and stderr.
fn finish(cmd: &mut Command, limit: Duration) -> (Option<i32>, String) {
    let mut child = Killed(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "{cmd:?} still running after {limit:?}: it should have failed at once"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    (status.code(), reader.join().unwrap())
}

/// A console that cannot start fails `cairn up` before any service starts: the reason on
/// stderr, exit 1, and the gRPC address free again (nothing kept serving).
#[test]
fn up_fails_at_once_when_its_console_cannot_start() {
    let dir = tempfile::tempdir().unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let cases: [(&[&str], &[&str]); 3] = [
        // Beyond loopback without a token.
        (
            &["--console-listen", "0.0.0.0:0"],
            &[
                "refusing to serve the console",
                "without a login token",
                "CAIRN_CONSOLE_TOKEN",
            ],
        ),
        // A shared token too short to be one.
        (
            &["--console-token", "short"],
            &["console.token is 5 characters", "at least 16"],
        ),
        // A name that is no host name.
        (
            &["--console-public-host", "a b"],
            &["console.public_hosts", "`a b`"],
        ),
    ];
    for (args, says) in cases {
        let mut cmd = bin();
        cmd.arg("--data-root")
            .arg(dir.path().join("data"))
            .args(["up", "--listen", &grpc])
            .args(args);
        let t = Instant::now();
        let (code, stderr) = finish(&mut cmd, Duration::from_secs(30));
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        for s in says {
            assert!(stderr.contains(s), "{args:?}: expected `{s}` in: {stderr}");
        }
        assert!(
            stderr.contains("--no-console"),
            "says the way out: {stderr}"
        );
        assert!(!stderr.contains("cairn is up"), "{args:?}: {stderr}");
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
        std::net::TcpListener::bind(&grpc)
            .unwrap_or_else(|e| panic!("{args:?}: {grpc} still taken after the failure: {e}"));
    }
}

/// `cairn health --http URL`: exit code and what it printed.
fn http_health(url: &str) -> (bool, String) {
    let out = bin().args(["health", "--http", url]).output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The console's URL from its start-up log line, without the trailing `/`.
fn served_at(log: &std::path::Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let said = std::fs::read_to_string(log).unwrap_or_default();
        let url = said
            .lines()
            .filter(|l| l.contains("serving the web console"))
            .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("url=")));
        if let Some(url) = url {
            return url.trim_end_matches('/').to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the console never said where it serves:\n{said}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for `url` to answer 2xx; on time-out, fails with what the console logged to `log`.
fn wait_ready(url: &str, log: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (ok, out) = http_health(url);
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{url} not ready: {out}\nthe console logged:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `cairn serve console` against running services: ready once they answer, pages behind the
/// login; the token from a file or the environment, never required on the command line; the
/// same refusals as `cairn up` at start.
#[test]
fn serve_console_runs_the_console_against_running_services() {
    let dir = tempfile::tempdir().unwrap();
    let (up, addr, _) = common::up(&dir.path().join("data"), &[]);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();

    // The token from a file, addresses by flag, the rest from its own config file.
    let config = dir.path().join("console.toml");
    std::fs::write(
        &config,
        "default_name = \"ops\"\npublic_hosts = [\"cairn.example.com\"]\n",
    )
    .unwrap();
    // Port 0: the console says where it listens (a port picked beforehand may be taken by
    // another test's server in between, whose answers would then be read as this one's).
    let console_log = dir.path().join("console.log");
    let _console = Killed(
        bin()
            .args(["serve", "console", "--config"])
            .arg(&config)
            .args(["--listen", "127.0.0.1:0"])
            .args(["--orchestrator-addr", &addr, "--store-addr", &addr])
            .arg("--token-file")
            .arg(&token_file)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&console_log).unwrap())
            .spawn()
            .unwrap(),
    );
    let base = served_at(&console_log);
    wait_ready(&format!("{base}/readyz"), &console_log);
    let (ok, out) = http_health(&format!("{base}/healthz"));
    assert!(ok, "{out}");
    // Pages need a login: /runs redirects to it (not 2xx, so `health --http` says no).
    let (ok, out) = http_health(&format!("{base}/runs"));
    assert!(!ok && out.contains("303"), "{out}");

    // The services go away: not ready, still alive.
    drop(up);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, out) = http_health(&format!("{base}/readyz"));
        if !ok {
            assert!(out.contains("503"), "{out}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still ready without its services"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(http_health(&format!("{base}/healthz")).0);

    // The token from CAIRN_CONSOLE_TOKEN works as well as the file (beyond loopback here).
    let port = free_port();
    let _env = Killed(
        bin()
            .env("CAIRN_CONSOLE_TOKEN", TOKEN)
            .args(["serve", "console", "--listen", &format!("0.0.0.0:{port}")])
            .args(["--orchestrator-addr", &addr, "--store-addr", &addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !http_health(&format!("http://127.0.0.1:{port}/healthz")).0 {
        assert!(
            Instant::now() < deadline,
            "the console with an env token did not start"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Refusals at start, with what to fix.
    let data = dir.path().join("data");
    cairn(&data)
        .args(["serve", "console", "--listen", "0.0.0.0:0"])
        .env_remove("CAIRN_CONSOLE_TOKEN")
        .timeout(Duration::from_secs(20))
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("without a login token")
                .and(predicate::str::contains("CAIRN_CONSOLE_TOKEN")),
        );
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    cairn(&data)
        .args(["serve", "console", "--token-file"])
        .arg(&empty)
        .timeout(Duration::from_secs(20))
        .assert()
        .failure()
        .stderr(predicate::str::contains("is empty"));
    cairn(&data)
        .args(["serve", "console", "--user-tokens", "--token-file"])
        .arg(&token_file)
        .timeout(Duration::from_secs(20))
        .assert()
        .failure()
        .stderr(predicate::str::contains("exclude each other"));
    // No secret as an argument: there is no --token for the console.
    cairn(&data)
        .args(["serve", "console", "--console-token", TOKEN])
        .assert()
        .failure();
}

/// `--insecure-listen` is a setting of the gRPC services; the console serves HTTP and has no
/// such key, so the flag must not reach its section (it made `cairn --insecure-listen up`
/// fail with "unknown key").
#[test]
fn insecure_listen_is_not_given_to_the_console() {
    let dir = tempfile::tempdir().unwrap();
    cairn(&dir.path().join("data"))
        .args(["--insecure-listen", "config", "show"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("[console]")
                .and(predicate::str::contains("insecure_listen = true")),
        );
}
