//! `cairn runs replay` and `cairn runs diff`: a replay of a recorded run answered from its
//! records (ReplayRun), followed to its end and judged against the recorded run (DiffRuns),
//! optionally against a changed graph or going on live after a divergence; a batch of
//! replays selected by a filter, with a report; and the comparison of any two runs.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use cairn_proto::v1::{DiffRunsRequest, ListRunsRequest, PageRequest, ReplayRunRequest};
use serde_json::{json, Value};

use super::run::{follow, get, graph_files, is_url, parse_vars, time_arg, who, Client};
use crate::cli::{Global, ReplayArgs, Replayed};
use crate::embedded::{Needs, Services};
use crate::failure::Failure;
use crate::output;
use cairn_proto::v1::TaskState;

/// Exit code of a replay that diverged from its recorded run.
pub const DIVERGED: u8 = 4;

/// How long a replay may wait at a gate for its recorded decision before the verdict.
const RECORDED_GATE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// `cairn runs replay`: one run, or (--select) every run a filter selects.
pub async fn command(global: &Global, args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let vars = parse_vars(&args.vars)?;
    let (graph_yaml, files) = match &args.graph {
        Some(path) => {
            let text = tokio::fs::read_to_string(path)
                .await
                .with_context(|| format!("cannot read graph {}", path.display()))?;
            let dir = std::path::absolute(path)?
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default();
            let files = graph_files(&text, &vars, &dir).await?;
            (text, files)
        }
        None => (String::new(), Vec::new()),
    };
    let select = args.select.as_deref().map(Select::parse).transpose()?;
    // Embedded, a URL given to --llm becomes a provider of this process, as for `cairn run`.
    let mut llm = args.llm.clone().unwrap_or_default();
    let mut llm_url = None;
    if global.addr.is_none() && is_url(&llm) {
        llm_url = Some(std::mem::replace(
            &mut llm,
            format!("provider:{}", crate::embedded::EMBEDDED_LLM_PROVIDER),
        ));
    }
    let services = Services::open(
        global,
        Needs {
            llm_url,
            ..super::run::needs()
        },
    )
    .await?;
    let mut client = services.orchestrator()?;
    let live = |p| p == Replayed::Live;
    let template = ReplayRunRequest {
        project_id: global.project.clone(),
        run_id: String::new(),
        vars,
        by: who(),
        replay_run_id: String::new(),
        live_sandbox: live(args.sandbox),
        live_gates: live(args.gates),
        graph_yaml,
        files,
        live_after: args.live_after,
        llm,
    };
    let result = match (args.run, select) {
        (Some(run), _) => {
            replay(
                global,
                &mut client,
                ReplayRunRequest {
                    run_id: run,
                    ..template
                },
            )
            .await
        }
        (None, Some(select)) => batch(global, &mut client, template, &select, &args.report).await,
        (None, None) => Err(Failure::usage(
            "replay_run",
            "name the run to replay",
            "cairn runs replay RUN, or cairn runs replay --select 'graph=TITLE since=DATE'",
        )
        .into()),
    };
    services.close().await?;
    result
}

/// Starts the replay `req` describes, follows it to its end and prints the verdict.
pub async fn replay(
    global: &Global,
    client: &mut Client,
    req: ReplayRunRequest,
) -> anyhow::Result<ExitCode> {
    let verdict = replay_one(global, client, req, !global.json).await?;
    if global.json {
        output::json(&verdict)?;
    } else {
        print_verdict(&verdict);
    }
    Ok(exit_of(verdict["verdict"].as_str().unwrap_or_default()))
}

fn exit_of(verdict: &str) -> ExitCode {
    match verdict {
        "identical" => ExitCode::SUCCESS,
        "diverged" => ExitCode::from(DIVERGED),
        _ => ExitCode::FAILURE,
    }
}

/// Starts one replay, follows it to its end and returns its verdict (DiffRuns); `tell`
/// prints the replay's id when it starts.
async fn replay_one(
    global: &Global,
    client: &mut Client,
    req: ReplayRunRequest,
    tell: bool,
) -> anyhow::Result<Value> {
    let (project, run) = (req.project_id.clone(), req.run_id.clone());
    let live_gates = req.live_gates;
    let (project, run) = (project.as_str(), run.as_str());
    let info = client.replay_run(req).await?.into_inner();
    if tell {
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
    Ok(serde_json::from_str(&d.verdict_json)?)
}

/// Which runs `--select` replays.
#[derive(Debug, Default, PartialEq)]
struct Select {
    graph: Option<String>,
    since: Option<String>,
    until: Option<String>,
    state: Option<String>,
    limit: usize,
}

/// Most runs one `--select` replays unless `limit=` says otherwise.
const SELECT_LIMIT: usize = 100;

impl Select {
    fn parse(text: &str) -> anyhow::Result<Select> {
        let bad = |m: String| -> Failure {
            Failure::usage(
                "select",
                m,
                "write --select as space-separated KEY=VALUE pairs: graph=TITLE since=DATE until=DATE state=STATE limit=N",
            )
        };
        let mut s = Select {
            limit: SELECT_LIMIT,
            ..Select::default()
        };
        for pair in words(text).map_err(|m| bad(m.into()))? {
            let pair = pair.as_str();
            let Some((k, v)) = pair.split_once('=') else {
                return Err(bad(format!("`{pair}` is not KEY=VALUE")).into());
            };
            let v = v.to_owned();
            match k {
                "graph" => s.graph = Some(v),
                "since" => s.since = Some(v),
                "until" => s.until = Some(v),
                "state" => s.state = Some(v),
                "limit" => {
                    s.limit = v
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad(format!("limit `{v}` is not a positive number")))?;
                }
                other => {
                    return Err(bad(format!(
                        "unknown key `{other}` (known: graph, since, until, state, limit)"
                    ))
                    .into())
                }
            }
        }
        Ok(s)
    }
}

/// `text` split at spaces outside single or double quotes, the quotes removed
/// (`graph='two agents' limit=5`).
fn words(text: &str) -> Result<Vec<String>, &'static str> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut quote = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => out.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    if quote.is_some() {
        return Err("a quote is not closed");
    }
    out.extend(word);
    Ok(out)
}

/// Replays every run `select` names, one after another, and writes REPORT.json and
/// REPORT.md. Exit 0 when every replay is identical, 4 when one diverged, 1 when one failed.
async fn batch(
    global: &Global,
    client: &mut Client,
    template: ReplayRunRequest,
    select: &Select,
    report: &Path,
) -> anyhow::Result<ExitCode> {
    let state = super::run::parse_state(select.state.as_deref().unwrap_or("completed"))?;
    let listed = client
        .list_runs(ListRunsRequest {
            project_id: template.project_id.clone(),
            states: vec![state as i32],
            page: Some(PageRequest {
                page_size: 1000,
                page_token: String::new(),
            }),
            text: select.graph.clone().unwrap_or_default(),
            created_after: time_arg("since", select.since.clone(), false)?,
            created_before: time_arg("until", select.until.clone(), true)?,
            stalled: false,
        })
        .await?
        .into_inner();
    let runs: Vec<_> = listed
        .runs
        .into_iter()
        .filter(|r| r.replay_of.is_empty())
        .filter(|r| select.graph.as_ref().is_none_or(|g| &r.title == g))
        .take(select.limit)
        .collect();
    let mut rows = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        if !global.json {
            eprintln!("[{}/{}] replaying {}", i + 1, runs.len(), r.run_id);
        }
        let req = ReplayRunRequest {
            run_id: r.run_id.clone(),
            ..template.clone()
        };
        let row = match replay_one(global, client, req, false).await {
            Ok(v) => json!({
                "run_id": r.run_id,
                "title": r.title,
                "replay_run_id": v["run_id"],
                "verdict": v["verdict"],
                "divergence": v["divergence"],
            }),
            Err(e) => json!({
                "run_id": r.run_id,
                "title": r.title,
                "replay_run_id": null,
                "verdict": "failed",
                "divergence": {"what": "the replay did not start or could not be followed", "diff": format!("{e:#}")},
            }),
        };
        if !global.json {
            eprintln!("    {}", one_line(&row));
        }
        rows.push(row);
    }
    let count = |v: &str| rows.iter().filter(|r| r["verdict"] == v).count();
    let (identical, diverged) = (count("identical"), count("diverged"));
    let failed = rows.len() - identical - diverged;
    let doc = json!({
        "select": select_text(select),
        "graph": !template.graph_yaml.is_empty(),
        "live_after": template.live_after,
        "runs": rows,
        "totals": {"runs": rows.len(), "identical": identical, "diverged": diverged, "failed": failed},
    });
    let json_path = report.with_extension("json");
    let md_path = report.with_extension("md");
    std::fs::write(&json_path, format!("{doc:#}\n"))
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    std::fs::write(&md_path, markdown(&doc))
        .with_context(|| format!("cannot write {}", md_path.display()))?;
    if global.json {
        output::json(&doc)?;
    } else {
        println!(
            "{} runs replayed: {identical} identical, {diverged} diverged, {failed} failed; report: {} and {}",
            rows.len(),
            json_path.display(),
            md_path.display()
        );
    }
    Ok(if failed > 0 {
        ExitCode::FAILURE
    } else if diverged > 0 {
        ExitCode::from(DIVERGED)
    } else {
        ExitCode::SUCCESS
    })
}

fn select_text(s: &Select) -> String {
    let mut parts = Vec::new();
    for (k, v) in [
        ("graph", &s.graph),
        ("since", &s.since),
        ("until", &s.until),
        ("state", &s.state),
    ] {
        if let Some(v) = v {
            parts.push(format!("{k}={v}"));
        }
    }
    parts.push(format!("limit={}", s.limit));
    parts.join(" ")
}

/// A report row in words: `identical`, `diverged at node N (what)`, `failed: ...`.
fn one_line(row: &Value) -> String {
    let d = &row["divergence"];
    let what = d["what"].as_str().unwrap_or_default();
    match row["verdict"].as_str().unwrap_or_default() {
        "identical" => "identical".into(),
        "diverged" => format!(
            "diverged at node `{}` attempt {} ({what})",
            d["node"].as_str().unwrap_or_default(),
            d["attempt"]
        ),
        "running" => "still waiting at a gate".into(),
        other => format!(
            "{other}: {what}{}",
            d["node"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map(|n| format!(" at node `{n}`"))
                .unwrap_or_default()
        ),
    }
}

/// The report as Markdown: the selection, the totals and one table row per run.
fn markdown(doc: &Value) -> String {
    let t = &doc["totals"];
    let mut md = format!(
        "# Replay report\n\nSelection: `{}`{}{}\n\n{} runs: {} identical, {} diverged, {} failed.\n\n| run | title | replay | verdict |\n|---|---|---|---|\n",
        doc["select"].as_str().unwrap_or_default(),
        if doc["graph"] == true { "; against a changed graph" } else { "" },
        if doc["live_after"] == true { "; live after a divergence" } else { "" },
        t["runs"], t["identical"], t["diverged"], t["failed"],
    );
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    for r in doc["runs"].as_array().into_iter().flatten() {
        md.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            cell(r["run_id"].as_str().unwrap_or_default()),
            cell(r["title"].as_str().unwrap_or_default()),
            cell(r["replay_run_id"].as_str().unwrap_or("-")),
            cell(&one_line(r)),
        ));
    }
    md
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

/// `cairn runs diff A B`.
pub async fn diff(global: &Global, a: &str, b: &str) -> anyhow::Result<ExitCode> {
    let services = Services::open(global, super::run::needs()).await?;
    let mut client = services.orchestrator()?;
    let result = diff_runs(global, &mut client, &global.project, a, b).await;
    services.close().await?;
    result
}

/// Compares two runs of the project.
async fn diff_runs(
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
