//! `cairn run`, `cairn runs ...`, `cairn gate ...`, `cairn notes add`: graph runs through the
//! orchestrator, with live progress from WatchRun.

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{
    AddNoteRequest, EditContextRequest, EditTaskRequest, GateDecisionRequest, GateState,
    GetRequest, GetRunRequest, InputFile, ListRunsRequest, LogStream, NodeState, PageRequest,
    ReworkRequest, RunActionRequest, RunInfo, SubmitRunRequest, TaskState, WatchLogsRequest,
    WatchRunRequest,
};
use serde_json::json;
use tokio_stream::StreamExt;

use crate::cli::{GateCommand, Global, NotesCommand, RunArgs, RunsCommand};
use crate::embedded::{Needs, Services};
use crate::failure::Failure;
use crate::output;

pub(super) type Client = OrchestratorClient<crate::embedded::Authed>;

pub(super) fn needs() -> Needs {
    Needs {
        sandbox: true,
        orchestrator: true,
        ..Default::default()
    }
}

pub(super) fn who() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "cli".into())
}

/// The `llm` setting to send. The orchestrator never reads the files of its host, so a
/// `replay:<path>` cassette that exists here (`--llm`'s relative to the working directory,
/// the graph's `llm:` relative to the graph file) is sent inline; `--llm`'s other settings
/// (a provider name, a cassette path in the project, a URL) and the graph's URL go as they
/// are; otherwise "" (the graph's own setting, or the orchestrator's default, applies).
async fn local_cassette(
    flag: Option<&str>,
    graph_yaml: &str,
    graph_dir: Option<&Path>,
) -> anyhow::Result<String> {
    let (spec, dir) = match flag {
        Some(spec) => (spec.to_owned(), None),
        None => {
            let graph_llm = serde_saphyr::from_str::<serde_json::Value>(graph_yaml)
                .ok()
                .and_then(|g| g.get("llm").and_then(|v| v.as_str()).map(str::to_owned));
            match graph_llm {
                Some(spec) => (spec, graph_dir),
                // The graph names none: the orchestrator's default applies.
                None => return Ok(String::new()),
            }
        }
    };
    let Some(path) = spec.trim().strip_prefix("replay:") else {
        // The graph's URL is sent as the run's (the same setting) so that an embedded
        // orchestrator can take it as the user's provider.
        return Ok(match flag {
            Some(spec) => spec.to_owned(),
            None if is_url(&spec) => spec,
            None => String::new(),
        });
    };
    let path = match dir {
        Some(dir) if Path::new(path).is_relative() => dir.join(path),
        _ => Path::new(path).to_path_buf(),
    };
    if !tokio::fs::try_exists(&path).await.unwrap_or(false) {
        // Not a local file: a cassette path in the project, read by the orchestrator.
        return Ok(flag.map(str::to_owned).unwrap_or_default());
    }
    let text = tokio::fs::read(&path)
        .await
        .with_context(|| format!("cannot read the replay cassette {}", path.display()))?;
    use base64::Engine as _;
    Ok(format!(
        "replay-inline:{}",
        base64::engine::general_purpose::STANDARD.encode(text)
    ))
}

/// The files the graph names (schemas, limits and prompt files), read here from the graph
/// file's directory to send with it: the orchestrator never reads its own host's files. A
/// graph that does not parse sends none (the orchestrator says what is wrong with it).
pub(super) async fn graph_files(
    graph_yaml: &str,
    vars: &HashMap<String, String>,
    dir: &Path,
) -> anyhow::Result<Vec<InputFile>> {
    let vars = vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let Ok(graph) = cairn_graph::Graph::from_yaml(graph_yaml, "run", &vars) else {
        return Ok(Vec::new());
    };
    cairn_phases::inputs::collect(dir, &graph)
        .await
        .map_err(|m| anyhow::anyhow!("a file the graph names is not sent: {m}"))
}

/// An `openai:` or bare `http(s)://` setting.
pub(super) fn is_url(llm: &str) -> bool {
    let llm = llm.trim();
    ["openai:", "http://", "https://"]
        .iter()
        .any(|p| llm.starts_with(p))
}

/// `cairn run GRAPH.yaml` / `cairn run --mode M --prompt P`.
pub async fn run(global: &Global, args: RunArgs) -> anyhow::Result<ExitCode> {
    let (graph_yaml, graph_dir) = match &args.graph {
        Some(path) => {
            let text = tokio::fs::read_to_string(path)
                .await
                .with_context(|| format!("cannot read graph {}", path.display()))?;
            let dir = std::path::absolute(path)?.parent().map(Path::to_path_buf);
            (text, dir)
        }
        None => (String::new(), Some(std::env::current_dir()?)),
    };
    if graph_yaml.is_empty() && args.mode.is_none() {
        anyhow::bail!("give a graph file (cairn run GRAPH.yaml) or a built-in mode (--mode single|self_critique|team --prompt ...)");
    }
    if args.graph.is_some() && args.mode.is_some() {
        anyhow::bail!("give a graph file or --mode, not both (a mode is a built-in graph)");
    }
    let vars = parse_vars(&args.vars)?;
    let mut llm = local_cassette(args.llm.as_deref(), &graph_yaml, graph_dir.as_deref()).await?;
    let files = match (&args.graph, &graph_dir) {
        (Some(_), Some(dir)) => graph_files(&graph_yaml, &vars, dir).await?,
        _ => Vec::new(),
    };
    // Embedded, the user is the operator: a URL they give becomes a provider of this process
    // (with the key of llm.api_key_env). A remote orchestrator decides on URLs itself.
    let mut llm_url = None;
    if global.addr.is_none() && is_url(&llm) {
        llm_url = Some(std::mem::replace(
            &mut llm,
            format!("provider:{}", crate::embedded::EMBEDDED_LLM_PROVIDER),
        ));
    }
    // Built-in modes run no sandbox nodes: they work where neither Docker nor bubblewrap is.
    let needs = Needs {
        sandbox_optional: args.mode.is_some(),
        llm_url,
        ..needs()
    };
    let services = Services::open(global, needs).await?;
    let mut client = services.orchestrator()?;
    let result = async {
        let info = client
            .submit_run(SubmitRunRequest {
                project_id: global.project.clone(),
                graph_yaml,
                vars,
                run_id: args.run_id.clone().unwrap_or_default(),
                title: args.title.clone().unwrap_or_default(),
                mode: args.mode.clone().unwrap_or_default(),
                prompt: args.prompt.clone().unwrap_or_default(),
                by: who(),
                llm,
                files,
                // The files come with the graph, not from the project.
                graph_dir: String::new(),
                // One submit per command: nothing to deduplicate.
                request_id: String::new(),
                rerun_of: String::new(),
            })
            .await?
            .into_inner();
        if !global.json {
            eprintln!(
                "run {} submitted (project {})",
                info.run_id, info.project_id
            );
        }
        if args.detach && global.addr.is_some() {
            return finish(global, &info);
        }
        let info = follow(
            global,
            &mut client,
            &info.project_id,
            &info.run_id,
            args.approve_gates,
        )
        .await?;
        finish(global, &info)
    }
    .await;
    services.close().await?;
    result
}

/// Streams the run's events until it ends or waits for a human; approves gates when asked.
pub(super) async fn follow(
    global: &Global,
    client: &mut Client,
    project: &str,
    run_id: &str,
    approve_gates: bool,
) -> anyhow::Result<RunInfo> {
    let mut from_seq = 1;
    loop {
        let mut stream = client
            .watch_run(WatchRunRequest {
                project_id: project.to_owned(),
                run_id: run_id.to_owned(),
                from_seq,
                follow_after_end: false,
            })
            .await?
            .into_inner();
        let mut approved_any = false;
        while let Some(event) = stream.next().await {
            let event = event?;
            from_seq = event.seq + 1;
            if !global.json {
                print_event(&event);
            }
            let kind = event.r#type.as_str();
            if kind == "gate.blocked" || kind.starts_with("task.") {
                let info = get(client, project, run_id).await?;
                match info.state() {
                    TaskState::Completed | TaskState::Failed | TaskState::Canceled => {
                        return Ok(info)
                    }
                    TaskState::InputRequired if approve_gates => {
                        for gate in info
                            .gates
                            .iter()
                            .filter(|g| g.state() == GateState::Blocked)
                        {
                            client
                                .approve_gate(GateDecisionRequest {
                                    project_id: project.to_owned(),
                                    run_id: run_id.to_owned(),
                                    gate_id: gate.id.clone(),
                                    by: who(),
                                    note: "approved non-interactively (cairn run --approve-gates)"
                                        .into(),
                                })
                                .await?;
                            approved_any = true;
                        }
                    }
                    TaskState::InputRequired => return Ok(info),
                    _ => {}
                }
            }
        }
        // The stream ended (run final) or we approved and keep watching.
        let info = get(client, project, run_id).await?;
        if !approved_any
            && matches!(
                info.state(),
                TaskState::Completed
                    | TaskState::Failed
                    | TaskState::Canceled
                    | TaskState::InputRequired
            )
        {
            return Ok(info);
        }
    }
}

/// Prints every event of the run as it comes, past its end (WatchRun in follow mode), until
/// the server ends the stream or the user stops the command.
async fn watch_on(
    global: &Global,
    client: &mut Client,
    project: &str,
    run_id: &str,
    from_seq: u64,
) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut stream = client
        .watch_run(WatchRunRequest {
            project_id: project.to_owned(),
            run_id: run_id.to_owned(),
            from_seq,
            follow_after_end: true,
        })
        .await?
        .into_inner();
    let mut out = std::io::stdout();
    while let Some(event) = stream.next().await {
        let e = event?;
        if global.json {
            let data: serde_json::Value =
                serde_json::from_str(&e.data_json).unwrap_or(serde_json::Value::Null);
            let line = json!({"seq": e.seq, "ts": e.ts, "type": e.r#type, "node_id": e.node_id, "data": data});
            writeln!(out, "{line}")?;
        } else {
            writeln!(out, "{}", event_line(&e))?;
        }
        // Each event is seen as it happens, also through a pipe.
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the run's node output (WatchLogs), following it with `follow` until the run ends.
async fn logs(
    global: &Global,
    client: &mut Client,
    project: &str,
    run_id: &str,
    node: Option<String>,
    follow: bool,
) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut stream = client
        .watch_logs(WatchLogsRequest {
            project_id: project.to_owned(),
            run_id: run_id.to_owned(),
            node_id: node.unwrap_or_default(),
            follow,
            after_attempt: 0,
            after_seq: 0,
        })
        .await?
        .into_inner();
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let mut current: Option<(String, u32)> = None;
    while let Some(chunk) = stream.next().await {
        let c = chunk?;
        if global.json {
            let line = json!({
                "node_id": c.node_id, "attempt": c.attempt, "seq": c.seq,
                "stream": match c.stream() {
                    LogStream::Stdout => "stdout",
                    LogStream::Stderr => "stderr",
                    LogStream::Step => "step",
                    LogStream::Unspecified => "",
                },
                "text": String::from_utf8_lossy(&c.data),
                "dropped_bytes": c.dropped_bytes, "end": c.end,
                "outcome": c.outcome, "error": c.error,
            });
            writeln!(out, "{line}")?;
            out.flush()?;
            continue;
        }
        let at = (c.node_id.clone(), c.attempt);
        if current.as_ref() != Some(&at) {
            writeln!(out, "==> node {} attempt {} <==", c.node_id, c.attempt)?;
            current = Some(at);
        }
        if c.dropped_bytes > 0 {
            writeln!(out, "[{} bytes of earlier output dropped]", c.dropped_bytes)?;
        }
        match c.stream() {
            LogStream::Stderr => {
                out.flush()?;
                err.write_all(&c.data)?;
                err.flush()?;
            }
            _ => out.write_all(&c.data)?,
        }
        if c.end {
            let why = if c.error.is_empty() {
                String::new()
            } else {
                format!(": {}", c.error)
            };
            writeln!(out, "[attempt {} ended: {}{why}]", c.attempt, c.outcome)?;
        }
        // Output is seen as it comes, also through a pipe.
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_event(e: &cairn_proto::v1::Event) {
    eprintln!("{}", event_line(e));
}

/// One event as a line: seq, type, node and the telling fields.
fn event_line(e: &cairn_proto::v1::Event) -> String {
    let data: serde_json::Value = serde_json::from_str(&e.data_json).unwrap_or_default();
    let detail = ["reason", "error", "path", "state", "note", "exit_code"]
        .iter()
        .filter_map(|k| {
            data.get(*k)
                .filter(|v| !v.is_null() && v.as_str() != Some(""))
                .map(|v| {
                    format!(
                        "{k}={}",
                        v.as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| v.to_string())
                    )
                })
        })
        .collect::<Vec<_>>()
        .join(" ");
    format!("  {:>4} {:<26} {:<18} {detail}", e.seq, e.r#type, e.node_id)
}

/// A rejection that fails the run ends it once running attempts stop: wait a moment for that
/// end, so what is printed is the run after the decision (a rejection the graph continues
/// past leaves the run working, and that is printed after the wait).
async fn settled(
    client: &mut Client,
    project: &str,
    run_id: &str,
    mut info: RunInfo,
) -> anyhow::Result<RunInfo> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
    let is_final = |i: &RunInfo| {
        [TaskState::Completed, TaskState::Failed, TaskState::Canceled]
            .iter()
            .any(|s| *s as i32 == i.state)
    };
    while !is_final(&info)
        && info.state != TaskState::Working as i32
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        info = get(client, project, run_id).await?;
    }
    Ok(info)
}

pub(super) async fn get(
    client: &mut Client,
    project: &str,
    run_id: &str,
) -> anyhow::Result<RunInfo> {
    Ok(client
        .get_run(GetRunRequest {
            project_id: project.to_owned(),
            run_id: run_id.to_owned(),
        })
        .await?
        .into_inner())
}

fn state_word(s: TaskState) -> &'static str {
    match s {
        TaskState::Created => "created",
        TaskState::Working => "working",
        TaskState::InputRequired => "input-required",
        TaskState::Completed => "completed",
        TaskState::Failed => "failed",
        TaskState::Canceled => "canceled",
        TaskState::Unspecified => "unknown",
    }
}

fn node_word(s: NodeState) -> &'static str {
    match s {
        NodeState::Pending => "pending",
        NodeState::Running => "running",
        NodeState::Succeeded => "succeeded",
        NodeState::Failed => "failed",
        NodeState::Skipped => "skipped",
        NodeState::Canceled => "canceled",
        NodeState::Blocked => "blocked",
        NodeState::Unspecified => "unknown",
    }
}

fn gate_word(s: GateState) -> &'static str {
    match s {
        GateState::Open => "open",
        GateState::Blocked => "blocked",
        GateState::Approved => "approved",
        GateState::Rejected => "rejected",
        GateState::Canceled => "canceled",
        GateState::Unspecified => "unknown",
    }
}

fn run_json(r: &RunInfo) -> serde_json::Value {
    json!({
        "run_id": r.run_id,
        "project_id": r.project_id,
        "title": r.title,
        "goal": r.goal,
        "rerun_of": r.rerun_of,
        "state": state_word(r.state()),
        "created_at": r.created_at,
        "updated_at": r.updated_at,
        "run_dir": r.run_dir,
        "error": r.error,
        "blocks_not_written": r.blocks_not_written,
        "stalled_since": r.stalled_since,
        "replica": r.replica,
        "nodes": r.nodes.iter().map(|n| json!({
            "id": n.id, "type": n.r#type, "state": node_word(n.state()), "attempts": n.attempts,
            "started_at": n.started_at, "finished_at": n.finished_at, "error": n.error,
            "outputs": serde_json::from_str::<serde_json::Value>(&n.outputs_json).unwrap_or_default(),
        })).collect::<Vec<_>>(),
        "gates": r.gates.iter().map(|g| json!({
            "id": g.id, "state": gate_word(g.state()), "reason": g.reason, "decided_by": g.decided_by,
            "note": g.note, "decided_at": g.decided_at,
        })).collect::<Vec<_>>(),
    })
}

fn print_run(r: &RunInfo) {
    println!("run {}  [{}]  {}", r.run_id, state_word(r.state()), r.title);
    if !r.rerun_of.is_empty() {
        println!("  re-run of {}", r.rerun_of);
    }
    if !r.stalled_since.is_empty() {
        println!(
            "  STALLED since {}: a running node has gone past its stall limit without any event",
            r.stalled_since
        );
    }
    println!(
        "  project {}  created {}  updated {}",
        r.project_id, r.created_at, r.updated_at
    );
    println!(
        "  run directory: {} (in project {})",
        r.run_dir, r.project_id
    );
    for n in &r.nodes {
        let err = if n.error.is_empty() {
            String::new()
        } else {
            format!("  error: {}", n.error)
        };
        println!(
            "  node {:<22} {:<12} {:<10}{err}",
            n.id,
            n.r#type,
            node_word(n.state())
        );
    }
    for g in &r.gates {
        println!(
            "  gate {:<22} {:<10} {}",
            g.id,
            gate_word(g.state()),
            g.reason
        );
    }
    if !r.error.is_empty() {
        println!("  error: {}", r.error);
    }
    if r.blocks_not_written > 0 {
        println!(
            "  warning: {} code block(s) were not written to the workspace (see each node's not_written output: cairn runs show {} --json)",
            r.blocks_not_written, r.run_id
        );
    }
}

fn finish(global: &Global, info: &RunInfo) -> anyhow::Result<ExitCode> {
    if global.json {
        output::json(&run_json(info))?;
    } else {
        print_run(info);
        if info.state() == TaskState::InputRequired {
            for g in info
                .gates
                .iter()
                .filter(|g| g.state() == GateState::Blocked)
            {
                println!(
                    "waiting for a human: cairn gate approve {} {} --note '...'   (or: cairn gate reject ...)",
                    info.run_id, g.id
                );
            }
        }
    }
    Ok(exit_code(info))
}

/// Exit code of a followed run: 1 failed or canceled, 4 completed with code blocks that ingest
/// did not write, else 0.
fn exit_code(info: &RunInfo) -> ExitCode {
    match info.state() {
        TaskState::Failed | TaskState::Canceled => ExitCode::FAILURE,
        TaskState::Completed if info.blocks_not_written > 0 => ExitCode::from(BLOCKS_NOT_WRITTEN),
        _ => ExitCode::SUCCESS,
    }
}

/// `cairn run`'s exit code for a completed run some of whose code blocks were not written.
pub const BLOCKS_NOT_WRITTEN: u8 = crate::failure::exit::PARTIAL;

/// `cairn runs list|show|watch|logs|cancel|resume|rework`.
pub async fn runs(global: &Global, cmd: RunsCommand) -> anyhow::Result<ExitCode> {
    let services = Services::open(global, needs()).await?;
    let mut client = services.orchestrator()?;
    let project = global.project.clone();
    let embedded = global.addr.is_none();
    let result = async {
        match cmd {
            RunsCommand::List {
                state,
                search,
                since,
                until,
                stalled,
            } => {
                let states = state
                    .iter()
                    .map(|s| parse_state(s))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let listed = client
                    .list_runs(ListRunsRequest {
                        project_id: project,
                        states: states.into_iter().map(|s| s as i32).collect(),
                        page: Some(PageRequest {
                            page_size: 1000,
                            page_token: String::new(),
                        }),
                        text: search.unwrap_or_default(),
                        created_after: time_arg("since", since, false)?,
                        created_before: time_arg("until", until, true)?,
                        stalled,
                    })
                    .await;
                // A project not made yet has no runs: on first use that is an empty list.
                let runs = match listed {
                    Ok(r) => r.into_inner().runs,
                    Err(s) if cairn_proto::reason::of(&s).as_deref() == Some("no_project") => {
                        Vec::new()
                    }
                    Err(s) => return Err(s.into()),
                };
                if global.json {
                    output::json(&runs.iter().map(run_json).collect::<Vec<_>>())?;
                } else {
                    for r in &runs {
                        let stalled = if r.stalled_since.is_empty() {
                            String::new()
                        } else {
                            format!("  [stalled since {}]", r.stalled_since)
                        };
                        println!(
                            "{:<40} {:<15} {}  {}{stalled}",
                            r.run_id,
                            state_word(r.state()),
                            r.created_at,
                            r.title
                        );
                    }
                }
                Ok(ExitCode::SUCCESS)
            }
            RunsCommand::Show { run } => finish(global, &get(&mut client, &project, &run).await?),
            RunsCommand::Edit {
                run,
                title,
                goal,
                notes,
            } => {
                if title.is_none() && goal.is_none() && notes.is_empty() {
                    return Err(Failure::usage(
                        "nothing_to_edit",
                        "nothing to change",
                        "give --title TEXT, --goal TEXT or --note MILESTONE=TEXT",
                    )
                    .into());
                }
                let mut milestone_notes = HashMap::new();
                for n in &notes {
                    let (id, text) = n.split_once('=').ok_or_else(|| {
                        Failure::usage(
                            "note_flag",
                            format!("--note {n:?} is not MILESTONE=TEXT"),
                            "name the milestone (a node id of the run) and its note, e.g. --note review=\"check the error paths\"",
                        )
                    })?;
                    milestone_notes.insert(id.trim().to_owned(), text.to_owned());
                }
                let info = client
                    .edit_task(EditTaskRequest {
                        project_id: project,
                        run_id: run,
                        by: who(),
                        title,
                        goal,
                        milestone_notes,
                    })
                    .await?
                    .into_inner();
                finish(global, &info)
            }
            RunsCommand::Context { run, file } => {
                let path = format!(".cairn/runs/{run}/shared/context-manifest.yaml");
                let Some(file) = file else {
                    let request = GetRequest {
                        project_id: project,
                        path,
                        ..Default::default()
                    };
                    crate::transfer::get(&mut services.store()?, request, &mut tokio::io::stdout())
                        .await?;
                    return Ok(ExitCode::SUCCESS);
                };
                let yaml = if file.as_os_str() == "-" {
                    std::io::read_to_string(std::io::stdin())
                } else {
                    std::fs::read_to_string(&file)
                }
                .map_err(|e| {
                    Failure::usage(
                        "context_file",
                        format!("cannot read {}: {e}", file.display()),
                        "give a readable YAML file, or - for standard input",
                    )
                })?;
                let r = client
                    .edit_context(EditContextRequest {
                        project_id: project,
                        run_id: run,
                        by: who(),
                        manifest_yaml: yaml,
                    })
                    .await?
                    .into_inner();
                if global.json {
                    output::json(&json!({"seq": r.seq, "path": path}))?;
                } else {
                    println!("{path} replaced (event {})", r.seq);
                }
                Ok(ExitCode::SUCCESS)
            }
            RunsCommand::Archive { run } => {
                let archived = services
                    .store()?
                    .archive_run(cairn_proto::v1::ArchiveRunRequest {
                        project_id: project,
                        run_id: run.clone(),
                    })
                    .await?
                    .into_inner();
                if global.json {
                    output::json(&serde_json::json!({"run_id": run, "path": archived.path, "size_bytes": archived.size_bytes, "files": archived.files}))?;
                } else {
                    println!(
                        "archived {run} -> {} ({} files, {})",
                        archived.path,
                        archived.files,
                        output::bytes(archived.size_bytes)
                    );
                }
                Ok(ExitCode::SUCCESS)
            }
            RunsCommand::Unarchive { run } => {
                let unarchived = services
                    .store()?
                    .unarchive_run(cairn_proto::v1::UnarchiveRunRequest {
                        project_id: project,
                        run_id: run.clone(),
                    })
                    .await?
                    .into_inner();
                if global.json {
                    output::json(&serde_json::json!({"run_id": run, "files": unarchived.files, "size_bytes": unarchived.size_bytes}))?;
                } else {
                    println!(
                        "unarchived {run}: {} files ({}) back in .cairn/runs/{run}/",
                        unarchived.files,
                        output::bytes(unarchived.size_bytes)
                    );
                }
                Ok(ExitCode::SUCCESS)
            }
            RunsCommand::Watch {
                run,
                until_end,
                from,
            } => {
                if until_end {
                    let info = follow(global, &mut client, &project, &run, false).await?;
                    return finish(global, &info);
                }
                watch_on(global, &mut client, &project, &run, from).await
            }
            RunsCommand::Logs { run, node, follow } => {
                logs(global, &mut client, &project, &run, node, follow).await
            }
            RunsCommand::Cancel { run, reason } => {
                let info = client
                    .cancel_run(RunActionRequest {
                        project_id: project,
                        run_id: run,
                        by: who(),
                        reason: reason.unwrap_or_default(),
                    })
                    .await?
                    .into_inner();
                finish(global, &info)
            }
            RunsCommand::Resume { run } => {
                let info = client
                    .resume_run(RunActionRequest {
                        project_id: project.clone(),
                        run_id: run.clone(),
                        by: who(),
                        reason: String::new(),
                    })
                    .await?
                    .into_inner();
                // Embedded services stop with this process: stay until the run ends or waits.
                let info = if embedded {
                    follow(global, &mut client, &project, &run, false).await?
                } else {
                    info
                };
                finish(global, &info)
            }
            RunsCommand::Rerun { run, vars, title } => {
                let info = client
                    .submit_run(SubmitRunRequest {
                        project_id: project.clone(),
                        vars: parse_vars(&vars)?,
                        title: title.unwrap_or_default(),
                        by: who(),
                        rerun_of: run,
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                let info = if embedded {
                    follow(global, &mut client, &project, &info.run_id, false).await?
                } else {
                    info
                };
                finish(global, &info)
            }
            RunsCommand::Replay(_) | RunsCommand::Diff { .. } => {
                anyhow::bail!("`cairn runs replay` and `cairn runs diff` are dispatched to their own module")
            }
            RunsCommand::Rework {
                run,
                node,
                note,
                from_snapshot,
            } => {
                let info = client
                    .request_rework(ReworkRequest {
                        project_id: project.clone(),
                        run_id: run.clone(),
                        node_id: node,
                        by: who(),
                        note: note.unwrap_or_default(),
                        from_snapshot,
                    })
                    .await?
                    .into_inner();
                let info = if embedded {
                    follow(global, &mut client, &project, &run, false).await?
                } else {
                    info
                };
                finish(global, &info)
            }
        }
    }
    .await;
    services.close().await?;
    result
}

/// `--var KEY=VALUE` flags as a map.
pub(super) fn parse_vars(flags: &[String]) -> anyhow::Result<HashMap<String, String>> {
    let mut vars = HashMap::new();
    for kv in flags {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--var {kv:?}: expected KEY=VALUE"))?;
        vars.insert(k.trim().to_owned(), v.to_owned());
    }
    Ok(vars)
}

/// `--since` / `--until` as an RFC 3339 time: a day (YYYY-MM-DD, UTC) is its start, or with
/// `end` the start of the next day (so the day is included).
pub(super) fn time_arg(flag: &str, text: Option<String>, end: bool) -> anyhow::Result<String> {
    let Some(text) = text.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()) else {
        return Ok(String::new());
    };
    let day = time::macros::format_description!("[year]-[month]-[day]");
    if let Ok(d) = time::Date::parse(&text, &day) {
        let d = if end {
            d.next_day()
                .ok_or_else(|| anyhow::anyhow!("--{flag} {text}: no day follows it"))?
        } else {
            d
        };
        return Ok(format!("{d}T00:00:00Z"));
    }
    if time::OffsetDateTime::parse(&text, &time::format_description::well_known::Rfc3339).is_ok() {
        return Ok(text);
    }
    anyhow::bail!(
        "--{flag} {text:?}: give a day (2026-11-25) or an RFC 3339 time (2026-11-25T08:00:00Z)"
    )
}

pub(super) fn parse_state(s: &str) -> anyhow::Result<TaskState> {
    Ok(match s {
        "created" => TaskState::Created,
        "working" => TaskState::Working,
        "input-required" => TaskState::InputRequired,
        "completed" => TaskState::Completed,
        "failed" => TaskState::Failed,
        "canceled" => TaskState::Canceled,
        other => anyhow::bail!("unknown state {other:?} (created, working, input-required, completed, failed, canceled)"),
    })
}

/// `cairn gate approve|reject RUN GATE --note ...`.
pub async fn gate(global: &Global, cmd: GateCommand) -> anyhow::Result<ExitCode> {
    let services = Services::open(global, needs()).await?;
    let mut client = services.orchestrator()?;
    let project = global.project.clone();
    let result = async {
        let (approve, run, gate, note) = match cmd {
            GateCommand::Approve { run, gate, note } => (true, run, gate, note),
            GateCommand::Reject { run, gate, note } => (false, run, gate, note),
        };
        let request = GateDecisionRequest {
            project_id: project.clone(),
            run_id: run.clone(),
            gate_id: gate,
            by: who(),
            note: note.unwrap_or_default(),
        };
        let info = if approve {
            client.approve_gate(request).await?
        } else {
            client.reject_gate(request).await?
        }
        .into_inner();
        let info = if global.addr.is_none() {
            follow(global, &mut client, &project, &run, false).await?
        } else if !approve {
            settled(&mut client, &project, &run, info).await?
        } else {
            info
        };
        finish(global, &info)
    }
    .await;
    services.close().await?;
    result
}

/// `cairn notes add RUN TEXT`.
pub async fn notes(global: &Global, cmd: NotesCommand) -> anyhow::Result<ExitCode> {
    let services = Services::open(global, needs()).await?;
    let mut client = services.orchestrator()?;
    let result = async {
        match cmd {
            NotesCommand::Add { run, text } => {
                let r = client
                    .add_note(AddNoteRequest {
                        project_id: global.project.clone(),
                        run_id: run,
                        by: who(),
                        text,
                    })
                    .await?
                    .into_inner();
                if global.json {
                    output::json(&json!({"seq": r.seq, "ref": r.r#ref}))?;
                } else {
                    println!("note recorded as event {} ({})", r.seq, r.r#ref);
                }
                Ok(ExitCode::SUCCESS)
            }
        }
    }
    .await;
    services.close().await?;
    result
}
