//! The `cairn` binary over a data root, with none of the caller's cairn environment.
#![allow(dead_code, clippy::unwrap_used)]

use assert_cmd::Command;

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
