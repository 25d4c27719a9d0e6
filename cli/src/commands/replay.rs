//! `cairn runs replay` and `cairn runs diff`: a replay of a recorded run answered from its
//! records (ReplayRun), followed to its end and judged against the recorded run (DiffRuns);
//! and the comparison of any two runs.

use std::process::ExitCode;

use cairn_proto::v1::{DiffRunsRequest, ReplayRunRequest};
use serde_json::Value;

use super::run::{follow, get, Client};
use crate::cli::Global;
use crate::output;
use cairn_proto::v1::TaskState;

/// Exit code of a replay that diverged from its recorded run.
pub const DIVERGED: u8 = 4;

/// How long a replay may wait at a gate for its recorded decision before the verdict.
const RECORDED_GATE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Starts the replay of `run`, follows it to its end and prints the verdict.
pub async fn replay(
    global: &Global,
    client: &mut Client,
    req: ReplayRunRequest,
) -> anyhow::Result<ExitCode> {
    let (project, run) = (req.project_id.clone(), req.run_id.clone());
    let live_gates = req.live_gates;
    let (project, run) = (project.as_str(), run.as_str());
    let info = client.replay_run(req).await?.into_inner();
    if !global.json {
        println!("replay {} of run {run}", info.run_id);
    }
    let replay_id = info.run_id.clone();
    let mut info = follow(global, client, project, &replay_id, false).await?;
    // A gate taking its recorded decision blocks the replay for a moment; a gate without
    // one blocks it for good (the verdict then says the replay waits).
    let mut blocked_since = None;
    loop {
        match info.state() {
            TaskState::Completed | TaskState::Failed | TaskState::Canceled => break,
            TaskState::InputRequired if live_gates => break,
            TaskState::InputRequired => {
                let since = *blocked_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > RECORDED_GATE_WAIT {
                    break;
                }
            }
            _ => blocked_since = None,
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        info = get(client, project, &replay_id).await?;
    }
    let d = client
        .diff_runs(DiffRunsRequest {
            project_id: project.to_owned(),
            run_a: run.to_owned(),
            run_b: info.run_id.clone(),
        })
        .await?
        .into_inner();
    let verdict: Value = serde_json::from_str(&d.verdict_json)?;
    if global.json {
        output::json(&verdict)?;
    } else {
        print_verdict(&verdict);
    }
    Ok(match d.verdict.as_str() {
        "identical" => ExitCode::SUCCESS,
        "diverged" => ExitCode::from(DIVERGED),
        _ => ExitCode::FAILURE,
    })
}

fn print_verdict(v: &Value) {
    let word = v["verdict"].as_str().unwrap_or_default();
    let d = &v["divergence"];
    match word {
        "identical" => println!("identical"),
        "running" => println!(
            "the replay {} has not ended (it waits for a human at a gate): cairn runs show {}",
            v["run_id"].as_str().unwrap_or_default(),
            v["run_id"].as_str().unwrap_or_default()
        ),
        _ => {
            println!(
                "{word} at node `{}` attempt {}: {}",
                d["node"].as_str().unwrap_or_default(),
                d["attempt"],
                d["what"].as_str().unwrap_or_default()
            );
            if let Some(diff) = d["diff"].as_str().filter(|t| !t.is_empty()) {
                print!("{diff}");
                if !diff.ends_with('\n') {
                    println!();
                }
            }
        }
    }
}

/// Compares two runs of the project.
pub async fn diff(
    global: &Global,
    client: &mut Client,
    project: &str,
    a: &str,
    b: &str,
) -> anyhow::Result<ExitCode> {
    let d = client
        .diff_runs(DiffRunsRequest {
            project_id: project.to_owned(),
            run_a: a.to_owned(),
            run_b: b.to_owned(),
        })
        .await?
        .into_inner();
    let report: Value = serde_json::from_str(&d.report_json)?;
    if global.json {
        output::json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let pair = |v: &Value| format!("{} | {}", v["a"], v["b"]);
    println!("runs {a} (a) and {b} (b)");
    println!("  state: {}", pair(&report["state"]));
    if report["graph"]["same"] == true {
        println!("  graph: same");
    } else {
        println!("  graph: differs");
        print!("{}", report["graph"]["diff"].as_str().unwrap_or_default());
    }
    for v in report["vars"].as_array().into_iter().flatten() {
        println!(
            "  var {}: {} | {}",
            v["name"].as_str().unwrap_or_default(),
            v["a"],
            v["b"]
        );
    }
    for n in report["nodes"].as_array().into_iter().flatten() {
        println!(
            "  node {:<22} outputs {:<8} tokens {} | {}  ms {}",
            n["node"].as_str().unwrap_or_default(),
            if n["outputs_same"] == true {
                "same"
            } else {
                "differ"
            },
            tokens(&n["usage"]["a"]),
            tokens(&n["usage"]["b"]),
            pair(&n["duration_ms"]),
        );
        if let Some(diff) = n["outputs_diff"].as_str() {
            print!("{diff}");
        }
    }
    for f in report["files"].as_array().into_iter().flatten() {
        println!(
            "  file {} {}",
            f["path"].as_str().unwrap_or_default(),
            if f["same"] == true { "same" } else { "differs" }
        );
        if let Some(diff) = f["diff"].as_str() {
            print!("{diff}");
        }
    }
    println!(
        "  tokens: {} | {}   duration ms: {}",
        tokens(&report["usage"]["a"]),
        tokens(&report["usage"]["b"]),
        pair(&report["duration_ms"])
    );
    Ok(ExitCode::SUCCESS)
}

fn tokens(u: &Value) -> String {
    format!(
        "{}+{}",
        u["prompt_tokens"].as_u64().unwrap_or(0),
        u["completion_tokens"].as_u64().unwrap_or(0)
    )
}
