//! A one-shot run: the request checked into a `Job` (language, program,
//! inputs, limits), and its `Outcome` turned into the RunResult with result.json.

use std::collections::HashSet;

use bytes::Bytes;
use cairn_proto::{OutputFile as ProtoOutputFile, RejectedOutput, RunRequest, RunResult};
use pathguard::SafePath;
use serde_json::json;
use time::OffsetDateTime;

use crate::capture::Capture;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::outputs::Outputs;

/// Program text passes as one argv string; the kernel caps one argument at 128 KiB.
pub const MAX_CODE_BYTES: usize = 120 * 1024;
const MAX_ENV_VARS: usize = 64;
const MAX_ENV_VALUE_BYTES: usize = 32 * 1024;
/// Characters of stdout/stderr kept in result.json's summaries.
const SUMMARY_CHARS: usize = 2000;

/// Languages `Run` accepts.
pub const LANGUAGES: &[&str] = &["python", "bash", "sh"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Python,
    Bash,
    Sh,
}

impl Language {
    pub fn parse(s: &str) -> Result<Language> {
        match s {
            "python" | "python3" => Ok(Language::Python),
            "bash" => Ok(Language::Bash),
            "sh" => Ok(Language::Sh),
            other => Err(Error::invalid(format!(
                "language {other:?} is not supported: use one of {}",
                LANGUAGES.join(", ")
            ))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Bash => "bash",
            Language::Sh => "sh",
        }
    }

    fn interpreter(self) -> &'static str {
        match self {
            Language::Python => "python3",
            Language::Bash => "bash",
            Language::Sh => "sh",
        }
    }
}

/// What to execute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// Inline text, passed as `-c`.
    Code(String),
    /// One of the input files, run from /input.
    File(SafePath),
}

/// A file staged read-only under /input.
#[derive(Debug, Clone)]
pub struct Input {
    pub path: SafePath,
    pub content: Bytes,
}

/// A checked run request.
#[derive(Debug, Clone)]
pub struct Job {
    /// Runner-assigned id (container name, task directory).
    pub id: String,
    pub request_id: String,
    pub run_id: String,
    pub node_id: String,
    pub language: Language,
    pub program: Program,
    pub inputs: Vec<Input>,
    pub limits: Limits,
    pub network: bool,
    pub env: Vec<(String, String)>,
    /// The step it performs, stable across deliveries (empty = none), and its redelivery count.
    pub step_key: String,
    pub redelivery: u32,
    /// The image it runs in (docker): the request's, allowed by the runner, or the default.
    pub image: String,
}

impl Job {
    /// Checks `req` against the runner's limits and policy (network, images); fails fast on
    /// the first problem.
    pub fn from_request(req: RunRequest, config: &Config) -> Result<Job> {
        let limits = Limits::resolve(
            req.limits.as_ref(),
            &config.default_limits(),
            &config.max_limits(),
        )?;
        let language = Language::parse(&req.language)?;
        for (what, id) in [
            ("request_id", &req.request_id),
            ("run_id", &req.run_id),
            ("node_id", &req.node_id),
        ] {
            if !id.is_empty() && !is_id(id) {
                return Err(Error::invalid(format!(
                    "{what} {id:?} must be 1-128 characters of [A-Za-z0-9._-]"
                )));
            }
        }
        config.check_network(req.network)?;
        let image = config.image_for(&req.image)?;
        let inputs = check_inputs(req.input_files, &limits)?;
        let program = match (req.code.is_empty(), req.code_file.is_empty()) {
            (false, true) => {
                if req.code.len() > MAX_CODE_BYTES {
                    return Err(Error::invalid(format!(
                        "code is {} bytes, over {MAX_CODE_BYTES}: send it as an input file and name it in code_file",
                        req.code.len()
                    )));
                }
                if req.code.contains('\0') {
                    return Err(Error::InvalidArgument {
                        message: "code contains a NUL character: remove it".into(),
                        reason: Some("invalid_char"),
                    });
                }
                Program::Code(req.code)
            }
            (true, false) => {
                let path =
                    pathguard::validate(&req.code_file).map_err(|rejection| Error::Path {
                        what: "code_file",
                        rejection,
                    })?;
                if !inputs.iter().any(|i| i.path == path) {
                    return Err(Error::InvalidArgument {
                        message: format!(
                            "code_file {:?} is not among input_files: add it there",
                            req.code_file
                        ),
                        reason: Some("not_a_file"),
                    });
                }
                Program::File(path)
            }
            (false, false) => {
                return Err(Error::invalid(
                    "both code and code_file are set: send exactly one",
                ))
            }
            (true, true) => {
                return Err(Error::invalid(
                    "neither code nor code_file is set: send exactly one",
                ))
            }
        };
        if req.env.len() > MAX_ENV_VARS {
            return Err(Error::invalid(format!(
                "{} environment variables, at most {MAX_ENV_VARS}",
                req.env.len()
            )));
        }
        let mut env: Vec<(String, String)> = req.env.into_iter().collect();
        env.sort();
        for (name, value) in &env {
            let valid =
                name.bytes().enumerate().all(|(i, b)| {
                    b == b'_' || b.is_ascii_uppercase() || (i > 0 && b.is_ascii_digit())
                }) && !name.is_empty();
            if !valid {
                return Err(Error::invalid(format!(
                    "environment variable name {name:?} must match [A-Z_][A-Z0-9_]*"
                )));
            }
            if value.contains('\0') || value.len() > MAX_ENV_VALUE_BYTES {
                return Err(Error::invalid(format!(
                    "environment variable {name}: value must have no NUL and at most {MAX_ENV_VALUE_BYTES} bytes"
                )));
            }
        }
        if let Some((name, _)) = env.iter().find(|(n, _)| n.starts_with(STEP_ENV_PREFIX)) {
            return Err(Error::invalid(format!(
                "environment variable {name}: names starting with {STEP_ENV_PREFIX} are set by the runner from step_key and redelivery"
            )));
        }
        if req.step_key.len() > MAX_STEP_KEY_BYTES
            || !req.step_key.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(Error::invalid(format!(
                "step_key must be at most {MAX_STEP_KEY_BYTES} printable ASCII bytes without spaces"
            )));
        }
        let id = uuid::Uuid::now_v7().simple().to_string();
        let request_id = if req.request_id.is_empty() {
            id.clone()
        } else {
            req.request_id
        };
        Ok(Job {
            id,
            request_id,
            run_id: req.run_id,
            node_id: req.node_id,
            language,
            program,
            inputs,
            limits,
            network: req.network,
            env,
            step_key: req.step_key,
            redelivery: req.redelivery,
            image,
        })
    }

    /// The command line inside the sandbox.
    pub fn argv(&self) -> Vec<String> {
        let interpreter = self.language.interpreter().to_owned();
        match &self.program {
            Program::Code(code) => vec![interpreter, "-c".into(), code.clone()],
            Program::File(path) => vec![interpreter, format!("/input/{path}")],
        }
    }

    /// Environment of the program (the request's variables over cairn's).
    pub fn environment(&self) -> Vec<(String, String)> {
        let mut env = base_environment();
        for (k, v) in &self.env {
            env.retain(|(name, _)| name != k);
            env.push((k.clone(), v.clone()));
        }
        if !self.step_key.is_empty() {
            env.push(("CAIRN_STEP_KEY".to_owned(), self.step_key.clone()));
            env.push((
                "CAIRN_STEP_REDELIVERY".to_owned(),
                self.redelivery.to_string(),
            ));
        }
        env
    }
}

/// Variables the runner sets from the request's step fields; a request may not name them.
const STEP_ENV_PREFIX: &str = "CAIRN_STEP_";
/// Longest step key.
const MAX_STEP_KEY_BYTES: usize = 256;

/// The environment of a program whose request sets no variables.
pub fn base_environment() -> Vec<(String, String)> {
    vec![
        (
            "PATH".to_owned(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        ),
        ("HOME".to_owned(), "/tmp".to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        // Unbuffered, so output written before a timeout kill is kept.
        ("PYTHONUNBUFFERED".to_owned(), "1".to_owned()),
        ("PYTHONDONTWRITEBYTECODE".to_owned(), "1".to_owned()),
    ]
}

/// Ids are opaque strings of [A-Za-z0-9._-], 1-128 characters (common.proto).
pub fn is_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && s != "."
        && s != ".."
}

fn check_inputs(files: Vec<cairn_proto::FileContent>, limits: &Limits) -> Result<Vec<Input>> {
    if files.len() as u64 > limits.max_input_files {
        return Err(Error::ResourceExhausted {
            message: format!(
                "{} input files, the limit is {}: send fewer files",
                files.len(),
                limits.max_input_files
            ),
            reason: "too_many_files",
        });
    }
    let total: u64 = files.iter().map(|f| f.content.len() as u64).sum();
    if total > limits.max_input_bytes {
        return Err(Error::ResourceExhausted {
            message: format!(
                "input files hold {total} bytes, the limit is {}: send less",
                limits.max_input_bytes
            ),
            reason: "too_large",
        });
    }
    let mut keys = HashSet::new();
    let mut inputs = Vec::with_capacity(files.len());
    for f in files {
        let path = pathguard::validate(&f.path).map_err(|rejection| Error::Path {
            what: "input file",
            rejection,
        })?;
        if !keys.insert(pathguard::fold_key(path.as_str())) {
            return Err(Error::InvalidArgument {
                message: format!(
                    "input file {:?} is given twice: send each path once",
                    f.path
                ),
                reason: Some("exists"),
            });
        }
        inputs.push(Input {
            path,
            content: f.content,
        });
    }
    // A path may not be both a file and the directory of another file.
    let dirs: HashSet<String> = inputs
        .iter()
        .flat_map(|i| {
            let comps: Vec<&str> = i.path.components().collect();
            (1..comps.len()).map(move |n| pathguard::fold_key(&comps[..n].join("/")))
        })
        .collect();
    if let Some(clash) = inputs
        .iter()
        .find(|i| dirs.contains(&pathguard::fold_key(i.path.as_str())))
    {
        return Err(Error::InvalidArgument {
            message: format!(
                "input file {:?} is also the directory of another input: rename one",
                clash.path.as_str()
            ),
            reason: Some("not_a_file"),
        });
    }
    Ok(inputs)
}

/// What happened when the job ran.
#[derive(Debug)]
pub struct Outcome {
    pub exit_code: i32,
    pub timed_out: bool,
    pub oom_killed: bool,
    /// Served by a warm pool container.
    pub warm: bool,
    pub started_at: OffsetDateTime,
    pub duration_ms: u64,
    pub stdout: Capture,
    pub stderr: Capture,
    pub outputs: Outputs,
    /// The writable area (/output) was full when the program ended.
    pub writable_area_full: bool,
}

/// The reply for `job`, with result.json.
pub fn run_result(
    job: &Job,
    outcome: Outcome,
    runner_id: &str,
    backend: &str,
    limits_enforced: bool,
) -> RunResult {
    let summary = |c: &Capture| {
        json!({
            "bytes": c.seen(),
            "kept_bytes": c.bytes().len(),
            "truncated": c.truncated(),
            "summary": String::from_utf8_lossy(c.bytes()).chars().take(SUMMARY_CHARS).collect::<String>(),
        })
    };
    let finished = outcome.started_at + time::Duration::milliseconds(outcome.duration_ms as i64);
    let rfc3339 = |t: OffsetDateTime| {
        let t = t
            .replace_nanosecond(t.millisecond() as u32 * 1_000_000)
            .unwrap_or(t);
        t.format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default()
    };
    let result_json = json!({
        "version": 1,
        "request_id": job.request_id,
        "job_id": job.id,
        "runner_id": runner_id,
        "backend": backend,
        "run_id": job.run_id,
        "node_id": job.node_id,
        "language": job.language.as_str(),
        "exit_code": outcome.exit_code,
        "timed_out": outcome.timed_out,
        "oom_killed": outcome.oom_killed,
        "warm": outcome.warm,
        "limits_enforced": limits_enforced,
        "writable_area_full": outcome.writable_area_full,
        "duration_ms": outcome.duration_ms,
        "started_at": rfc3339(outcome.started_at),
        "finished_at": rfc3339(finished),
        "stdout": summary(&outcome.stdout),
        "stderr": summary(&outcome.stderr),
        "output_files": outcome.outputs.files.iter().map(|f| json!({
            "path": f.path, "size_bytes": f.content.len(), "sha256": f.sha256,
        })).collect::<Vec<_>>(),
        "rejected_outputs": outcome.outputs.rejected.iter().map(|r| json!({
            "path": r.path, "reason": r.reason,
        })).collect::<Vec<_>>(),
        "outputs_truncated": outcome.outputs.truncated,
        "rejected_outputs_truncated": outcome.outputs.listing_truncated,
    });
    RunResult {
        request_id: job.request_id.clone(),
        job_id: job.id.clone(),
        runner_id: runner_id.to_owned(),
        backend: backend.to_owned(),
        exit_code: outcome.exit_code,
        timed_out: outcome.timed_out,
        oom_killed: outcome.oom_killed,
        duration_ms: outcome.duration_ms,
        stdout_truncated: outcome.stdout.truncated(),
        stderr_truncated: outcome.stderr.truncated(),
        stdout: Bytes::from(outcome.stdout.into_bytes()),
        stderr: Bytes::from(outcome.stderr.into_bytes()),
        output_files: outcome
            .outputs
            .files
            .into_iter()
            .map(|f| ProtoOutputFile {
                path: f.path,
                size_bytes: f.content.len() as u64,
                sha256: f.sha256,
                content: Bytes::from(f.content),
            })
            .collect(),
        rejected_outputs: outcome
            .outputs
            .rejected
            .into_iter()
            .map(|r| RejectedOutput {
                path: r.path,
                reason: r.reason,
            })
            .collect(),
        outputs_truncated: outcome.outputs.truncated,
        rejected_outputs_truncated: outcome.outputs.listing_truncated,
        result_json: result_json.to_string(),
        limits_enforced,
        writable_area_full: outcome.writable_area_full,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn req(code: &str) -> RunRequest {
        RunRequest {
            language: "python".into(),
            code: code.into(),
            ..Default::default()
        }
    }

    fn check(r: RunRequest) -> Result<Job> {
        Job::from_request(r, &Config::default())
    }

    #[test]
    fn code_xor_code_file() {
        assert!(check(req("print(1)")).is_ok());
        assert!(check(req("")).is_err());
        let mut r = req("print(1)");
        r.code_file = "a.py".into();
        assert!(check(r).is_err());
    }

    #[test]
    fn inputs_are_validated_and_limited() {
        let mut r = req("print(1)");
        r.input_files = vec![cairn_proto::FileContent {
            path: "../x".into(),
            content: Bytes::new(),
        }];
        assert!(matches!(check(r), Err(Error::Path { .. })));
        let mut r = req("print(1)");
        r.input_files = vec![
            cairn_proto::FileContent {
                path: "a".into(),
                content: Bytes::new(),
            },
            cairn_proto::FileContent {
                path: "a/b".into(),
                content: Bytes::new(),
            },
        ];
        assert!(check(r).is_err());
        let mut r = req("print(1)");
        r.limits = Some(cairn_proto::Limits {
            max_input_files: 1,
            ..Default::default()
        });
        r.input_files = vec![
            cairn_proto::FileContent {
                path: "a".into(),
                content: Bytes::new(),
            },
            cairn_proto::FileContent {
                path: "b".into(),
                content: Bytes::new(),
            },
        ];
        assert!(matches!(check(r), Err(Error::ResourceExhausted { .. })));
    }

    #[test]
    fn network_needs_the_runner_to_allow_it() {
        let mut r = req("print(1)");
        r.network = true;
        let e = check(r.clone()).unwrap_err();
        assert!(matches!(e, Error::NetworkNotAllowed), "{e}");
        assert!(e.to_string().contains("network_allowed"), "{e}");
        let open = Config {
            network_allowed: true,
            ..Config::default()
        };
        assert!(Job::from_request(r, &open).unwrap().network);
    }

    #[test]
    fn images_come_from_the_allow_list() {
        let r = req("print(1)");
        assert_eq!(check(r.clone()).unwrap().image, "cairn-sandbox:latest");
        let mut named = r.clone();
        named.image = "cairn-toolchain:latest".into();
        assert_eq!(check(named).unwrap().image, "cairn-toolchain:latest");
        let mut other = r.clone();
        other.image = "debian:bookworm".into();
        let e = check(other.clone()).unwrap_err();
        assert!(matches!(e, Error::ImageNotAllowed { .. }), "{e}");
        assert!(e.to_string().contains("allowed_images"), "{e}");
        // The runner's own image is always allowed, listed or not.
        let config = Config {
            image: "debian:bookworm".into(),
            allowed_images: vec![],
            ..Config::default()
        };
        assert_eq!(
            Job::from_request(other, &config).unwrap().image,
            "debian:bookworm"
        );
        let mut listed_before = r;
        listed_before.image = "cairn-toolchain:latest".into();
        assert!(Job::from_request(listed_before, &config).is_err());
    }

    #[test]
    fn env_names_are_checked() {
        let mut r = req("print(1)");
        r.env.insert("lower".into(), "x".into());
        assert!(check(r).is_err());
        let mut r = req("print(1)");
        r.env.insert("GOOD_1".into(), "x".into());
        assert!(check(r).is_ok());
    }

    #[test]
    fn the_step_key_reaches_the_program_and_cannot_be_forged_through_env() {
        let mut r = req("print(1)");
        r.step_key = "run1/build/2".into();
        r.redelivery = 1;
        let job = Job::from_request(r, &Config::default()).unwrap();
        let env = job.environment();
        let get = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get("CAIRN_STEP_KEY"), Some("run1/build/2"));
        assert_eq!(get("CAIRN_STEP_REDELIVERY"), Some("1"));
        // No key, no variables.
        let job = Job::from_request(req("print(1)"), &Config::default()).unwrap();
        assert!(!job
            .environment()
            .iter()
            .any(|(k, _)| k.starts_with("CAIRN_STEP_")));
        // A request may not set them itself.
        let mut r = req("print(1)");
        r.env.insert("CAIRN_STEP_KEY".into(), "forged".into());
        let e = check(r).unwrap_err().to_string();
        assert!(
            e.contains("CAIRN_STEP_KEY") && e.contains("step_key"),
            "{e}"
        );
        for bad in ["has space", "new\nline", &"k".repeat(257)] {
            let mut r = req("print(1)");
            r.step_key = bad.into();
            assert!(check(r).is_err(), "{bad:?}");
        }
    }
}
