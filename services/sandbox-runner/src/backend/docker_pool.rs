//! The docker backend's agent containers and its warm pool (refill policy in crate::pool).
//! Every one-shot run goes to a container running the agent (agent.py) with its stdin/stdout
//! attached, so a run is one round trip: job in, framed output, result and /output tar back.
//! The pool creates and starts such containers ahead of time for the default image and limits;
//! a run the pool cannot serve gets one made for it. A container serves one run and is removed.

use std::collections::HashMap;
use std::io::Read;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::AttachContainerOptionsBuilder;
use bytes::{Buf, Bytes, BytesMut};
use cairn_proto::StdStream;
use futures::{Stream, StreamExt};
use time::OffsetDateTime;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::docker::{self, ContainerGuard, LiveSet};
use super::{keep, Live};
use crate::capture::Capture;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::job::{Job, Outcome};
use crate::limits::Limits;
use crate::outputs::{self, OutputLimits};
use crate::pool::Source;

const AGENT: &str = include_str!("../agent.py");
/// Largest frame the agent may send (its own frames are at most 1 MiB).
const MAX_FRAME: usize = (1 << 20) + 64;
/// Time the agent gets beyond the job's timeout and grace to report.
const AGENT_SLACK: Duration = Duration::from_secs(10);

type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// Makes warm containers.
pub struct DockerSource {
    pub client: bollard::Docker,
    pub config: Arc<Config>,
    pub live: LiveSet,
}

/// A started container whose agent waits for its one job (a warm one, or a cold run's).
pub struct Warm {
    guard: ContainerGuard,
    input: Pin<Box<dyn AsyncWrite + Send>>,
    output: Output,
    uid: u32,
    gid: u32,
    warm: bool,
}

impl DockerSource {
    /// Can a warm container (the default image and limits, no network) take this job?
    pub fn fits(&self, job: &Job) -> bool {
        let d = self.config.default_limits();
        !job.network
            && job.image == self.config.image
            && job.limits.memory_bytes == d.memory_bytes
            && job.limits.cpu_millis == d.cpu_millis
            && job.limits.pids == d.pids
            && job.limits.max_input_bytes <= d.max_input_bytes
            && job.limits.max_output_bytes <= d.max_output_bytes
    }
}

impl Source for DockerSource {
    type Item = Warm;
    const WHAT: &'static str = "warm container";
    const KIND: &'static str = "docker";

    fn size(&self) -> usize {
        self.config.pool_size
    }

    async fn discard(&self, warm: Warm) {
        let _ = warm.guard.remove().await;
    }

    async fn make(&self) -> Result<Warm> {
        let labels = HashMap::from([
            (
                docker::LABEL_RUNNER.to_string(),
                self.config.runner_id.clone(),
            ),
            (docker::LABEL_KIND.to_string(), "pool".to_string()),
        ]);
        start_agent(
            &self.client,
            &self.live,
            &self.config,
            AgentContainer {
                name: format!(
                    "{}{}{}",
                    self.config.container_prefix,
                    uuid::Uuid::now_v7().simple(),
                    self.config.container_suffix
                ),
                labels,
                image: &self.config.image,
                limits: &self.config.default_limits(),
                network: None,
                warm: true,
            },
        )
        .await
    }
}

/// What an agent container is made for: the pool's (ahead of time, the default image and
/// limits, no network) or one cold run's (its image, limits and network).
pub struct AgentContainer<'a> {
    pub name: String,
    pub labels: HashMap<String, String>,
    pub image: &'a str,
    pub limits: &'a Limits,
    /// The Docker network to join, or None for none.
    pub network: Option<&'a str>,
    /// Made ahead of time (the result says `warm`).
    pub warm: bool,
}

/// Creates and starts a container whose agent waits for its one job. Its `/output` is a tmpfs
/// the engine mounts with `max_total_output_bytes` as its size (writes past it fail with
/// ENOSPC), read back by the agent as a tar stream before the container stops: the engine's
/// archive API never sees a tmpfs, and the runner needs no right to mount anything.
pub async fn start_agent(
    client: &bollard::Docker,
    live: &docker::LiveSet,
    config: &Config,
    spec: AgentContainer<'_>,
) -> Result<Warm> {
    let base = docker::host_config(spec.limits, spec.network);
    let mut tmpfs = base.tmpfs.clone().unwrap_or_default();
    tmpfs.insert(
        "/input".into(),
        format!(
            "rw,nosuid,nodev,size={},mode=755",
            spec.limits.max_input_bytes + (1 << 20)
        ),
    );
    // The writable area: writes past max_total_output_bytes fail with ENOSPC.
    tmpfs.insert(
        "/output".into(),
        format!(
            "rw,nosuid,nodev,size={},mode=755,uid={},gid={}",
            config.max_total_output_bytes, config.sandbox_uid, config.sandbox_gid
        ),
    );
    let body = ContainerCreateBody {
        image: Some(spec.image.to_owned()),
        cmd: Some(vec![
            "python3".into(),
            "-I".into(),
            "-S".into(),
            "-c".into(),
            AGENT.into(),
        ]),
        // The agent is root with only SETUID/SETGID/KILL: it drops to the sandbox user for
        // the program (which then cannot signal or trace it) and can kill all it started.
        user: Some("0:0".into()),
        working_dir: Some("/tmp".into()),
        labels: Some(spec.labels),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        network_disabled: Some(spec.network.is_none()),
        host_config: Some(HostConfig {
            tmpfs: Some(tmpfs),
            cap_add: Some(vec!["SETUID".into(), "SETGID".into(), "KILL".into()]),
            ..base
        }),
        ..Default::default()
    };
    let name = spec.name;
    let guard = docker::create(client, live, &name, body).await?;
    let attach = AttachContainerOptionsBuilder::default()
        .stdin(true)
        .stdout(true)
        .stderr(true)
        .stream(true)
        .logs(false)
        .build();
    let attached = client
        .attach_container(&name, Some(attach))
        .await
        .map_err(Error::docker("attaching to an agent container"))?;
    client
        .start_container(&name, None)
        .await
        .map_err(Error::docker("starting an agent container"))?;
    Ok(Warm {
        guard,
        input: attached.input,
        output: attached.output,
        uid: config.sandbox_uid,
        gid: config.sandbox_gid,
        warm: spec.warm,
    })
}

impl Warm {
    /// Runs `job` in this container (one round trip) and removes the container afterwards.
    pub async fn run(mut self, job: &Job, live: Option<&Live>, grace_ms: u64) -> Result<Outcome> {
        let line = encode_job(job, grace_ms, self.uid, self.gid);
        let started_at = OffsetDateTime::now_utc();
        let t0 = Instant::now();
        self.input
            .write_all(&line)
            .await
            .map_err(Error::io("sending the job to the agent"))?;
        // stdin stays open until this run is over: the agent ends everything at its end of
        // file (the runner gone), so a warm run never outlives its runner.

        let mut stdout = Capture::new(job.limits.max_stdout_bytes);
        let mut stderr = Capture::new(job.limits.max_stderr_bytes);
        let mut agent_log = Capture::new(16 * 1024);
        let mut buf = BytesMut::new();
        let mut result: Option<serde_json::Value> = None;
        let mut end: Option<serde_json::Value> = None;
        let limits = OutputLimits {
            max_files: job.limits.max_output_files,
            max_bytes: job.limits.max_output_bytes,
        };
        let (tar_tx, tar_rx) = mpsc::channel::<Bytes>(16);
        let collector = tokio::task::spawn_blocking(move || {
            let reader = ChannelReader {
                rx: tar_rx,
                current: Bytes::new(),
            };
            outputs::from_tar(reader, "output", limits)
        });
        let mut tar_tx = Some(tar_tx);
        let deadline = t0 + Duration::from_millis(job.limits.timeout_ms + grace_ms) + AGENT_SLACK;
        let mut backstop_hit = false;
        'read: while end.is_none() {
            let item = match tokio::time::timeout_at(deadline.into(), self.output.next()).await {
                Ok(item) => item,
                Err(_) => {
                    backstop_hit = true;
                    break;
                }
            };
            let data = match item {
                Some(Ok(LogOutput::StdOut { message }))
                | Some(Ok(LogOutput::Console { message })) => message,
                Some(Ok(LogOutput::StdErr { message })) => {
                    agent_log.push(&message);
                    continue;
                }
                Some(Ok(LogOutput::StdIn { .. })) => continue,
                Some(Err(_)) | None => break,
            };
            buf.extend_from_slice(&data);
            while buf.len() >= 5 {
                let kind = buf[0];
                let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                if len > MAX_FRAME {
                    return Err(Error::Sandbox(format!(
                        "the sandbox agent sent a {len}-byte frame"
                    )));
                }
                if buf.len() < 5 + len {
                    break;
                }
                buf.advance(5);
                let payload = buf.split_to(len).freeze();
                match kind {
                    1 => keep(&mut stdout, &payload, StdStream::Stdout, live).await,
                    2 => keep(&mut stderr, &payload, StdStream::Stderr, live).await,
                    3 => {
                        // The collector stops reading at the output limits; then we stop sending.
                        if let Some(tx) = &tar_tx {
                            if tx.send(payload).await.is_err() {
                                tar_tx = None;
                            }
                        }
                    }
                    4 => result = serde_json::from_slice(&payload).ok(),
                    5 => {
                        end = Some(serde_json::from_slice(&payload).unwrap_or_default());
                        break 'read;
                    }
                    other => {
                        return Err(Error::Sandbox(format!(
                            "the sandbox agent sent frame kind {other}"
                        )))
                    }
                }
            }
        }
        drop(tar_tx);
        let duration_ms = t0.elapsed().as_millis() as u64;
        // Used once: removed in the background so the reply does not wait for it.
        self.guard.remove_in_background();
        let Some(result) = result else {
            let log = String::from_utf8_lossy(agent_log.bytes()).into_owned();
            return Err(Error::Sandbox(if backstop_hit {
                "the sandbox agent did not answer within the timeout, the grace and 10 s".into()
            } else {
                format!("the sandbox agent ended without a result: {log}")
            }));
        };
        let mut outputs = match collector.await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => return Err(Error::io("reading /output from the sandbox agent")(e)),
            Err(e) => return Err(Error::Sandbox(format!("output collection panicked: {e}"))),
        };
        if let Some(list) = end
            .as_ref()
            .and_then(|e| e.get("unreadable"))
            .and_then(|u| u.as_array())
        {
            // /output was not read whole: nothing is published.
            outputs = outputs.unreadable(
                list.iter()
                    .filter_map(|p| p.as_str())
                    .take(job.limits.max_output_files as usize)
                    .map(str::to_owned),
            );
        }
        let timed_out = result
            .get("timed_out")
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
            || backstop_hit;
        let exit_code = result
            .get("exit_code")
            .and_then(|v| v.as_i64())
            .unwrap_or(-1) as i32;
        let oom = result.get("oom").and_then(|v| v.as_bool()).unwrap_or(false);
        let writable_area_full = result.get("full").and_then(|v| v.as_bool()) == Some(true);
        // The agent forwards each stream up to its cap and counts the rest.
        let wrote = |key: &str| result.get(key).and_then(|v| v.as_u64()).unwrap_or(0);
        stdout.wrote(wrote("stdout_bytes"));
        stderr.wrote(wrote("stderr_bytes"));
        if writable_area_full {
            outputs = outputs.out_of_space();
        }
        Ok(Outcome {
            exit_code: if timed_out { -1 } else { exit_code },
            timed_out,
            oom_killed: !timed_out && oom && exit_code == 137,
            warm: self.warm,
            started_at,
            duration_ms,
            stdout,
            stderr,
            outputs,
            writable_area_full,
        })
    }
}

/// A blocking reader over the tar chunks the async side receives.
struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.current = b,
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

/// The job as the agent reads it (agent.py's `read_job`), with no module it would have to
/// import: `<length>\n`, then that many bytes: a line of ten numbers (uid, gid, timeout_ms,
/// grace_ms, max_stdout, max_stderr, fsize, and how many argv items, environment variables
/// and inputs follow), then each argv item, each variable's name and value, and each input's
/// path and content as `<length>:<bytes>,`.
pub fn encode_job(job: &Job, grace_ms: u64, uid: u32, gid: u32) -> Vec<u8> {
    let (argv, env) = (job.argv(), job.environment());
    let limits = &job.limits;
    let mut body = format!(
        "{uid} {gid} {} {grace_ms} {} {} {} {} {} {}\n",
        limits.timeout_ms,
        limits.max_stdout_bytes,
        limits.max_stderr_bytes,
        OutputLimits::file_size_cap(limits.max_output_bytes),
        argv.len(),
        env.len(),
        job.inputs.len()
    )
    .into_bytes();
    let mut field = |bytes: &[u8]| {
        body.extend_from_slice(format!("{}:", bytes.len()).as_bytes());
        body.extend_from_slice(bytes);
        body.push(b',');
    };
    for a in &argv {
        field(a.as_bytes());
    }
    for (k, v) in &env {
        field(k.as_bytes());
        field(v.as_bytes());
    }
    for i in &job.inputs {
        field(i.path.as_str().as_bytes());
        field(&i.content);
    }
    let mut out = format!("{}\n", body.len()).into_bytes();
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::io::Write;
    use std::process::{Command, Stdio};

    use cairn_proto as pb;

    use crate::config::Config;
    use crate::job::Job;

    /// Runs `driver` in python3 with the agent's functions (not its main) in `agent`, `input`
    /// on its stdin.
    fn in_agent(driver: &str, input: &[u8]) -> std::process::Output {
        let script = format!(
            "import json, sys\nagent = {{\"__name__\": \"agent\"}}\nexec(sys.argv[1], agent)\n{driver}"
        );
        let mut child = Command::new("python3")
            .args(["-I", "-S", "-c", &script, super::AGENT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs the agent's code");
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    }

    /// The agent's `read_job` of `input`, as JSON (bytes as Latin-1).
    fn agent_reads(input: &[u8]) -> std::process::Output {
        in_agent(
            r#"
j = agent["read_job"](sys.stdin.buffer)
s = lambda b: b.decode("latin-1")
print(json.dumps({"numbers": [j.uid, j.gid, j.timeout_ms, j.grace_ms, j.max_stdout, j.max_stderr, j.fsize],
    "argv": [s(a) for a in j.argv], "env": {s(k): s(v) for k, v in j.env.items()},
    "inputs": [[s(p), s(c)] for p, c in j.inputs], "rest": s(sys.stdin.buffer.read())}))
"#,
            input,
        )
    }

    fn latin1(b: &[u8]) -> String {
        b.iter().map(|&c| c as char).collect()
    }

    #[test]
    fn the_agent_reads_every_field_of_the_job_the_runner_writes() {
        let nasty = "a,b:c\n12:x,\u{e9}";
        let req = pb::RunRequest {
            request_id: "r1".into(),
            language: "python".into(),
            code: format!("print({nasty:?})"),
            input_files: vec![
                pb::FileContent {
                    path: "d/e/x.bin".into(),
                    content: vec![0, 255, b',', b':', b'\n', b'9'].into(),
                },
                pb::FileContent {
                    path: "empty".into(),
                    content: Default::default(),
                },
            ],
            env: [("K".to_owned(), nasty.to_owned())].into(),
            ..Default::default()
        };
        let job = Job::from_request(req, &Config::default()).unwrap();
        let mut input = super::encode_job(&job, 250, 10001, 10002);
        // What follows the job (the runner's stdin stays open) is not read as part of it.
        input.extend_from_slice(b"after");
        let out = agent_reads(&input);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let l = &job.limits;
        assert_eq!(
            got["numbers"],
            serde_json::json!([
                10001,
                10002,
                l.timeout_ms,
                250,
                l.max_stdout_bytes,
                l.max_stderr_bytes,
                crate::outputs::OutputLimits::file_size_cap(l.max_output_bytes)
            ])
        );
        let argv: Vec<String> = job.argv().iter().map(|a| latin1(a.as_bytes())).collect();
        assert_eq!(got["argv"], serde_json::json!(argv));
        for (k, v) in job.environment() {
            assert_eq!(
                got["env"][latin1(k.as_bytes())],
                latin1(v.as_bytes()),
                "{k}"
            );
        }
        assert_eq!(
            got["env"].as_object().unwrap().len(),
            job.environment().len()
        );
        assert_eq!(
            got["inputs"],
            serde_json::json!([
                ["d/e/x.bin", latin1(&[0, 255, b',', b':', b'\n', b'9'])],
                ["empty", ""]
            ])
        );
        assert_eq!(got["rest"], "after");
    }

    #[test]
    fn a_job_cut_short_or_malformed_is_refused_by_the_agent() {
        let req = pb::RunRequest {
            request_id: "r1".into(),
            language: "python".into(),
            code: "print(1)".into(),
            ..Default::default()
        };
        let whole = super::encode_job(
            &Job::from_request(req, &Config::default()).unwrap(),
            1,
            1,
            1,
        );
        let cut = &whole[..whole.len() - 3];
        let out = agent_reads(cut);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("the job ended early"));
        // A field whose length runs past its comma.
        let text = String::from_utf8(whole.clone()).unwrap();
        let bad = text.replacen("2:-c,", "3:-c,", 1);
        assert_ne!(bad, text);
        let out = agent_reads(bad.as_bytes());
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("not closed"));
    }

    #[test]
    fn names_the_agent_cannot_read_reach_the_runner_as_json_it_parses() {
        // The end frame's names are written without the json module: quotes, backslashes,
        // control characters, any Unicode, and bytes that are not UTF-8 (as os.listdir gives
        // them) must come out as JSON serde reads, one string per name.
        let names: [&[u8]; 6] = [
            b"plain.txt",
            b"q\"uote\\back",
            b"tab\tnew\nline\x01\x1f",
            "caf\u{e9}/\u{1F600}".as_bytes(),
            b"bad\xff\xfeutf8",
            b"",
        ];
        let out = in_agent(
            r#"
import os
names = [os.fsdecode(n) for n in sys.stdin.buffer.read().split(b"\0")]
print("[%s]" % ", ".join(agent["json_str"](n) for n in names))
"#,
            &names.join(&b"\0"[..]),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
        let want: Vec<String> = names
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        assert_eq!(got, want);
    }
}
