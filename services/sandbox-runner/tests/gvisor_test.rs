//! What only the gvisor backend promises, over gRPC: the program sees gVisor's kernel, not the
//! host's; the host's private files stay out of reach; rlimits hold inside gVisor; nothing of
//! a run (sandbox, runsc state, bundle, process) outlives it; the runner's environment never
//! reaches the sandbox; images other than the default are refused. The shared behaviour (fork
//! and memory bombs, output links, network off, timeouts, sessions) runs on gvisor through
//! `common::backends` in run_test, session_test, lifecycle_test and process_test.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::Limits;
use cairn_sandbox_runner::BackendChoice;
use common::*;

fn cases() -> Vec<Case> {
    [false, true]
        .map(|pool| Case {
            backend: BackendChoice::Gvisor,
            pool,
        })
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_program_sees_gvisors_kernel_not_the_hosts() {
    if !gvisor_usable("gvisor_kernel") {
        return;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    for case in cases() {
        let r = TestRunner::start(case).await;
        let out = r
            .run(python(
                "import os\nprint(os.uname().release)\nprint(open('/proc/version').read().split()[2])",
            ))
            .await;
        assert_eq!(out.exit_code, 0, "{case:?}: {}", text(&out.stderr));
        assert_eq!(out.backend, "gvisor");
        assert_eq!(text(&out.stdout), "4.4.0\n4.4.0\n", "{case:?}");
        assert_ne!(
            host.trim(),
            "4.4.0",
            "the host itself reports gVisor's release"
        );
        let rj: serde_json::Value = serde_json::from_str(&out.result_json).unwrap();
        assert_eq!(rj["backend"], "gvisor");
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn escapes_fail_and_private_host_files_are_hidden() {
    if !gvisor_usable("gvisor_escape") {
        return;
    }
    // A file only the host has, in a private directory, and the runner's own work_root: the
    // sandbox runs on the image's root file system, where neither exists.
    let secret_dir = tempfile::Builder::new()
        .prefix("cairn-gv-secret")
        .tempdir_in("/root")
        .unwrap();
    std::fs::write(secret_dir.path().join("key"), "host-secret").unwrap();
    for case in cases() {
        let r = TestRunner::start(case).await;
        let code = format!(
            "import os\n\
             def tryit(what, f):\n\
             \x20   try:\n\
             \x20       f(); print('DID', what)\n\
             \x20   except OSError as e:\n\
             \x20       print('refused', what)\n\
             tryit('write /etc', lambda: open('/etc/cairn-escape', 'w').write('x'))\n\
             tryit('write /usr', lambda: open('/usr/cairn-escape', 'w').write('x'))\n\
             tryit('write /input', lambda: open('/input/x', 'w').write('x'))\n\
             tryit('read secret', lambda: open({secret:?}).read())\n\
             tryit('read shadow', lambda: open('/etc/shadow').read())\n\
             tryit('setuid 0', lambda: os.setuid(0))\n\
             print('secret dir', os.path.exists({secret_dir:?}))\n\
             print('tasks', os.path.exists({tasks:?}))\n\
             open('/output/ok.txt', 'w').write('fine')\n\
             open('/tmp/scratch', 'w').write('fine')\n\
             print('uid', os.getuid(), os.geteuid())\n",
            secret = secret_dir.path().join("key").display().to_string(),
            secret_dir = secret_dir.path().display().to_string(),
            tasks = r.work_root.path().join("tasks").display().to_string(),
        );
        let out = r.run(python(&code)).await;
        assert_eq!(
            text(&out.stdout),
            "refused write /etc\nrefused write /usr\nrefused write /input\nrefused read secret\n\
             refused read shadow\nrefused setuid 0\nsecret dir False\ntasks False\nuid 10001 10001\n",
            "{case:?}: {}",
            text(&out.stderr)
        );
        assert!(!std::path::Path::new("/etc/cairn-escape").exists());
        assert!(!std::path::Path::new("/usr/cairn-escape").exists());
        assert_eq!(out.output_files.len(), 1);
        assert_eq!(&out.output_files[0].content[..], b"fine");
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rlimits_hold_inside_gvisor() {
    if !gvisor_usable("gvisor_rlimits") {
        return;
    }
    for case in cases() {
        let r = TestRunner::start_with(case, |c| c.defaults.pids = Some(32)).await;
        let code = "import os, time, resource\n\
             print('nproc', resource.getrlimit(resource.RLIMIT_NPROC)[0])\n\
             n = 0\n\
             try:\n\
             \x20   for _ in range(200):\n\
             \x20       if os.fork() == 0:\n\
             \x20           time.sleep(20); os._exit(0)\n\
             \x20       n += 1\n\
             except OSError:\n\
             \x20   pass\n\
             print('forked at most', 32 if n < 32 else n)\n\
             try:\n\
             \x20   b = bytearray(1 << 30); print('ALLOCATED')\n\
             except MemoryError:\n\
             \x20   print('memory refused')\n";
        let t0 = std::time::Instant::now();
        let out = r.run(with_timeout(python(code), 15_000)).await;
        assert_eq!(
            text(&out.stdout),
            "nproc 32\nforked at most 32\nmemory refused\n",
            "{case:?}: {}",
            text(&out.stderr)
        );
        // The sleeping children die with the run's first process.
        assert!(
            t0.elapsed().as_secs() < 15,
            "{case:?}: children held the run"
        );
        assert!(!out.timed_out);
        assert!(out.limits_enforced, "cgroups are available here");
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_of_a_run_is_left_after_it() {
    if !gvisor_usable("gvisor_leftovers") {
        return;
    }
    for case in cases() {
        let mut r = TestRunner::start(case).await;
        // Kept past stop (which would remove the work_root).
        let work_root = std::mem::replace(&mut r.work_root, tempfile::tempdir().unwrap());
        let gv = work_root.path().join("gvisor");
        // A background process, a setsid one, and a timeout; in bash, and in Python (which a
        // cold run starts in a fork of its waiter).
        let jobs = [
            bash("(sleep 300 &); setsid sleep 300 & echo started; sleep 300"),
            python(
                "import os, time\nif os.fork() == 0:\n    os.setsid(); time.sleep(300)\nprint('started', flush=True); time.sleep(300)",
            ),
        ];
        for job in jobs {
            let out = r.run(with_timeout(job, 1500)).await;
            assert!(out.timed_out, "{case:?}: {out:?}");
            assert_eq!(text(&out.stdout), "started\n");
            let allowed = usize::from(case.pool);
            assert!(wait_for_gvisor_sandboxes(work_root.path(), allowed).await <= allowed);
            // (its deletion runs after the reply, in the background)
            assert_eq!(
                settled_processes_with(&out.job_id, 10).await,
                Vec::<i32>::new()
            );
            let bundle = gv.join("bundles").join(&out.job_id);
            let t0 = std::time::Instant::now();
            while bundle.exists() && t0.elapsed().as_secs() < 5 {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            assert!(!bundle.exists(), "bundle removed after the run");
            let task = work_root.path().join("tasks").join(&out.job_id);
            let t0 = std::time::Instant::now();
            while task.exists() && t0.elapsed().as_secs() < 5 {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            assert!(!task.exists(), "task directory removed after the run");
        }
        let root = work_root.path().to_path_buf();
        let runner_id = r.handle.runner_id().to_owned();
        r.stop().await;
        // Shutdown removes the pool's waiting sandbox too.
        assert_eq!(gvisor_sandboxes(&root).await, Vec::<String>::new());
        assert_eq!(gvisor_processes(&root), Vec::<i32>::new());
        assert_eq!(std::fs::read_dir(gv.join("bundles")).unwrap().count(), 0);
        let cgroups: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
            .map(|h| h.path().join(format!("cairn-gvisor-{runner_id}")))
            .filter(|d| d.exists())
            .collect();
        assert_eq!(
            cgroups,
            Vec::<std::path::PathBuf>::new(),
            "runner cgroups left"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runner_environment_stays_out_and_images_are_refused() {
    if !gvisor_usable("gvisor_env") {
        return;
    }
    // The test process's environment is the runner's (it runs in-process).
    std::env::set_var("CAIRN_GVISOR_TEST_SECRET", "sk-fake-gvisor");
    let r = TestRunner::start(Case {
        backend: BackendChoice::Gvisor,
        pool: false,
    })
    .await;
    let out = r
        .run(bash(
            "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done; env",
        ))
        .await;
    let stdout = text(&out.stdout);
    assert!(stdout.contains("PATH="), "{stdout}");
    assert!(!stdout.contains("sk-fake-gvisor"), "{stdout}");
    let mut req = python("print(1)");
    req.image = "cairn-toolchain:latest".into();
    let e = r.client.clone().run(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("gvisor backend"), "{}", e.message());
    // Big output is capped as on the other backends.
    let out = r
        .run(with_limits(
            python("import sys\nsys.stdout.write('x' * (4 << 20))\n"),
            Limits {
                max_stdout_bytes: 1 << 20,
                ..Default::default()
            },
        ))
        .await;
    assert_eq!(
        out.stdout.len(),
        1 << 20,
        "{} {} {}",
        text(&out.stderr),
        out.exit_code,
        out.duration_ms
    );
    assert!(out.stdout_truncated);
    r.stop().await;
}

/// With network allowed, a job that asks for it reaches a host listener on the runner's
/// non-loopback address; one that does not ask stays cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn network_only_when_the_job_has_it() {
    if !gvisor_usable("gvisor_network") {
        return;
    }
    // The host's outward address (no packet is sent by a UDP connect).
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    if probe.connect("10.255.255.255:1").is_err() {
        println!("SKIP: gvisor_network: this host has no non-loopback address");
        return;
    }
    let ip = probe.local_addr().unwrap().ip();
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = TestRunner::start_with(
        Case {
            backend: BackendChoice::Gvisor,
            pool: false,
        },
        |c| c.network_allowed = true,
    )
    .await;
    let code = format!(
        "import socket\ns = socket.socket(); s.settimeout(3)\nprint(s.connect_ex(('{ip}', {port})) == 0)\n"
    );
    let mut with = python(&code);
    with.network = true;
    let out = r.run(with).await;
    assert_eq!(text(&out.stdout), "True\n", "{}", text(&out.stderr));
    let out = r.run(python(&code)).await;
    assert_eq!(text(&out.stdout), "False\n", "{}", text(&out.stderr));
    r.stop().await;
}

/// A probe of the interpreter a Python program finds itself in (argv, path, flags, modules,
/// __main__, signals, stdio, environment), then an uncaught exception.
const INTERPRETER_PROBE: &str = r#"import os, signal, sys
print(sys.argv, sys.path[0], sys.orig_argv[1:2], sys.flags)
print(__name__, sorted(globals()), '__file__' in globals() and __file__)
print(sorted(sys.modules))
print([signal.getsignal(s) for s in (signal.SIGINT, signal.SIGPIPE, signal.SIGTERM, signal.SIGXFSZ)])
print(sys.stdin.read() == '', sys.stdout.write_through, sys.stdout.encoding, sys.dont_write_bytecode)
print(sorted(kv for kv in os.environ.items() if kv[0] != 'PYTHONCAIRNFRESH'), os.getcwd(), os.getuid())
def fail():
    raise ValueError("boom")
fail()
"#;

/// A pooled run (which may run in a fork of the waiting sandbox's warm interpreter) and a cold
/// one (in a fork of its waiter started as the job's interpreter) see what a freshly started
/// `python3` sees (a `PYTHON*` variable of the job's own makes the runner start one): code
/// and file programs, exit statuses, tracebacks; a job with variables of its own still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pooled_python_run_sees_what_a_fresh_interpreter_sees() {
    if !gvisor_usable("gvisor_warm_interpreter") {
        return;
    }
    let file = |code: &str| cairn_proto::RunRequest {
        language: "python".into(),
        code_file: "main.py".into(),
        input_files: vec![input("main.py", code.as_bytes())],
        ..Default::default()
    };
    let mut with_env = python("import os, sys; print(os.environ['EXTRA'], sys.argv)");
    with_env.env.insert("EXTRA".into(), "yes".into());
    let fresh = |mut req: cairn_proto::RunRequest| {
        req.env.insert("PYTHONCAIRNFRESH".into(), "1".into());
        req
    };
    // Which interpreter ran the job: the waiter's (its fork) or a new one.
    let cmdline = "print(open('/proc/self/cmdline').read().split(chr(0))[-3:-1])";
    let requests = [
        python(INTERPRETER_PROBE),
        file(INTERPRETER_PROBE),
        python("import sys; print('out'); sys.exit(3)"),
        python("raise SystemExit('bye')"),
        python("import os; os._exit(5)"),
        python("import atexit; atexit.register(lambda: print('at exit'))"),
        with_env,
        fresh(python(INTERPRETER_PROBE)),
        fresh(file(INTERPRETER_PROBE)),
        python(cmdline),
        fresh(python(cmdline)),
    ];
    let mut seen = Vec::new();
    for case in cases() {
        let r = TestRunner::start(case).await;
        let mut outs = Vec::new();
        for req in requests.clone() {
            let out = r.run(req).await;
            outs.push((out.exit_code, text(&out.stdout), text(&out.stderr)));
        }
        r.stop().await;
        seen.push(outs);
    }
    let (cold, pooled) = (&seen[0], &seen[1]);
    for outs in [cold, pooled] {
        assert_eq!(
            outs[7], outs[0],
            "code: a fresh interpreter (left) and a fork differ"
        );
        assert_eq!(
            outs[8], outs[1],
            "file: a fresh interpreter (left) and a fork differ"
        );
    }
    assert_eq!(
        cold[9].1, "['--warm', '--now']\n",
        "a cold Python job runs in its waiter"
    );
    assert_eq!(cold[10].1, format!("['-c', {cmdline:?}]\n"));
    assert_eq!(cold[0].0, 1, "{:?}", cold[0]);
    assert!(
        cold[0].2.ends_with("in fail\nValueError: boom\n"),
        "{}",
        cold[0].2
    );
    assert_eq!((cold[2].0, cold[3].0, cold[4].0), (3, 1, 5));
    assert_eq!(cold[5].1, "at exit\n");
    assert_eq!(cold[6].1, "yes ['-c']\n");
    for (i, (c, p)) in cold.iter().zip(pooled).enumerate().take(9) {
        assert_eq!(c, p, "request {i}: cold (left) and pooled (right) differ");
    }
}

/// On gvisor a session is one sandbox for its life: a command's background processes and
/// /tmp are there for the next; each command runs as the sandbox user in /workspace; a
/// timeout kills that command's processes only; closing leaves no sandbox, runsc state,
/// bundle, process or directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gvisor_session_is_one_sandbox_for_its_life() {
    if !gvisor_usable("gvisor_session") {
        return;
    }
    let r = TestRunner::start(cases()[0]).await;
    let mut c = r.client.clone();
    let sid = open_session(&r).await;
    let sandboxes = gvisor_sandboxes(r.work_root.path()).await;
    assert_eq!(sandboxes.len(), 1, "one sandbox at open: {sandboxes:?}");
    let exec =
        |command: &str, timeout_ms: u64| session_exec(&r, &sid, command.to_owned(), timeout_ms);
    let t0 = std::time::Instant::now();
    let out = exec(
        "sleep 30 & echo $! > /tmp/bg.pid; echo started; pwd; id -u; echo $HOME",
        0,
    )
    .await;
    assert_eq!(
        (out.exit_code, text(&out.stdout).as_str()),
        (0, "started\n/workspace\n10001\n/tmpfs\n"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "a background process held the command's reply: {:?}",
        t0.elapsed()
    );
    let out = exec("kill -0 $(cat /tmp/bg.pid) && echo alive", 0).await;
    assert_eq!(text(&out.stdout), "alive\n", "{}", text(&out.stderr));
    // Timed out: its own processes (background ones included) die, the session's others stay.
    let out = exec(
        "sleep 60 & echo $! > /tmp/mine.pid; echo waiting; sleep 60",
        1000,
    )
    .await;
    assert!(out.timed_out && out.exit_code == -1, "{out:?}");
    assert_eq!(text(&out.stdout), "waiting\n");
    let out = exec(
        "kill -0 $(cat /tmp/bg.pid) && echo first alive; kill -0 $(cat /tmp/mine.pid) 2>/dev/null || echo timed-out gone",
        0,
    )
    .await;
    assert_eq!(
        text(&out.stdout),
        "first alive\ntimed-out gone\n",
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        gvisor_sandboxes(r.work_root.path()).await,
        sandboxes,
        "every command ran in the session's one sandbox"
    );
    let closed = c
        .close_session(cairn_proto::CloseSessionRequest {
            session_id: sid.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(closed.closed);
    let gv = r.work_root.path().join("gvisor");
    assert_eq!(
        gvisor_sandboxes(r.work_root.path()).await,
        Vec::<String>::new()
    );
    assert_eq!(std::fs::read_dir(gv.join("bundles")).unwrap().count(), 0);
    assert_eq!(
        std::fs::read_dir(r.work_root.path().join("tasks"))
            .unwrap()
            .count(),
        0
    );
    let left = gvisor_processes(r.work_root.path());
    assert!(left.is_empty(), "processes left: {left:?}");
    r.stop().await;
}

async fn open_session(r: &TestRunner) -> String {
    r.client
        .clone()
        .open_session(cairn_proto::OpenSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .session_id
}

/// `command` run in session `sid` (timeout 0: the runner's default).
async fn session_exec(
    r: &TestRunner,
    sid: &str,
    command: String,
    timeout_ms: u64,
) -> cairn_proto::ExecResult {
    let req = cairn_proto::ExecRequest {
        session_id: sid.into(),
        command,
        timeout_ms,
        ..Default::default()
    };
    r.client.clone().exec(req).await.unwrap().into_inner()
}

/// The first process of a gvisor session starts its commands and holds CAP_SETUID and
/// CAP_SETGID to do it: a command runs as the sandbox user with no capabilities, cannot signal
/// it, and a process of the session that asks it directly (for uid 0, with garbage, or
/// connecting and sending nothing) gets no more than a command of its own and holds up no
/// other; the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_command_gets_no_privilege_from_the_process_that_starts_it() {
    if !gvisor_usable("gvisor_session_spawner") {
        return;
    }
    let r = TestRunner::start(cases()[0]).await;
    let sid = open_session(&r).await;
    let exec = |command: &str| session_exec(&r, &sid, command.to_owned(), 0);
    let out = exec("grep -E '^(Uid|Gid|CapPrm|CapEff):' /proc/self/status").await;
    let status = text(&out.stdout);
    let fields: Vec<Vec<&str>> = status
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        fields,
        [
            vec!["Uid:", "10001", "10001", "10001", "10001"],
            vec!["Gid:", "10001", "10001", "10001", "10001"],
            vec!["CapPrm:", "0000000000000000"],
            vec!["CapEff:", "0000000000000000"],
        ],
        "{status}{}",
        text(&out.stderr)
    );
    let out = exec("kill -KILL 1; echo rc=$?").await;
    assert_eq!(text(&out.stdout), "rc=1\n", "{}", text(&out.stderr));
    // Asked directly for uid 0 with a job of its own: the sandbox user, exit code answered.
    // A connection that sends nothing holds nobody up: the next is answered at once.
    let ask = r#"python3 - <<'PY'
import _socket, json, os, sys, time
ADDR = b"\0cairn-session-spawner"
def connect():
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    s.connect(ADDR)
    return s
held = connect()
t0 = time.monotonic()
s = connect()
r, w = os.pipe()
job = {"relay": True, "reap": False, "argv": ["sh", "-c", "id -u; exit 7"], "uid": 0, "user": "root",
       "env": [["PATH", "/usr/bin:/bin"]], "cwd": "/", "rlimits": {}}
fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, w, w))
s.sendmsg([(json.dumps(job) + "\n").encode()], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
os.close(w)
print(os.read(r, 100).decode().strip(), int.from_bytes(s.recv(4), "big", signed=True))
print("at once" if time.monotonic() - t0 < 2 else "held up %.1f s" % (time.monotonic() - t0))
bad = connect()
bad.sendall(b"not a job\n")
print("refused" if bad.recv(4) == b"" else "answered")
deep = connect()
line = b"[" * 100000 + b"\n"
sent = deep.sendmsg([line], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2)))])
deep.sendall(line[sent:])
print("refused" if deep.recv(4) == b"" else "answered")
PY"#;
    let out = exec(ask).await;
    assert_eq!(
        text(&out.stdout),
        "10001 7\nat once\nrefused\nrefused\n",
        "{}",
        text(&out.stderr)
    );
    let out = exec("echo still here").await;
    assert_eq!(text(&out.stdout), "still here\n");
    r.stop().await;
}
