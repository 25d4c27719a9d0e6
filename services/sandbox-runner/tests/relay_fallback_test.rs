//! The relay of a gvisor session command (waiter.py with `"relay": true`) when no spawner
//! listens at `\0cairn-session-spawner`, as in a session restored from a snapshot made before
//! the spawner existed: it forks the command itself and still relays its stdout, its stderr
//! and its exit code in frames. Run on the host with its python3, whose network namespace has
//! no such socket, fed exactly what `GvisorBackend::exec` (src/backend/gvisor_session.rs) feeds
//! a `runsc exec` of the waiter: the same command line, environment, working directory and job
//! line on stdin.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use cairn_sandbox_runner::Limits;

/// The waiter as the runner embeds it (`WAITER` in src/backend/local_pool.rs).
const WAITER: &str = include_str!("../src/waiter.py");
/// A relay gets this long to send everything (it takes a few tens of ms).
const LIMIT: Duration = Duration::from_secs(10);

/// A frame of the relay's stdout, as `Frames` (src/backend/gvisor.rs) splits them.
#[derive(Debug, PartialEq, Eq)]
enum Frame {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(i32),
}

/// What a relay sent: its frames, its own exit code and its own stderr.
struct Relayed {
    frames: Vec<Frame>,
    code: Option<i32>,
    stderr: String,
}

impl Relayed {
    fn stdout(&self) -> String {
        self.joined(|f| match f {
            Frame::Stdout(d) => Some(d),
            _ => None,
        })
    }

    fn stderr_frames(&self) -> String {
        self.joined(|f| match f {
            Frame::Stderr(d) => Some(d),
            _ => None,
        })
    }

    fn joined(&self, pick: impl Fn(&Frame) -> Option<&Vec<u8>>) -> String {
        let bytes: Vec<u8> = self
            .frames
            .iter()
            .filter_map(pick)
            .flatten()
            .copied()
            .collect();
        String::from_utf8(bytes).unwrap()
    }

    /// The exit frame's status; asserts there is exactly one and that it comes last.
    fn exit(&self) -> i32 {
        let exits: Vec<usize> = (0..self.frames.len())
            .filter(|&i| matches!(self.frames[i], Frame::Exit(_)))
            .collect();
        assert_eq!(
            exits,
            [self.frames.len() - 1],
            "one exit frame, the last: {:?}",
            self.summary()
        );
        match self.frames.last() {
            Some(Frame::Exit(code)) => *code,
            _ => unreachable!(),
        }
    }

    /// The frames without their bytes (for assertion messages).
    fn summary(&self) -> Vec<String> {
        self.frames
            .iter()
            .map(|f| match f {
                Frame::Stdout(d) => format!("stdout {} bytes", d.len()),
                Frame::Stderr(d) => format!("stderr {:?}", String::from_utf8_lossy(d)),
                Frame::Exit(c) => format!("exit {c}"),
            })
            .collect()
    }
}

/// Splits a relay's stdout into frames (a kind byte, a 4-byte big-endian length, the bytes);
/// the crate's own `Frames` (src/backend/gvisor.rs) is not public. Panics on anything else.
fn frames(mut data: &[u8]) -> Vec<Frame> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let start = String::from_utf8_lossy(&data[..data.len().min(60)]).into_owned();
        assert!(data.len() >= 5, "a cut frame head: {start:?}");
        let kind = data[0];
        let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
        assert!(
            data.len() >= 5 + len,
            "not a frame (kind {kind:#04x}, {len} bytes, {} left): {start:?}",
            data.len()
        );
        let body = &data[5..5 + len];
        out.push(match (kind, len) {
            (b'1', _) => Frame::Stdout(body.to_vec()),
            (b'2', _) => Frame::Stderr(body.to_vec()),
            (b'x', 4) => Frame::Exit(i32::from_be_bytes(body.try_into().unwrap())),
            _ => panic!("a malformed frame (kind {kind:#04x}, {len} bytes): {start:?}"),
        });
        data = &data[5 + len..];
    }
    out
}

/// The host's python3, or None (with a `SKIP:` line) when the test cannot run here: no
/// python3, or something listens at the spawner's address after all.
fn ready(test: &str) -> Option<PathBuf> {
    let python = [PathBuf::from("/usr/bin/python3")]
        .into_iter()
        .chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|d| d.join("python3")),
        )
        .find(|p| p.is_file());
    let Some(python) = python else {
        println!("SKIP: {test}: no python3 on this host");
        return None;
    };
    // waiter.py's SPAWN_ADDR, the abstract address b"\0cairn-session-spawner".
    let addr = SocketAddr::from_abstract_name(b"cairn-session-spawner").unwrap();
    if UnixStream::connect_addr(&addr).is_ok() {
        println!("SKIP: {test}: a spawner listens at \\0cairn-session-spawner on this host");
        return None;
    }
    Some(python)
}

/// The job line `GvisorBackend::exec` sends (`Go::line`, src/backend/local_pool.rs): relayed,
/// not reaped (so the relay asks for a spawner first), the session's environment
/// (`session_env` in src/backend/mod.rs) plus the command's CAIRN_EXEC_ID, the session's
/// rlimits. Its argv is `bash -c COMMAND` where the runner's is `bash -lc COMMAND`: a login
/// shell would read the host's /etc/profile, not the sandbox image's. The job carries no user:
/// a relay runs as `runsc exec --user` made it, and forks the command as itself.
fn job_line(command: &str, cwd: &Path) -> Vec<u8> {
    let limits = Limits::DEFAULTS;
    // The session's rlimits (`rlimits` in src/backend/local.rs) but for nproc: RLIMIT_NPROC
    // counts every process of the user on the host, so it keeps this process's own limit.
    let nproc = rustix::process::getrlimit(rustix::process::Resource::Nproc)
        .current
        .unwrap_or(1 << 22);
    let job = serde_json::json!({
        "relay": true,
        "reap": false,
        "argv": ["bash", "-c", command],
        "env": [
            ["PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            ["HOME", "/tmpfs"],
            ["LANG", "C.UTF-8"],
            ["PYTHONUNBUFFERED", "1"],
            ["CAIRN_EXEC_ID", "relay-fallback-exec"],
        ],
        "cwd": cwd.to_str().unwrap(),
        "rlimits": {
            "nproc": nproc,
            "as": limits.memory_bytes,
            "fsize": limits.max_output_bytes + 1,
            "cpu": limits.timeout_ms / 1000 + 1,
            "core": 0,
        },
    });
    let mut line = job.to_string().into_bytes();
    line.push(b'\n');
    line
}

/// Runs the waiter as `runsc exec` starts a session command's relay (`waiter_argv(Now)`, the
/// waiter's environment `waiter_env`, in `/`; src/backend/gvisor.rs), writes the job line to its
/// stdin and, unless `hold_stdin`, closes it as `send_go` does; reads its stdout and stderr
/// to their end. Panics when that takes longer than LIMIT.
fn relay(python: &Path, line: &[u8], hold_stdin: bool) -> Relayed {
    let mut child = Command::new(python)
        .args(["-I", "-S", "-c", WAITER, "--now"])
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("LANG", "C.UTF-8")
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(line).unwrap();
    let held = if hold_stdin {
        Some(stdin)
    } else {
        drop(stdin);
        None
    };
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let errs = std::thread::spawn(move || {
            err.read_to_end(&mut e).unwrap();
            e
        });
        out.read_to_end(&mut o).unwrap();
        let _ = tx.send((o, errs.join().unwrap()));
    });
    let Ok((out, err)) = rx.recv_timeout(LIMIT) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the relay sent nothing to its end within {LIMIT:?}");
    };
    let status = child.wait().unwrap();
    drop(held);
    Relayed {
        frames: frames(&out),
        code: status.code(),
        stderr: String::from_utf8_lossy(&err).into_owned(),
    }
}

#[test]
fn a_relay_that_finds_no_spawner_runs_the_command_itself_and_relays_its_output_and_exit_code() {
    let Some(python) = ready("relay_fallback_output") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    // 200,000 bytes take several of the relay's 64 KiB reads, so several stdout frames.
    let command = r#"printf 'out 1\n'
printf 'err 1\n' >&2
printf 'out 2\n'
head -c 200000 /dev/zero | tr '\0' a
printf '\nexec id %s\ncwd %s\n' "$CAIRN_EXEC_ID" "$(pwd -P)"
read -r _ _ _ _ _ sid _ < /proc/$$/stat
[ "$sid" = "$$" ] && printf 'leads its own session\n'
printf 'err 2\n' >&2
exit 7"#;
    let r = relay(&python, &job_line(command, &cwd), false);
    assert_eq!(r.stderr, "", "the relay's own stderr");
    let want = format!(
        "out 1\nout 2\n{}\nexec id relay-fallback-exec\ncwd {}\nleads its own session\n",
        "a".repeat(200_000),
        cwd.display()
    );
    let stdout = r.stdout();
    assert_eq!(stdout.len(), want.len(), "{:?}", r.summary());
    assert!(stdout == want, "stdout differs: {:?}", r.summary());
    assert_eq!(r.stderr_frames(), "err 1\nerr 2\n");
    let stdout_frames = r
        .frames
        .iter()
        .filter(|f| matches!(f, Frame::Stdout(_)))
        .count();
    assert!(stdout_frames >= 4, "{:?}", r.summary());
    assert_eq!(r.exit(), 7, "{:?}", r.summary());
    assert_eq!(r.code, Some(7), "the relay exits with the command's code");
}

#[test]
fn a_relay_that_finds_no_spawner_gives_the_command_dev_null_as_stdin_not_the_runners_pipe() {
    let Some(python) = ready("relay_fallback_stdin") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    // The runner's pipe stays open: a command reading it would wait for ever (and the relay
    // would hit LIMIT); /dev/null ends at once, as the spawner's commands' stdin does.
    let command = r#"printf 'stdin %s\n' "$(readlink /proc/$$/fd/0)"
if IFS= read -r line; then printf 'read %s\n' "$line"; else printf 'end of input\n'; fi
printf 'cat read %s bytes\n' "$(cat | wc -c)"
exit 3"#;
    let r = relay(&python, &job_line(command, &cwd), true);
    assert_eq!(r.stderr, "", "the relay's own stderr");
    assert_eq!(
        r.stdout(),
        "stdin /dev/null\nend of input\ncat read 0 bytes\n",
        "{:?}",
        r.summary()
    );
    assert_eq!(r.stderr_frames(), "");
    assert_eq!(r.exit(), 3, "{:?}", r.summary());
    assert_eq!(r.code, Some(3));
}
