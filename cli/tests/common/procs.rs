//! Services as `cairn serve` child processes, each logging JSON to a collected stderr.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A `cairn` child process whose stderr (JSON log lines) is collected.
pub struct Proc {
    pub what: String,
    pub child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn spawn(what: &str, mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Proc {
            what: what.to_owned(),
            child,
            lines,
        }
    }

    pub fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// The address from the service's `serving gRPC` log line.
    pub fn wait_addr(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for line in self.lines.lock().unwrap().iter() {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                    continue;
                };
                if v["fields"]["message"] == "serving gRPC" {
                    let addr = v["fields"]["addr"].as_str().unwrap_or_default();
                    return addr
                        .trim_start_matches("Some(")
                        .trim_end_matches(')')
                        .to_owned();
                }
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "{} exited ({status}) before serving:\n{}",
                    self.what,
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} not serving after 30 s:\n{}",
                self.what,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM (the exporters flush on the way out), then waits for the exit.
    pub fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "{} did not stop within 20 s of SIGTERM:\n{}",
                    self.what,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sandbox backend to use: Docker with the sandbox image, else bubblewrap; None (SKIP)
/// when neither is here. CI (CAIRN_REQUIRE_DOCKER=1) insists on Docker.
pub fn sandbox_backend() -> Option<&'static str> {
    let docker = Command::new("docker")
        .args(["image", "inspect", "cairn-sandbox:latest"])
        .output()
        .is_ok_and(|o| o.status.success());
    if std::env::var("CAIRN_REQUIRE_DOCKER").as_deref() == Ok("1") {
        assert!(docker, "CAIRN_REQUIRE_DOCKER=1 but Docker or the cairn-sandbox:latest image is missing (run scripts/setup.sh)");
    }
    if docker {
        return Some("docker");
    }
    let bwrap = Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    bwrap.then_some("local")
}

pub fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
