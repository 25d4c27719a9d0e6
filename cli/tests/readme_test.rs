//! Every README command a new user copies runs as written: the code blocks fenced
//! ```` ```sh runnable ```` run in order, each line through `sh`, on a fresh data root (embedded
//! services, replayed LLM), with `cairn` on the PATH and the repository's examples beside them.
//! Each must exit 0, or the code its comment names (`# exits 4: ...`).
#![allow(clippy::unwrap_used)]

mod common;

/// The commands of the README's runnable blocks (a line ending in `\` goes on).
fn runnable_commands(readme: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    let mut pending = String::new();
    for line in readme.lines() {
        if !inside {
            inside = line.trim() == "```sh runnable";
            continue;
        }
        if line.trim() == "```" {
            inside = false;
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(line);
                if !pending.trim().is_empty() {
                    out.push(std::mem::take(&mut pending));
                }
                pending.clear();
            }
        }
    }
    out
}

#[test]
fn the_readme_runnable_blocks_run_as_written() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let commands = runnable_commands(&readme);
    assert!(
        commands.len() >= 10,
        "the README keeps its runnable block: {commands:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(root.join("examples"), dir.path().join("examples")).unwrap();
    let bin = assert_cmd::cargo::cargo_bin("cairn");
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sandbox = common::sandbox_available();
    for command in &commands {
        if command.contains("cairn sandbox") && !sandbox {
            println!("SKIP: {command} (no Docker image cairn-sandbox:latest)");
            continue;
        }
        let out = std::process::Command::new("sh")
            .args(["-c", command])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("CAIRN_DATA_ROOT", dir.path().join("data"))
            .env_remove("CAIRN_ADDR")
            .env_remove("CAIRN_PROJECT")
            .env_remove("CAIRN_CONFIG")
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // A command the README says exits otherwise ends in `# exits N ...`.
        let expected = command
            .split_once("# exits ")
            .and_then(|(_, rest)| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0);
        assert!(
            out.status.code() == Some(expected),
            "README command did not exit {expected}: {command}\n{stderr}{}",
            String::from_utf8_lossy(&out.stdout)
        );
        // The embedded services' logs stay in their file, out of the user's terminal.
        for level in [" INFO ", " WARN ", " ERROR "] {
            assert!(
                !stderr.contains(level),
                "{command} logged to the terminal:\n{stderr}"
            );
        }
    }
}

#[test]
fn continuation_lines_join_and_other_blocks_are_left_out() {
    let text = "```sh\nnot me\n```\n```sh runnable\na \\\n  b\nc\n```\n";
    assert_eq!(runnable_commands(text), ["a   b", "c"]);
}
