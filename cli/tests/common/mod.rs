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
