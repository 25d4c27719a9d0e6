//! One-shot runs over gRPC, on every backend this host offers.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::{Limits, StdStream};
use cairn_sandbox_runner::BackendChoice;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hello_world_in_python_bash_and_sh() {
    for backend in backends("hello_world").await {
        let r = TestRunner::start(backend).await;
        let out = r.run(python("print('hello from python')")).await;
        assert_eq!(
            text(&out.stdout),
            "hello from python\n",
            "{backend:?}: {out:?}"
        );
        assert_eq!(out.exit_code, 0);
        assert!(!out.timed_out && !out.oom_killed);
        assert_eq!(out.backend, backend.name());
        let out = r.run(bash("echo hi $((6*7)); echo err >&2; exit 3")).await;
        assert_eq!(text(&out.stdout), "hi 42\n");
        assert_eq!(text(&out.stderr), "err\n");
        assert_eq!(out.exit_code, 3);
        let mut sh = bash("id -u; id -g");
        sh.language = "sh".into();
        let out = r.run(sh).await;
        assert_eq!(
            text(&out.stdout),
            "10001\n10001\n",
            "runs as the sandbox uid, not root ({backend:?})"
        );
        // result.json's fields
        let rj: serde_json::Value = serde_json::from_str(&out.result_json).unwrap();
        assert_eq!(rj["job_id"], out.job_id.as_str());
        assert_eq!(rj["exit_code"], 0);
        assert_eq!(rj["timed_out"], false);
        assert!(rj["duration_ms"].is_u64());
        assert_eq!(rj["stdout"]["summary"], "10001\n10001\n");
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inputs_are_visible_and_read_only() {
    for backend in backends("inputs_read_only").await {
        let r = TestRunner::start(backend).await;
        let mut req = python(
            "import os\n\
             print(open('/input/data/in.txt').read(), end='')\n\
             for p in ['/input/data/in.txt', '/input/new.txt', '/input/data/new.txt']:\n\
             \x20   try:\n\
             \x20       open(p, 'a').write('x'); print('WROTE', p)\n\
             \x20   except OSError as e:\n\
             \x20       print('refused', p)\n",
        );
        req.input_files = vec![input("data/in.txt", b"line one\n")];
        let out = r.run(req).await;
        assert_eq!(
            text(&out.stdout),
            "line one\nrefused /input/data/in.txt\nrefused /input/new.txt\nrefused /input/data/new.txt\n",
            "{backend:?}: {}",
            text(&out.stderr)
        );
        // code_file runs one of the inputs
        let req = cairn_proto::RunRequest {
            language: "python".into(),
            code_file: "scripts/main.py".into(),
            input_files: vec![input(
                "scripts/main.py",
                b"import sys\nprint('from file', sys.argv[0])\n",
            )],
            ..Default::default()
        };
        let out = r.run(req).await;
        assert_eq!(
            text(&out.stdout),
            "from file /input/scripts/main.py\n",
            "{}",
            text(&out.stderr)
        );
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_requests_are_refused_before_anything_runs() {
    for backend in backends("bad_requests").await {
        let r = TestRunner::start(backend).await;
        let mut c = r.client.clone();
        let mut req = python("print(1)");
        req.input_files = vec![input("../escape.txt", b"x")];
        let err = c.run(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(cairn_proto::reason::of(&err).as_deref(), Some("traversal"));
        let mut req = python("print(1)");
        req.input_files = vec![input("/etc/passwd", b"x")];
        let err = c.run(req).await.unwrap_err();
        assert_eq!(
            cairn_proto::reason::of(&err).as_deref(),
            Some("absolute_path")
        );
        let req = with_limits(
            python("print(1)"),
            Limits {
                memory_bytes: u64::MAX,
                ..Default::default()
            },
        );
        let err = c.run(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("memory_bytes"), "{}", err.message());
        // Below what any sandbox runs with (Docker refuses under 6 MiB): a permanent error,
        // INVALID_ARGUMENT, never a retryable UNAVAILABLE.
        let req = with_limits(
            python("print(1)"),
            Limits {
                memory_bytes: 1,
                ..Default::default()
            },
        );
        let err = c.run(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert_eq!(
            cairn_proto::reason::of(&err).as_deref(),
            Some("limit_out_of_range")
        );
        assert_eq!(
            cairn_proto::reason::detail(&err, "field").as_deref(),
            Some("limits.memory_bytes")
        );
        let mut req = python("print(1)");
        req.limits = Some(Limits {
            max_input_files: 1,
            ..Default::default()
        });
        req.input_files = vec![input("a", b"1"), input("b", b"2")];
        let err = c.run(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        let mut req = python("print(1)");
        req.language = "cobol".into();
        assert_eq!(
            c.run(req).await.unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let mut req = python("print(1)");
        req.network = true;
        assert_eq!(
            c.run(req).await.unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let info = c
            .get_runner_info(cairn_proto::GetRunnerInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.runner_id, r.handle.runner_id());
        assert!(info.languages.contains(&"python".to_string()));
        assert!(info.max_limits.unwrap().memory_bytes >= info.default_limits.unwrap().memory_bytes);
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outputs_come_back_byte_exact() {
    for backend in backends("outputs_byte_exact").await {
        let r = TestRunner::start(backend).await;
        let out = r
            .run(python(
                "import os\n\
                 os.makedirs('/output/sub/deeper')\n\
                 open('/output/bytes.bin','wb').write(bytes(range(256))*3)\n\
                 open('/output/sub/deeper/t.txt','w').write('é\\r\\n')\n\
                 open('/output/empty','w').close()\n",
            ))
            .await;
        assert_eq!(out.exit_code, 0, "{backend:?} {}", text(&out.stderr));
        let mut files: Vec<_> = out
            .output_files
            .iter()
            .map(|f| (f.path.as_str(), f.content.to_vec()))
            .collect();
        files.sort();
        let expected_bin: Vec<u8> = (0..=255u8).collect::<Vec<_>>().repeat(3);
        assert_eq!(
            files,
            vec![
                ("bytes.bin", expected_bin.clone()),
                ("empty", vec![]),
                ("sub/deeper/t.txt", "é\r\n".as_bytes().to_vec()),
            ]
        );
        let bin = out
            .output_files
            .iter()
            .find(|f| f.path == "bytes.bin")
            .unwrap();
        assert_eq!(bin.size_bytes, 768);
        use sha2::Digest;
        assert_eq!(bin.sha256, hex::encode(sha2::Sha256::digest(&expected_bin)));
        assert!(out.rejected_outputs.is_empty() && !out.outputs_truncated);
        let rj: serde_json::Value = serde_json::from_str(&out.result_json).unwrap();
        assert_eq!(rj["output_files"].as_array().unwrap().len(), 3);
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_utf8_and_closed_stdin() {
    for backend in backends("utf8_stdin").await {
        let r = TestRunner::start(backend).await;
        let out = r
            .run(python(
                "import sys; sys.stdout.buffer.write(b'\\xff\\xfe ok \\x80')",
            ))
            .await;
        assert_eq!(&out.stdout[..], b"\xff\xfe ok \x80");
        let out = r
            .run(with_timeout(
                python("try:\n    input()\nexcept EOFError:\n    print('EOF')\n"),
                20_000,
            ))
            .await;
        assert_eq!(
            text(&out.stdout),
            "EOF\n",
            "{backend:?}: {}",
            text(&out.stderr)
        );
        assert!(!out.timed_out);
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timeout_keeps_partial_output_and_kills_a_term_ignoring_process() {
    for backend in backends("timeout_partial").await {
        let r = TestRunner::start(backend).await;
        r.ready().await;
        let t0 = std::time::Instant::now();
        let out = r
            .run(with_timeout(
                python(
                    "import signal, time\n\
                     signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
                     print('before', flush=True)\n\
                     time.sleep(600)\n",
                ),
                2000,
            ))
            .await;
        assert!(out.timed_out, "{backend:?}: {out:?}");
        assert_eq!(out.exit_code, -1);
        assert_eq!(text(&out.stdout), "before\n");
        // timeout 2 s + grace 0.5 s: the program's 600 s never run. The kill itself goes
        // through the engine, which took up to ~26 s on a loaded 2-core CI machine, hence the
        // loose bound (still far below the program's 600 s).
        assert!(
            out.duration_ms < 60_000,
            "{backend:?}: ran {} ms",
            out.duration_ms
        );
        assert!(
            t0.elapsed().as_secs() < 300,
            "{backend:?} took {:?}",
            t0.elapsed()
        );
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn setsid_children_die_with_the_run() {
    for backend in backends("setsid_child").await {
        let r = TestRunner::start(backend).await;
        let marker = format!("sleep {}", 4000 + rand_u16());
        let code = format!(
            "import subprocess, os, time\n\
             subprocess.Popen(['setsid', 'bash', '-c', '{marker} & {marker}'], start_new_session=True)\n\
             if os.fork() == 0:\n\
             \x20   os.setsid()\n\
             \x20   if os.fork() == 0:\n\
             \x20       os.execvp('sleep', ['sleep', '{}'])\n\
             \x20   os._exit(0)\n\
             print('started', flush=True)\n\
             time.sleep(600)\n",
            &marker[6..]
        );
        let out = r.run(with_timeout(python(&code), 2500)).await;
        assert!(out.timed_out);
        assert_eq!(
            text(&out.stdout),
            "started\n",
            "{backend:?}: {}",
            text(&out.stderr)
        );
        // Nothing of the run survives it: no process, no container.
        let mut left = processes_with(&marker);
        for _ in 0..20 {
            if left.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            left = processes_with(&marker);
        }
        assert!(left.is_empty(), "{backend:?}: processes survived: {left:?}");
        if backend.gvisor() {
            // Its guest processes live in gVisor's kernel: the sandbox itself must be gone
            // (with a pool, the refilled waiting one stays).
            let allowed = usize::from(backend.pool);
            assert!(
                wait_for_gvisor_sandboxes(r.work_root.path(), allowed).await <= allowed,
                "gvisor sandbox left after the run"
            );
            assert_eq!(
                settled_processes_with(&out.job_id, 10).await,
                Vec::<i32>::new()
            );
        }
        if backend.docker() {
            let mut left = containers_named(&out.job_id).await;
            for _ in 0..40 {
                if left.is_empty() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                left = containers_named(&out.job_id).await;
            }
            assert!(left.is_empty(), "container left: {left:?}");
        }
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fork_bomb_ends_and_the_next_run_works() {
    for backend in backends("fork_bomb").await {
        // As runner defaults, so the warm pool (made with the defaults) serves it too.
        let r = TestRunner::start_with(backend, |c| c.defaults.pids = Some(64)).await;
        let req = with_timeout(bash(":(){ :|:& };:; sleep 30"), 5000);
        r.ready().await;
        let t0 = std::time::Instant::now();
        let out = r.run(req).await;
        assert!(t0.elapsed().as_secs() < 60);
        assert!(out.timed_out, "{backend:?}: {out:?}");
        let out = r.run(python("print('alive')")).await;
        assert_eq!(
            text(&out.stdout),
            "alive\n",
            "{backend:?}: {}",
            text(&out.stderr)
        );
        r.stop().await;
    }
}

/// The agent in a container shares the program's pids limit: once the program has started it
/// may hold every pid left (a fork bomb does within milliseconds), so the agent must finish the
/// run without a thread or process of its own. Here the program takes the last pid at once:
/// init, the agent and the program are 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_program_holding_the_last_pid_still_gets_its_result() {
    for backend in backends("last_pid")
        .await
        .into_iter()
        .filter(|b| b.docker())
    {
        let r = TestRunner::start_with(backend, |c| c.defaults.pids = Some(3)).await;
        let out = r
            .run(python("import time\ntime.sleep(1)\nprint('done')"))
            .await;
        assert_eq!(
            (out.exit_code, text(&out.stdout)),
            (0, "done\n".to_string()),
            "{backend:?}: {}",
            text(&out.stderr)
        );
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_bomb_is_stopped() {
    for backend in backends("memory_bomb").await {
        let r = TestRunner::start_with(backend, |c| {
            c.defaults.memory_bytes = Some(128 * 1024 * 1024)
        })
        .await;
        let req = with_timeout(
            python("x = []\nwhile True:\n    x.append(bytearray(16 * 1024 * 1024))\n"),
            30_000,
        );
        let out = r.run(req).await;
        assert!(!out.timed_out, "{backend:?}: {out:?}");
        assert_ne!(out.exit_code, 0);
        match backend.backend {
            // The kernel's OOM killer ends it inside the container's memory cgroup.
            BackendChoice::Docker => assert!(out.oom_killed, "docker: {out:?}"),
            // RLIMIT_AS: the allocation fails inside the program instead.
            _ => assert!(
                text(&out.stderr).contains("MemoryError"),
                "local: {}",
                text(&out.stderr)
            ),
        }
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_links_and_bad_names_are_refused() {
    for backend in backends("output_links").await {
        let r = TestRunner::start(backend).await;
        let host_file = r.work_root.path().join("host-secret.txt");
        std::fs::write(&host_file, b"host secret").unwrap();
        let code = format!(
            "import os\n\
             os.symlink('/etc/passwd', '/output/passwd')\n\
             os.symlink('{}', '/output/host')\n\
             os.symlink('/output', '/output/loop')\n\
             open('/output/ok.txt','w').write('fine')\n\
             os.link('/output/ok.txt', '/output/ok-again.txt')\n\
             open('/output/bad\\x01name','w').write('x')\n\
             open('/output/tab\\tname','w').write('x')\n\
             open('/output/CON','w').write('x')\n\
             os.mkfifo('/output/fifo')\n",
            host_file.display()
        );
        let out = r.run(python(&code)).await;
        assert_eq!(out.exit_code, 0, "{backend:?}: {}", text(&out.stderr));
        // Two names of one inode: the first met is collected, the other refused as a hard link.
        let names: Vec<_> = out.output_files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names.len(), 1, "{backend:?}: {names:?}");
        assert!(names[0] == "ok.txt" || names[0] == "ok-again.txt");
        assert_eq!(&out.output_files[0].content[..], b"fine");
        let mut rejected: Vec<_> = out
            .rejected_outputs
            .iter()
            .map(|r| {
                (
                    if r.path == "ok.txt" {
                        "ok-again.txt"
                    } else {
                        r.path.as_str()
                    },
                    r.reason.as_str(),
                )
            })
            .collect();
        rejected.sort();
        let mut expected = vec![
            ("CON", "reserved_name"),
            ("bad\u{1}name", "invalid_char"),
            ("fifo", "not_a_file"),
            ("host", "symlink"),
            ("loop", "symlink"),
            ("ok-again.txt", "hardlink"),
            ("passwd", "symlink"),
            ("tab\tname", "invalid_char"),
        ];
        if backend.gvisor() {
            // gVisor keeps a named pipe made on a bind mount inside its own kernel: the host
            // directory never holds it, so nothing is there to refuse (nor to publish).
            expected.retain(|(name, _)| *name != "fifo");
        }
        assert_eq!(rejected, expected, "{backend:?}");
        for f in &out.output_files {
            assert!(
                !f.content.windows(4).any(|w| w == b"root"),
                "passwd content leaked"
            );
            assert!(
                !f.content.windows(6).any(|w| w == b"secret"),
                "host file leaked"
            );
        }
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_count_limit_publishes_nothing() {
    for backend in backends("output_count").await {
        let r = TestRunner::start(backend).await;
        let req = with_limits(
            python("import os\nfor i in range(30000):\n    open(f'/output/f{i:06}', 'w').write('x')\nprint('done')\n"),
            Limits { timeout_ms: 120_000, max_output_files: 500, ..Default::default() },
        );
        let out = r.run(req).await;
        assert_eq!(
            text(&out.stdout),
            "done\n",
            "{backend:?}: {}",
            text(&out.stderr)
        );
        // All or nothing: none of the 30,000 is published; the listing stops at its cap (20,000).
        assert!(out.output_files.is_empty(), "{backend:?}");
        assert!(
            out.outputs_truncated && out.rejected_outputs_truncated,
            "{backend:?}"
        );
        assert_eq!(out.rejected_outputs.len(), 20_000, "{backend:?}");
        let unpublished = out
            .rejected_outputs
            .iter()
            .filter(|x| x.reason == "unpublished")
            .count();
        assert_eq!(unpublished, 500, "{backend:?}");
        assert!(out
            .rejected_outputs
            .iter()
            .all(|x| x.reason == "unpublished" || x.reason == "too_many_files"));
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn network_is_off() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // control: the port answers from the host
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    for backend in backends("network_off").await {
        let r = TestRunner::start(backend).await;
        let code = format!(
            "import socket\n\
             for host in ['127.0.0.1', '172.17.0.1', '1.1.1.1']:\n\
             \x20   s = socket.socket(); s.settimeout(2)\n\
             \x20   try:\n\
             \x20       s.connect((host, {port})); print('CONNECTED', host)\n\
             \x20   except OSError as e:\n\
             \x20       print('blocked', host)\n"
        );
        let out = r.run(python(&code)).await;
        assert_eq!(
            text(&out.stdout),
            "blocked 127.0.0.1\nblocked 172.17.0.1\nblocked 1.1.1.1\n",
            "{backend:?}: {}",
            text(&out.stderr)
        );
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_stream_sends_chunks_then_the_result() {
    for backend in backends("run_stream").await {
        let r = TestRunner::start(backend).await;
        r.ready().await;
        let mut stream = r
            .client
            .clone()
            .run_stream(python(
                "import time\nprint('a', flush=True)\ntime.sleep(0.3)\nprint('b', flush=True)\n",
            ))
            .await
            .unwrap()
            .into_inner();
        let mut chunks = Vec::new();
        let mut result = None;
        let mut beats = Vec::new();
        while let Some(msg) = stream.message().await.unwrap() {
            match msg.msg.unwrap() {
                cairn_proto::run_stream_response::Msg::Output(c) => {
                    assert!(result.is_none(), "chunk after the result");
                    assert_eq!(c.stream, StdStream::Stdout as i32);
                    chunks.extend_from_slice(&c.data);
                }
                cairn_proto::run_stream_response::Msg::Result(res) => result = Some(res),
                cairn_proto::run_stream_response::Msg::Heartbeat(h) => {
                    assert!(result.is_none() && chunks.is_empty(), "{h:?}");
                    beats.push(h);
                }
            }
        }
        // One heartbeat at once, with the runner's interval (5 s: none more in 0.3 s).
        assert_eq!(beats.len(), 1, "{beats:?}");
        assert_eq!(beats[0].interval_ms, 5000);
        assert_eq!(text(&chunks), "a\nb\n");
        assert_eq!(text(&result.unwrap().stdout), "a\nb\n");
        r.stop().await;
    }
}

fn rand_u16() -> u16 {
    (uuid::Uuid::new_v4().as_u128() % 60000) as u16
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_call_removes_its_sandbox() {
    for backend in backends("cancelled_call").await {
        let r = TestRunner::start(backend).await;
        r.ready().await;
        let marker = format!("time.sleep({})", 7000 + rand_u16() % 1000);
        let req = python(&format!("import time\n{marker}\n"));
        let call =
            tokio::time::timeout(std::time::Duration::from_secs(3), r.client.clone().run(req))
                .await;
        assert!(
            call.is_err(),
            "the run should still be going when the client gives up"
        );
        // The dropped call takes its sandbox with it.
        let t0 = std::time::Instant::now();
        loop {
            let procs = processes_with(&marker);
            let containers = if backend.docker() {
                containers_of(r.handle.runner_id()).await.len()
            } else if backend.gvisor() {
                gvisor_sandboxes(r.work_root.path()).await.len()
            } else {
                0
            };
            // with a pool, its refilled warm container stays (pool_size 1)
            let allowed = usize::from(backend.pool);
            if procs.is_empty() && containers <= allowed {
                break;
            }
            assert!(
                t0.elapsed().as_secs() < 20,
                "{backend:?}: left after cancel: {procs:?}, {containers} containers"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_isolation_means_no_runner() {
    let work_root = tempfile::tempdir().unwrap();
    let mut config = config(BackendChoice::Local, work_root.path());
    config.bwrap = "/nonexistent/bwrap".into();
    let err = cairn_sandbox_runner::sandbox_service(config)
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("bubblewrap"), "{err}");
    assert_eq!(
        tonic::Status::from(err).code(),
        tonic::Code::FailedPrecondition
    );
    // auto picks docker where the engine answers, else local
    let config = config_auto(work_root.path());
    let (_server, handle) = cairn_sandbox_runner::sandbox_service(config).await.unwrap();
    let expected = if docker_ready().await.is_ok() {
        "docker"
    } else {
        "local"
    };
    assert_eq!(handle.backend(), expected);
    handle.shutdown().await;
}

fn config_auto(work_root: &std::path::Path) -> cairn_sandbox_runner::Config {
    config(BackendChoice::Auto, work_root)
}

/// A burst larger than the pool: the pool serves what it holds, the rest run cold, and the
/// refill waits for the cold runs instead of competing with them for the engine; afterwards
/// the pool is full again and no run container is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_beyond_the_pool_runs_cold_and_the_pool_refills_after() {
    for backend in backends("burst_beyond_pool").await {
        if !backend.pool || !backend.docker() {
            continue;
        }
        let r = TestRunner::start_with(backend, |c| c.pool_size = 2).await;
        let t0 = std::time::Instant::now();
        let warm_now = |r: &TestRunner| {
            let mut client = r.client.clone();
            async move {
                client
                    .get_runner_info(cairn_proto::GetRunnerInfoRequest {})
                    .await
                    .unwrap()
                    .into_inner()
                    .warm_containers
            }
        };
        while warm_now(&r).await < 2 {
            assert!(t0.elapsed().as_secs() < 60, "pool never filled");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let pool_labels = [
            format!("cairn.runner_id={}", r.handle.runner_id()),
            "cairn.kind=pool".to_string(),
        ];
        burst_of_six_on_a_pool_of_two(&r, || async {
            containers_labelled(&pool_labels)
                .await
                .into_iter()
                .collect()
        })
        .await;
        let t0 = std::time::Instant::now();
        loop {
            let ready = warm_now(&r).await;
            let containers = containers_of(r.handle.runner_id()).await.len();
            if ready == 2 && containers == 2 {
                break;
            }
            assert!(
                t0.elapsed().as_secs() < 60,
                "after the burst: {ready} warm, {containers} containers (want 2 and 2)"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        r.stop().await;
    }
}
