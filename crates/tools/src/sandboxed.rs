//! The sandbox tool backend (opt-in with `sandbox.runner.features.use_for_tools`):
//! the tool's program is one `Run` on a sandbox runner, its staged inputs under `/input`
//! (read-only), its outputs collected from `/output`, with the same caps as the legacy backend.
//! A failed call is the node's failure: there is no fallback to the legacy backend.

use cairn_proto::v1::{FileContent, Limits, RunRequest};
use tonic::Status;

use super::installed::{Caps, Invocation, Outcome, Refused};
use cairn_runner_client::Runners;

pub async fn run(
    runners: &Runners,
    inv: &Invocation,
    caps: &Caps,
    request_id: &str,
    run_id: &str,
    node_id: &str,
) -> Result<Outcome, Status> {
    let mut env: std::collections::HashMap<String, String> = inv.env.iter().cloned().collect();
    env.insert("CAIRN_INPUT_DIR".into(), "/input".into());
    env.insert("CAIRN_OUTPUT_DIR".into(), "/output".into());
    let req = RunRequest {
        request_id: request_id.to_owned(),
        run_id: run_id.to_owned(),
        node_id: node_id.to_owned(),
        language: inv.language.clone(),
        code: inv.code.clone(),
        code_file: String::new(),
        input_files: inv
            .inputs
            .iter()
            .map(|(path, content)| FileContent {
                path: path.clone(),
                content: content.clone(),
            })
            .collect(),
        limits: Some(Limits {
            timeout_ms: u64::try_from(inv.timeout.as_millis()).unwrap_or(u64::MAX),
            max_input_files: caps.max_input_files,
            max_input_bytes: caps.max_input_bytes,
            max_output_files: caps.max_output_files,
            max_output_bytes: caps.max_output_bytes,
            max_stdout_bytes: caps.max_stdout_bytes,
            max_stderr_bytes: caps.max_stderr_bytes,
            ..Default::default()
        }),
        network: false,
        env,
        // Installed tools run in the runner's default image.
        image: String::new(),
        // One call among an agent turn's many: no step of its own.
        step_key: String::new(),
        redelivery: 0,
    };
    let (r, runner) = runners.run(req).await?;
    let record = serde_json::from_str(&r.result_json).ok();
    Ok(Outcome {
        backend: "sandbox",
        exit_code: r.exit_code,
        timed_out: r.timed_out,
        duration_ms: r.duration_ms,
        stdout: r.stdout,
        stderr: r.stderr,
        stdout_truncated: r.stdout_truncated,
        outputs: r
            .output_files
            .into_iter()
            .map(|f| (f.path, f.content))
            .collect(),
        refused: r
            .rejected_outputs
            .into_iter()
            .map(|x| Refused {
                path: x.path,
                reason: x.reason,
            })
            .collect(),
        outputs_truncated: r.outputs_truncated,
        runner,
        record,
    })
}
