//! `cairn sandbox run`: run code in the sandbox-runner with inputs from the
//! project store, write its outputs to `docs/artifacts/<run_id>/` and the run record to
//! `.cairn/runs/<run_id>/sandbox/result.json`, all through the artifact-store.

use std::process::ExitCode;

use anyhow::Context;
use cairn_proto::v1::{
    EventInput, FileContent, GetRequest, Level, Limits, PutHeader, RunRequest, RunResult,
};
use serde_json::json;

use cairn_graph::under_prefix;
use cairn_orchestrator::nodes::sandbox_run::check_output_prefix;

use crate::cli::{Global, SandboxCommand, SandboxRunArgs};
use crate::embedded::{Needs, Services};
use crate::failure::{exit, Failure};
use crate::{output, transfer};

pub async fn run(global: &Global, cmd: SandboxCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SandboxCommand::Run(args) => {
            // Where the outputs may land is settled before anything runs or is recorded.
            let target = OutputTarget::check(&args)?;
            let services = Services::open(
                global,
                Needs {
                    sandbox: true,
                    ..Needs::default()
                },
            )
            .await?;
            let result = sandbox_run(global, &services, args, target).await;
            services.close().await?;
            result
        }
        SandboxCommand::Session(cmd) => super::sandbox_session::run(global, cmd).await,
    }
}

/// The run id, and where its outputs land (checked against the allowed prefixes).
struct OutputTarget {
    run_id: String,
    prefix: String,
}

impl OutputTarget {
    /// The graph nodes' rule (the output prefix lies under an allowed prefix), and two of
    /// this command's own: nothing under .cairn/ (run records, written by cairn only), and no
    /// other run's docs/artifacts/ directory.
    fn check(args: &SandboxRunArgs) -> anyhow::Result<OutputTarget> {
        let run_id = args
            .run
            .clone()
            .unwrap_or_else(|| format!("sandbox-{}", uuid::Uuid::now_v7()));
        let own = format!("docs/artifacts/{run_id}");
        let prefix = args
            .output_prefix
            .clone()
            .unwrap_or_else(|| own.clone())
            .trim_end_matches('/')
            .to_owned();
        let allowed = if args.allowed_prefixes.is_empty() {
            vec![format!("{own}/")]
        } else {
            args.allowed_prefixes.clone()
        };
        for (what, p) in std::iter::once(("--output-prefix", &prefix))
            .chain(allowed.iter().map(|p| ("--allowed-prefix", p)))
        {
            if under_prefix(p, ".cairn") {
                return Err(Failure::usage(
                    "output_prefix",
                    format!("{what} {p:?} is refused: .cairn/ holds the run records, which only cairn writes"),
                    format!("choose a prefix such as {own}/"),
                )
                .into());
            }
        }
        if under_prefix(&prefix, "docs/artifacts") && !under_prefix(&prefix, &own) {
            return Err(Failure::usage(
                "output_prefix",
                format!("--output-prefix {prefix:?} is refused: it lies in another run's directory under docs/artifacts/"),
                format!("this run's is {own}/: leave --output-prefix out, or pass --run with that run's id"),
            )
            .into());
        }
        check_output_prefix(&prefix, &allowed).map_err(|reason| {
            // A prefix that is not a clean project path cannot be allowed by any prefix.
            let hint = if pathguard_clean(&prefix) {
                format!("give --allowed-prefix {prefix}/ too, or an --output-prefix under {}", allowed.join(", "))
            } else {
                format!("give a project path without `..`, `.` or a leading `/`, e.g. --output-prefix {own}")
            };
            Failure::usage("output_prefix", format!("--output-prefix refused: {reason}"), hint)
        })?;
        Ok(OutputTarget { run_id, prefix })
    }
}

/// A relative project path without `.` or `..` parts.
fn pathguard_clean(p: &str) -> bool {
    !p.starts_with('/') && !p.split('/').any(|c| c == ".." || c == "." || c.is_empty())
}

async fn sandbox_run(
    global: &Global,
    services: &Services,
    args: SandboxRunArgs,
    target: OutputTarget,
) -> anyhow::Result<ExitCode> {
    let project = global.project.clone();
    let OutputTarget {
        run_id,
        prefix: output_prefix,
    } = target;
    let mut store = services.store()?;
    // A command that writes creates its project (an existing one is left as it is).
    store
        .create_project(cairn_proto::v1::CreateProjectRequest {
            project_id: project.clone(),
        })
        .await?;

    // Inputs and the code file come from the canonical store.
    let mut input_files = Vec::new();
    for path in &args.inputs {
        input_files.push(read_project_file(&mut store, &project, path).await?);
    }
    let (code, code_file) = match (&args.code, &args.code_file) {
        (Some(code), None) => (code.clone(), String::new()),
        (None, Some(file)) => {
            if !args.inputs.iter().any(|p| p == file) {
                input_files.push(read_project_file(&mut store, &project, file).await?);
            }
            (String::new(), file.clone())
        }
        _ => {
            return Err(Failure::usage(
                "usage",
                "no program to run",
                "give exactly one of --code TEXT or --code-file PROJECT_PATH",
            )
            .into())
        }
    };

    append(&mut store, &project, &run_id, "sandbox_start", Level::Info, json!({
        "language": args.language, "inputs": args.inputs, "code_file": code_file, "output_prefix": output_prefix,
    }))
    .await?;
    let request = RunRequest {
        run_id: run_id.clone(),
        node_id: "cli".into(),
        language: args.language.clone(),
        code,
        code_file,
        input_files,
        limits: Some(Limits {
            timeout_ms: args.timeout.map(|s| (s * 1000.0) as u64).unwrap_or(0),
            ..Default::default()
        }),
        network: args.network,
        image: args.image.clone().unwrap_or_default(),
        ..Default::default()
    };
    let result = match services.sandbox()?.run(request).await {
        Ok(r) => r.into_inner(),
        Err(status) => {
            append(
                &mut store,
                &project,
                &run_id,
                "sandbox_failed",
                Level::Error,
                json!({"error": status.message()}),
            )
            .await?;
            return Err(status.into());
        }
    };

    // Outputs land beneath output_prefix only; each refusal is reported.
    let mut written = Vec::new();
    let mut refused = Vec::new();
    for file in &result.output_files {
        let header = PutHeader {
            project_id: project.clone(),
            path: format!("{output_prefix}/{}", file.path),
            overwrite: args.overwrite,
            expected_sha256: file.sha256.clone(),
            allowed_prefixes: vec![output_prefix.clone()],
            run_id: run_id.clone(),
            create_project: true,
            ..Default::default()
        };
        let body = std::io::Cursor::new(file.content.to_vec());
        match transfer::put(&mut store, header, body).await {
            Ok(r) => written.push(
                json!({"path": r.path, "size_bytes": file.size_bytes, "sha256": file.sha256}),
            ),
            Err(e) => refused.push(json!({"path": file.path, "error": refusal(&e)})),
        }
    }
    for r in &result.rejected_outputs {
        refused.push(json!({"path": r.path, "error": r.reason}));
    }
    let result_path = format!(".cairn/runs/{run_id}/sandbox/result.json");
    let header = PutHeader {
        project_id: project.clone(),
        path: result_path.clone(),
        overwrite: true,
        run_id: run_id.clone(),
        create_project: true,
        ..Default::default()
    };
    transfer::put(
        &mut store,
        header,
        std::io::Cursor::new(result.result_json.clone().into_bytes()),
    )
    .await
    .context("storing result.json")?;
    let ok = result.exit_code == 0 && !result.timed_out && !result.oom_killed;
    let summary = summary(&run_id, &result, &written, &refused, &result_path);
    append(
        &mut store,
        &project,
        &run_id,
        if ok { "sandbox_complete" } else { "sandbox_failed" },
        if ok { Level::Info } else { Level::Error },
        json!({"exit_code": result.exit_code, "timed_out": result.timed_out, "oom_killed": result.oom_killed,
               "duration_ms": result.duration_ms, "written_files": written.len(), "refused_files": refused.len()}),
    )
    .await?;
    if global.json {
        output::json(&summary)?;
    } else {
        print!("{}", serde_saphyr::to_string(&summary)?);
    }
    Ok(if !ok {
        ExitCode::from(exit::FAILED)
    } else if !refused.is_empty() {
        // The code ran, but not every output file landed (as a graph's sandbox node fails).
        eprintln!(
            "error: {} output file(s) were not written (see `refused` above)",
            refused.len()
        );
        eprintln!("hint: pass --overwrite to replace files that hold other bytes, or choose another --output-prefix");
        ExitCode::from(exit::PARTIAL)
    } else {
        ExitCode::SUCCESS
    })
}

/// Why an output file was not written, in the service's words up to its advice (the advice
/// is in the hint printed at the end).
fn refusal(e: &anyhow::Error) -> String {
    match e.downcast_ref::<tonic::Status>() {
        Some(s) => s
            .message()
            .split("; ")
            .next()
            .unwrap_or_default()
            .to_owned(),
        None => format!("{e:#}"),
    }
}

fn summary(
    run_id: &str,
    r: &RunResult,
    written: &[serde_json::Value],
    refused: &[serde_json::Value],
    result_path: &str,
) -> serde_json::Value {
    json!({
        "run_id": run_id,
        "backend": r.backend,
        "exit_code": r.exit_code,
        "timed_out": r.timed_out,
        "oom_killed": r.oom_killed,
        "limits_enforced": r.limits_enforced,
        "duration_ms": r.duration_ms,
        "stdout": String::from_utf8_lossy(&r.stdout),
        "stderr": String::from_utf8_lossy(&r.stderr),
        "stdout_truncated": r.stdout_truncated,
        "stderr_truncated": r.stderr_truncated,
        "written_files": written,
        "refused_files": refused,
        "result": result_path,
    })
}

async fn read_project_file(
    store: &mut cairn_proto::v1::artifact_store_client::ArtifactStoreClient<
        crate::embedded::Authed,
    >,
    project: &str,
    path: &str,
) -> anyhow::Result<FileContent> {
    let mut content = Vec::new();
    let request = GetRequest {
        project_id: project.to_owned(),
        path: path.to_owned(),
        offset: 0,
        length: 0,
    };
    if let Err(e) = transfer::get(store, request, &mut content).await {
        let missing = e
            .downcast_ref::<tonic::Status>()
            .is_some_and(|s| s.code() == tonic::Code::NotFound);
        if !missing {
            return Err(e.context(format!("reading input {path:?} of project {project:?}")));
        }
        let name = path.rsplit('/').next().unwrap_or(path);
        return Err(Failure::not_found(
            "no_input",
            format!("input {path:?} is not in project {project:?}"),
            format!("inputs are project files: upload it first with `cairn store put {name} {path}` (see what is there with `cairn store ls -r`)"),
        )
        .into());
    }
    Ok(FileContent {
        path: path.to_owned(),
        content: content.into(),
    })
}

async fn append(
    store: &mut cairn_proto::v1::artifact_store_client::ArtifactStoreClient<
        crate::embedded::Authed,
    >,
    project: &str,
    run_id: &str,
    kind: &str,
    level: Level,
    data: serde_json::Value,
) -> anyhow::Result<()> {
    store
        .append_events(cairn_proto::v1::AppendEventsRequest {
            project_id: project.to_owned(),
            run_id: run_id.to_owned(),
            epoch: 0,
            publication_tokens: Vec::new(),
            events: vec![EventInput {
                r#type: kind.to_owned(),
                node_id: "cli".into(),
                level: level as i32,
                data_json: data.to_string(),
            }],
            claim: String::new(),
        })
        .await
        .with_context(|| format!("appending {kind} to run {run_id}"))?;
    Ok(())
}
