//! The command-line grammar (clap). Help texts here are the user's manual: keep them true.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// cairn makes the work of LLM agents safe, traceable and reproducible: agent graphs run as
/// durable run directories, code fences become workspace files, code runs in sandboxes, and one
/// artifact-store writes every file.
///
/// Without --addr, commands start the services they need inside this process over
/// --data-root; with --addr (or CAIRN_ADDR) they talk to running services (`cairn up`,
/// docker compose, Kubernetes).
#[derive(Debug, Parser)]
#[command(
    name = "cairn",
    version,
    propagate_version = true,
    max_term_width = 100,
    after_help = "Errors: `error: <what happened>` and `hint: <what to do>` on stderr (--json: \
{\"error\": {\"reason\", \"message\", \"hint\"}} on stdout). Exit codes, the same for \
every command: 0 ok, 1 failed work, 2 usage, 3 not found, 4 partial, 5 refused or no \
permission, 6 unavailable (docs/troubleshooting.md)."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct Global {
    /// Address of running cairn services (host:port, or unix:PATH for `cairn up --socket`);
    /// all services are expected there.
    #[arg(long, global = true, env = "CAIRN_ADDR", value_name = "HOST:PORT")]
    pub addr: Option<String>,
    /// Address of the artifact-store when it is not at --addr (give it before the subcommand).
    #[arg(long, env = "CAIRN_STORE_ADDR", value_name = "HOST:PORT")]
    pub store_addr: Option<String>,
    /// Address of the ingest service when it is not at --addr.
    #[arg(long, env = "CAIRN_INGEST_ADDR", value_name = "HOST:PORT")]
    pub ingest_addr: Option<String>,
    /// Address of a sandbox-runner when it is not at --addr.
    #[arg(long, env = "CAIRN_SANDBOX_ADDR", value_name = "HOST:PORT")]
    pub sandbox_addr: Option<String>,
    /// The one configuration file: a TOML section per service ([artifact_store], [ingest],
    /// [sandbox_runner], [orchestrator], [console]; [llm], [code_delivery], [onebot], [auth] and
    /// a shared [tls]). Read by `cairn up`, `cairn serve` and every command that starts services
    /// itself (give it before the subcommand). `cairn config show` prints the outcome.
    #[arg(long, env = "CAIRN_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory of the embedded services (used when no address is given).
    #[arg(
        long,
        global = true,
        env = "CAIRN_DATA_ROOT",
        value_name = "DIR",
        default_value = ".cairn-data"
    )]
    pub data_root: PathBuf,
    /// Where --data-root came from (flag, CAIRN_DATA_ROOT or the default), for `config show`.
    #[arg(skip)]
    pub data_root_source: Option<clap::parser::ValueSource>,
    /// Project to act on.
    #[arg(
        long,
        short = 'p',
        global = true,
        env = "CAIRN_PROJECT",
        default_value = "default"
    )]
    pub project: String,
    /// Machine-readable JSON output on stdout (a failure too: {"error": {"reason", "message",
    /// "hint"}}).
    #[arg(long, global = true)]
    pub json: bool,
    /// Print where the embedded services' log file is (<data-root>/logs/cairn.log) and copy
    /// its lines, from level info, to stderr.
    #[arg(long, short = 'v', global = true)]
    pub verbose: bool,
    #[command(flatten)]
    pub tls: cairn_server::TlsArgs,
    /// With TLS: the host name a server's certificate must carry when an address is a
    /// non-loopback IP address (e.g. a container's address on a compose network, whose
    /// certificate names the service, not the address).
    #[arg(
        long,
        global = true,
        env = "CAIRN_TLS_SERVER_NAME",
        value_name = "NAME"
    )]
    pub tls_server_name: Option<String>,
    /// A file holding your token (`cairn tokens add`) or your identity provider's ID token (a
    /// JWT), sent to every service as `authorization: Bearer`; needed when the orchestrator
    /// has a tokens file or JWTs. CAIRN_TOKEN may hold the token itself instead.
    #[arg(
        long,
        global = true,
        env = "CAIRN_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,
    /// The token itself. On the command line other local users can read it in the process
    /// list (a warning is printed): prefer --token-file or CAIRN_TOKEN.
    #[arg(long, global = true, value_name = "TOKEN")]
    pub token: Option<String>,
}

impl Cli {
    /// Parses the command line (exiting with clap's usage error, code 2, when it is wrong),
    /// remembering where --data-root came from.
    pub fn parse_args() -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Cli::command()
            .try_get_matches()
            .unwrap_or_else(|e| crate::failure::usage_exit(e));
        let mut cli =
            Cli::from_arg_matches(&matches).unwrap_or_else(|e| crate::failure::usage_exit(e));
        cli.global.data_root_source = matches.value_source("data_root");
        cli
    }
}

impl Global {
    /// The bearer token: --token-file, else --token (with a warning: argv is public), else
    /// CAIRN_TOKEN.
    pub fn bearer_token(&self) -> anyhow::Result<Option<String>> {
        if let Some(path) = &self.token_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                anyhow::anyhow!("cannot read the token file {}: {e}", path.display())
            })?;
            let token = text.trim();
            if token.is_empty() {
                anyhow::bail!(
                    "the token file {} is empty: write your token into it",
                    path.display()
                );
            }
            return Ok(Some(token.to_owned()));
        }
        if let Some(token) = &self.token {
            eprintln!("warning: --token puts the token on the command line, where other local users can read it (the process list); use --token-file FILE or CAIRN_TOKEN");
            return Ok(Some(token.clone()));
        }
        Ok(std::env::var("CAIRN_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty()))
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run all cairn services in this process on one address until Ctrl-C.
    Up(UpArgs),
    /// Run one service standalone (for compose/Kubernetes deployments).
    Serve(ServeArgs),
    /// Check the gRPC health of the services at --addr (exit 0 when SERVING).
    Health(HealthArgs),
    /// Files, events and documents in the artifact-store.
    #[command(subcommand)]
    Store(StoreCommand),
    /// The effective configuration of every service and where each value came from.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Create or list projects (commands that write create their project on first use).
    #[command(subcommand)]
    Project(ProjectCommand),
    /// Turn the strict code fences (```lang file=path) of a document into workspace/ files and
    /// print the manifest (--json: exactly manifest v1).
    Ingest(IngestArgs),
    /// Run code in the sandbox-runner against the project store.
    #[command(subcommand)]
    Sandbox(SandboxCommand),
    /// Run a graph (YAML) or a built-in mode, showing progress live; ends with a summary.
    ///
    /// Exit codes: 0 completed (or waiting at a gate), 1 failed or canceled, 4 completed but
    /// some code blocks of its documents were not written to the workspace (rejected or
    /// skipped: see the nodes' not_written outputs), 6 a service could not be reached.
    Run(RunArgs),
    /// List, show, watch, cancel, resume or rework runs.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Decide a human approval gate.
    #[command(subcommand)]
    Gate(GateCommand),
    /// Human notes (shared/human-notes.md): high-priority context for later agent nodes.
    #[command(subcommand)]
    Notes(NotesCommand),
    /// The PKI for mutual TLS between cairn's programs (docs/security.md).
    #[command(subcommand)]
    Certs(CertsCommand),
    /// People who may use the orchestrator and the console: the tokens file (name, role,
    /// optional projects, sha256 of each token).
    #[command(subcommand)]
    Tokens(TokensCommand),
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print every key of every service as `cairn up` would run it: its value and its source
    /// (default, file, env, flag); secrets are masked. --json prints one object per key.
    Show,
}

#[derive(Debug, Subcommand)]
pub enum ProjectCommand {
    /// Create a project (default: --project); an existing one is left as it is.
    Create {
        /// Project id (1-64 letters, digits, `_` or `-`).
        name: Option<String>,
    },
    /// List the projects with their creation times.
    List,
}

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Make a CA and a certificate + key per identity in DIR: ca.pem, ca.key, <identity>.pem,
    /// <identity>.key (keys 0600). Each certificate serves and dials; it names its identity in
    /// a SAN URI cairn://<identity> and carries the identity, localhost, 127.0.0.1, ::1 and
    /// the compose and Kubernetes service names as host names. Refuses to replace files. With
    /// --split each identity also gets DIR/<identity>/ with only its own files.
    Init(CertsInitArgs),
    /// Re-issue every identity certificate in DIR (each <identity>.pem with its .key beside
    /// it, and its DIR/<identity>/ copy) from the CA in DIR, valid --days from now. Identities,
    /// host names, keys and the CA stay; each file is replaced by rename. Running services
    /// pick the new certificates up within seconds (or on SIGHUP).
    Renew(CertsRenewArgs),
    /// Print the identity a certificate names, its host names, validity, serial number and
    /// issuer: of a file, or (--served) of the certificate a running service presents.
    Show {
        /// A certificate (PEM).
        #[arg(required_unless_present = "served", conflicts_with = "served")]
        cert: Option<PathBuf>,
        /// Instead of a file: the certificate the service at HOST:PORT presents to a new
        /// connection, dialled with your TLS settings (--tls-dir: the `cli` identity), e.g.
        /// to see that a service serves its renewed certificate; also says whether the
        /// service answers a call made with your certificate (`accepted`).
        #[arg(long, value_name = "HOST:PORT")]
        served: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Add a person with a new random token; prints the token once (only its hash is kept).
    Add {
        /// The name recorded as `by` of everything this person does.
        name: String,
        /// viewer (read), operator (+ submit, cancel, resume, notes, rework, context),
        /// approver (+ gate decisions), admin (everything).
        #[arg(long)]
        role: String,
        /// Projects this person may act on (comma-separated or repeated); none = every
        /// project. (`--project` is the global project to act on.)
        #[arg(long = "projects", value_name = "PROJECT", value_delimiter = ',')]
        projects: Vec<String>,
        #[command(flatten)]
        file: TokensFileArg,
    },
    /// The people of the tokens file: names, roles, projects.
    List {
        #[command(flatten)]
        file: TokensFileArg,
    },
    /// Remove a person; their token stops working (a running orchestrator notices within a
    /// second).
    Remove {
        name: String,
        #[command(flatten)]
        file: TokensFileArg,
    },
}

#[derive(Debug, Args)]
pub struct CertsInitArgs {
    /// Directory to write into (created when missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Validity of every certificate, in days (1-3650).
    #[arg(long, default_value_t = 365)]
    pub days: u32,
    /// An extra host name (or IP address) on every certificate (repeatable).
    #[arg(long = "dns", value_name = "NAME")]
    pub dns: Vec<String>,
    /// An identity to issue (repeatable; default: artifact-store, ingest, sandbox-runner,
    /// orchestrator, console, cli, etcd).
    #[arg(long = "name", value_name = "IDENTITY")]
    pub names: Vec<String>,
    /// Replace files that exist (every certificate issued before stops being trusted when the
    /// CA is replaced).
    #[arg(long, conflicts_with = "if_missing")]
    pub force: bool,
    /// When DIR already holds a CA (ca.pem), issue with it only the identities that have no
    /// certificate yet, and succeed writing nothing when none is missing: for deployments
    /// that run this at every start (an upgrade that adds an identity gets its files).
    #[arg(long)]
    pub if_missing: bool,
    /// Also give each identity a directory DIR/<identity>/ holding only ca.pem,
    /// <identity>.pem and <identity>.key, for a container to mount just its own (ca.key stays
    /// only in DIR).
    #[arg(long)]
    pub split: bool,
    /// Give every file and directory written to this numeric user and group (e.g. the user a
    /// service container runs as, 10002:10002); needs root unless it is your own.
    #[arg(long, value_name = "UID:GID", value_parser = cairn_server::pki::parse_owner)]
    pub owner: Option<(u32, u32)>,
}

#[derive(Debug, Args)]
pub struct CertsRenewArgs {
    /// A directory made by `cairn certs init` (it holds ca.pem and ca.key).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Validity of every renewed certificate, in days from now (1-3650).
    #[arg(long, default_value_t = 365)]
    pub days: u32,
}

#[derive(Debug, Args)]
pub struct TokensFileArg {
    /// The tokens file (created by the first `add`).
    #[arg(long = "file", env = "CAIRN_TOKENS_FILE", value_name = "FILE")]
    pub path: PathBuf,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The graph file (docs/graphs.md). The files it names (schemas, limits, prompts) are
    /// read from its directory and sent with it; none from outside it. Omit with --mode.
    pub graph: Option<PathBuf>,
    /// A value for {{vars.KEY}} (repeatable).
    #[arg(long = "var", value_name = "KEY=VALUE")]
    pub vars: Vec<String>,
    /// Built-in graph: single | self_critique | team.
    #[arg(long)]
    pub mode: Option<String>,
    /// Goal for built-in graphs ({{vars.prompt}}).
    #[arg(long)]
    pub prompt: Option<String>,
    /// LLM provider for agent nodes: a provider name of the orchestrator's config, a local
    /// cassette (replay:CASSETTE.yaml, sent inline), or openai:BASE_URL#MODEL (without --addr
    /// this process is the operator and sends llm.api_key_env's key; a remote orchestrator
    /// takes URLs only with llm.allow_request_llm_urls and gives them no key of its own).
    #[arg(long)]
    pub llm: Option<String>,
    /// Run id (default: a new time-ordered id).
    #[arg(long)]
    pub run_id: Option<String>,
    /// Title (default: the graph's).
    #[arg(long)]
    pub title: Option<String>,
    /// Approve every gate the run reaches, as the current user, without asking.
    #[arg(long)]
    pub approve_gates: bool,
    /// With --addr: submit and return at once instead of following the run.
    #[arg(long)]
    pub detach: bool,
}

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Runs of the project, newest first.
    List {
        /// Only runs in this state (repeatable): created, working, input-required, completed, failed, canceled.
        #[arg(long)]
        state: Vec<String>,
        /// Only runs whose title, goal or run id contains this text (case-insensitive).
        #[arg(long, value_name = "TEXT")]
        search: Option<String>,
        /// Only runs created at or after this time: RFC 3339 or a day (YYYY-MM-DD, UTC).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Only runs created before this time: RFC 3339, or a day (YYYY-MM-DD, UTC; that day
        /// included).
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
        /// Only runs the orchestrator's watchdog reports stalled (a running node went past its
        /// stall limit without any event).
        #[arg(long)]
        stalled: bool,
    },
    /// One run: state, nodes, gates, run directory.
    Show { run: String },
    /// Change a run's title, goal or milestone notes, running or finished (a task.edited
    /// event; task.yaml, state.json and README.md follow). Prints the run.
    Edit {
        run: String,
        /// The new title.
        #[arg(long)]
        title: Option<String>,
        /// The new goal.
        #[arg(long)]
        goal: Option<String>,
        /// A milestone's note (repeatable); an empty TEXT removes the note.
        #[arg(long = "note", value_name = "MILESTONE=TEXT")]
        notes: Vec<String>,
    },
    /// Replace a run's shared/context-manifest.yaml (the files and snippets shared with its
    /// agents) with FILE (`-`: standard input): checked, then recorded as a context.edited event.
    /// Without FILE, print the current manifest.
    Context { run: String, file: Option<PathBuf> },
    /// Pack a finished (completed, failed or canceled) run into one compressed file,
    /// .cairn/runs/RUN/run.tar.gz; `runs show`, `runs list` and `store events` still read it,
    /// but it takes no more events (no resume, rework or notes) until `runs unarchive`. Admin
    /// only.
    Archive { run: String },
    /// Unpack an archived run: its files go back into .cairn/runs/RUN/ and it takes events
    /// again (resume, rework, notes). The retention sweep archives it again when its rule
    /// still picks it. Admin only.
    Unarchive { run: String },
    /// Follow a run's events live: every event from the first, then on through rework, resume
    /// and later actions until you stop it (Ctrl-C). One line per event (`--json`: one JSON
    /// object per line).
    Watch {
        run: String,
        /// Stop when the run ends or waits for a human, and print the run as `runs show` does.
        #[arg(long)]
        until_end: bool,
        /// First event to print (to go on after the last sequence number printed).
        #[arg(long, default_value_t = 1, value_name = "SEQ")]
        from: u64,
    },
    /// What the run's sandbox_run and code_delivery nodes printed: stdout and command lines to
    /// stdout, stderr to stderr, each attempt under a `==> node N attempt A <==` header. Each
    /// attempt keeps the last 1 MiB of its output (the orchestrator's log_retain_bytes); a
    /// line says how much earlier output was dropped. `--json`: one JSON object per chunk.
    Logs {
        run: String,
        /// Only this node's output (a map item is `<map>.<index>`).
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
        /// Keep printing new output as it comes until the run ends.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Cancel a run (sandbox work in flight is stopped).
    Cancel {
        run: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume an unfinished run from its records.
    Resume { run: String },
    /// Start a new run from this run's records: its graph as submitted (prompts and schemas
    /// included), variables, title and LLM. Prints the new run.
    Rerun {
        run: String,
        /// Replace a recorded variable (repeatable).
        #[arg(long = "var", value_name = "KEY=VALUE")]
        vars: Vec<String>,
        /// Title of the new run (default: the recorded one).
        #[arg(long)]
        title: Option<String>,
    },
    /// Replay a recorded run offline: a new run of its graph and variables in which every
    /// provider request is answered from the run's recorded exchanges (no model is called;
    /// a request that differs from the recorded one stops the replay). Follows the replay to
    /// its end and prints `identical` (exit 0) or the first divergence: node, attempt, what
    /// differed and a unified diff (exit 4); 1 when the replay failed otherwise. `--json`:
    /// {"run_id", "replay_of", "verdict", "divergence"} (docs/replay.md). With --graph, a
    /// changed graph is evaluated against the records; with --select, many runs are replayed
    /// and a report is written.
    Replay(ReplayArgs),
    /// Compare two runs: graph and variables, per-node outputs, files written (path, sha256,
    /// unified diff of text), token usage and durations. `--json`: one object.
    Diff { a: String, b: String },
    /// Re-run a node and everything that depends on it.
    Rework {
        run: String,
        node: String,
        /// What to change (appended to human-notes.md, given to the agent).
        #[arg(long)]
        note: Option<String>,
        /// Start the node's sandbox session from its last snapshot (a code_delivery node's
        /// checkpoint or pause) instead of a fresh workspace.
        #[arg(long)]
        from_snapshot: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The recorded run (or --select to replay many).
    #[arg(required_unless_present = "select", conflicts_with = "select")]
    pub run: Option<String>,
    /// Replace a recorded variable (repeatable): the first node whose request changes
    /// diverges.
    #[arg(long = "var", value_name = "KEY=VALUE")]
    pub vars: Vec<String>,
    /// sandbox_run steps: `recorded` returns the recorded results, outputs and files (a step
    /// whose request changed diverges); `live` runs them again on a runner.
    #[arg(long, value_enum, default_value_t = Replayed::Recorded)]
    pub sandbox: Replayed,
    /// Gates: `recorded` takes the recorded decisions; `live` waits for people.
    #[arg(long, value_enum, default_value_t = Replayed::Recorded)]
    pub gates: Replayed,
    /// A changed graph to evaluate against the records instead of the recorded one (its
    /// files are sent with it, as `cairn run` does): unchanged requests and steps replay from
    /// the records, and the first changed one is the divergence.
    #[arg(long, value_name = "GRAPH.yaml")]
    pub graph: Option<PathBuf>,
    /// Stop at the first divergence: its node fails and the verdict names it (the default).
    #[arg(long, conflicts_with = "live_after")]
    pub until_divergence: bool,
    /// At a request or step that differs from the records (or has none), go on live instead
    /// of stopping: the model (--llm, else the recorded run's provider) answers from there,
    /// so a change costs only the part it changed. The verdict still names the divergence.
    #[arg(long)]
    pub live_after: bool,
    /// The provider --live-after uses, as `cairn run --llm` takes it.
    #[arg(long, requires = "live_after")]
    pub llm: Option<String>,
    /// Replay every run a filter selects, one after another, and write a report: space-
    /// separated `graph=TITLE` (runs with that title, a graph's own unless the run was given
    /// another; quote a title with spaces: `graph='two agents'`), `since=DATE`,
    /// `until=DATE` (as `runs list`), `state=STATE` (default completed), `limit=N`
    /// (default 100). Replays themselves are never selected.
    #[arg(long, value_name = "FILTER")]
    pub select: Option<String>,
    /// With --select: the report's path without extension; REPORT.json and REPORT.md are
    /// written.
    #[arg(
        long,
        value_name = "REPORT",
        requires = "select",
        default_value = "replay-report"
    )]
    pub report: PathBuf,
}

/// Whether a part of a replay comes from the records or runs live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Replayed {
    Recorded,
    Live,
}

#[derive(Debug, Subcommand)]
pub enum GateCommand {
    /// Approve a blocked gate; the run continues.
    Approve {
        run: String,
        gate: String,
        /// Why, kept in the run's notes; may cite entries of the run's evidence index
        /// (.cairn/runs/RUN/shared/evidence/index.json) as evidence:E42.
        #[arg(long)]
        note: Option<String>,
    },
    /// Reject a blocked gate.
    Reject {
        run: String,
        gate: String,
        /// Why, kept in the run's notes; may cite entries of the run's evidence index
        /// (.cairn/runs/RUN/shared/evidence/index.json) as evidence:E42.
        #[arg(long)]
        note: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum NotesCommand {
    /// Append a note to the run's shared/human-notes.md.
    Add { run: String, text: String },
}

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Run code with project files staged read-only at /input; files the code leaves in /output
    /// are written to --output-prefix (default docs/artifacts/<run_id>/), which must lie under
    /// an --allowed-prefix (default docs/artifacts/<run_id>/; never .cairn/ nor another run's
    /// docs/artifacts/ directory), and the run record to .cairn/runs/<run_id>/sandbox/result.json.
    /// Prints a YAML (or --json) summary. Exits 1 when the code fails, times out or is killed.
    Run(SandboxRunArgs),
    /// Long-lived sessions on a served runner (--sandbox-addr or --addr): open, exec, pause
    /// into a snapshot kept in the store under .cairn/snapshots/<session>/<n>.snap, resume or
    /// fork a snapshot on any runner of the same backend and image, close.
    #[command(subcommand)]
    Session(SessionCommand),
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Open a session; prints its id (--json: {"session_id", "ms"}).
    Open {
        /// Image to run in (default: the runner's `image`).
        #[arg(long)]
        image: Option<String>,
        /// Give the session network access (refused unless the runner allows it).
        #[arg(long)]
        network: bool,
    },
    /// Run `bash -lc COMMAND` in a session; prints its output and exits with its exit code
    /// (--json: {"exit_code", "stdout", "stderr"}).
    Exec {
        session: String,
        /// Start it in the background and return at once (its process id on stdout); it runs
        /// until the session closes or is paused, and a gvisor pause keeps it running.
        #[arg(long)]
        detach: bool,
        /// Timeout in seconds (default: the runner's).
        #[arg(long, value_name = "SECONDS")]
        timeout: Option<f64>,
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Pause a session into a snapshot stored at .cairn/snapshots/<session>/<n>.snap (the
    /// session is closed); prints its path, size, whether memory is in it, and the time taken
    /// (--json: {"snapshot", "bytes", "memory", "ms"}).
    Pause {
        session: String,
        /// Keep files only, even where memory and processes could be kept (gvisor).
        #[arg(long)]
        files_only: bool,
    },
    /// Resume a stored snapshot as a new session; prints its id (--json: {"session_id", "ms"}).
    Resume {
        /// Store path of the snapshot (.cairn/snapshots/<session>/<n>.snap).
        snapshot: String,
    },
    /// Resume a stored snapshot N times on one runner, which gets its bytes once; all N open
    /// or none. Prints the N session ids (--json: {"sessions"}).
    Fork {
        snapshot: String,
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
        count: u32,
    },
    /// Close a session (--json: {"closed"}).
    Close { session: String },
}

#[derive(Debug, Args)]
pub struct SandboxRunArgs {
    /// python | bash | sh.
    #[arg(long, default_value = "python")]
    pub language: String,
    /// The program text.
    #[arg(
        long,
        conflicts_with = "code_file",
        required_unless_present = "code_file"
    )]
    pub code: Option<String>,
    /// Project path of the program to run (staged under /input like the inputs).
    #[arg(long, value_name = "PROJECT_PATH")]
    pub code_file: Option<String>,
    /// Project path staged read-only at /input/<path> (repeatable).
    #[arg(long = "input", value_name = "PROJECT_PATH")]
    pub inputs: Vec<String>,
    /// Where outputs land in the project (default docs/artifacts/<run_id>); must lie under an
    /// --allowed-prefix. Checked before anything runs.
    #[arg(long, value_name = "PROJECT_PATH")]
    pub output_prefix: Option<String>,
    /// A prefix outputs may land under (repeatable; default docs/artifacts/<run_id>/). Never
    /// under .cairn/ (run records are written by cairn only).
    #[arg(long = "allowed-prefix", value_name = "PROJECT_PATH")]
    pub allowed_prefixes: Vec<String>,
    /// Timeout in seconds (default: the runner's).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// Run id (default: a new `sandbox-<uuid>`).
    #[arg(long)]
    pub run: Option<String>,
    /// Replace existing output files that hold other bytes.
    #[arg(long)]
    pub overwrite: bool,
    /// Image to run in, e.g. cairn-toolchain:latest (default: the runner's `image`); the
    /// runner must list it in allowed_images.
    #[arg(long)]
    pub image: Option<String>,
    /// Give the program network access (refused unless the runner's network_allowed is on).
    #[arg(long)]
    pub network: bool,
}

#[derive(Debug, Args)]
pub struct IngestArgs {
    /// The document (Markdown) to ingest.
    pub document: PathBuf,
    /// Run id the manifest and events belong to (default: a new `manual-<uuid>`). Over mutual
    /// TLS the command claims this run and hands ingest an ingest claim on it, which fences off
    /// any other writer of the run: give manual ingests runs of their own.
    #[arg(long)]
    pub run: Option<String>,
    /// Node id (names the manifest: .cairn/runs/<run>/ingest/<node>.json).
    #[arg(long, default_value = "manual")]
    pub node: String,
    /// Mode recorded in the manifest (single, self_critique, team, unknown).
    #[arg(long, default_value = "unknown")]
    pub mode: String,
    /// Source path recorded in the manifest (default: DOCUMENT as given).
    #[arg(long)]
    pub doc_path: Option<String>,
    /// Parse and validate only: print the manifest as it would be, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Replace any existing workspace file that holds other bytes. Without it, only files an
    /// earlier ingest wrote and nobody changed since are replaced; the others are kept (the
    /// block is rejected `kept`).
    #[arg(long)]
    pub overwrite: bool,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7070", value_name = "HOST:PORT")]
    pub listen: String,
    /// Serve on this Unix socket instead of a TCP port. The socket is made mode 0600, so only
    /// this user (and root) can connect: other local users cannot reach the services even
    /// without tokens. Clients use --addr unix:PATH (CAIRN_ADDR). Not with TLS; the console
    /// (a TCP port) then needs --console-token or --tokens-file, or --no-console.
    #[arg(long, value_name = "PATH", conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// Address of the web console (runs, gates, notes); default: [console] listen of the
    /// configuration, 127.0.0.1:7480.
    #[arg(long, value_name = "HOST:PORT")]
    pub console_listen: Option<String>,
    /// Token the console asks for at login (required when it listens beyond loopback).
    #[arg(long, env = "CAIRN_CONSOLE_TOKEN")]
    pub console_token: Option<String>,
    /// Do not start the web console.
    #[arg(long)]
    pub no_console: bool,
    /// The tokens file (`cairn tokens add`): every call on the port then needs a token
    /// (--token-file / CAIRN_TOKEN; the store, ingest and the sandbox-runner take admin tokens
    /// only), and people log in to the console with their own token.
    #[arg(
        long,
        env = "CAIRN_TOKENS_FILE",
        value_name = "FILE",
        conflicts_with = "console_token"
    )]
    pub tokens_file: Option<PathBuf>,
    /// A name (or name:port) the console answers to besides its listen address and the
    /// loopback names, e.g. behind a reverse proxy (repeatable).
    #[arg(long = "console-public-host", value_name = "HOST")]
    pub console_public_hosts: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(subcommand)]
    pub service: ServeService,
}

#[derive(Debug, Subcommand)]
pub enum ServeService {
    /// The artifact-store (single canonical writer).
    ArtifactStore(cairn_artifact_store::ConfigArgs),
    /// The ingest service (needs --store-addr).
    Ingest(cairn_ingest::ConfigArgs),
    /// The sandbox-runner (needs a Docker engine or bubblewrap).
    SandboxRunner(cairn_sandbox_runner::ConfigArgs),
    /// The orchestrator (needs --store-addr; --ingest-addr and --sandbox-addr optional).
    Orchestrator(cairn_orchestrator::ConfigArgs),
    /// The web console alone: an HTTP server and a gRPC client of the orchestrator and the
    /// store (needs --orchestrator-addr and --store-addr). Beyond loopback it needs a login
    /// token (CAIRN_CONSOLE_TOKEN or --token-file) or --user-tokens. Probes: GET /healthz
    /// (alive) and /readyz (the orchestrator and the store answer), without login.
    Console(ConsoleArgs),
}

/// Flags of `cairn serve console`, over its `--config` file (or the `[console]` section of the
/// one configuration) and the `CAIRN_CONSOLE_<KEY>` variables.
#[derive(Debug, Clone, Default, Args)]
pub struct ConsoleArgs {
    /// TOML configuration file with the keys of the [console] section (listen,
    /// orchestrator_addr, store_addr, token, user_tokens, public_hosts, secure_cookie, tls, ...).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// HTTP address to listen on, e.g. 0.0.0.0:7480 (env CAIRN_CONSOLE_LISTEN).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// The orchestrator's gRPC address (env CAIRN_CONSOLE_ORCHESTRATOR_ADDR).
    #[arg(long, value_name = "HOST:PORT")]
    pub orchestrator_addr: Option<String>,
    /// The artifact-store's gRPC address (env CAIRN_CONSOLE_STORE_ADDR). Give it after
    /// `console`: before it, --store-addr is the CLI's own.
    #[arg(long, value_name = "HOST:PORT")]
    pub store_addr: Option<String>,
    /// A file holding the shared login token (at least 16 characters; surrounding whitespace
    /// is dropped), e.g. a mounted Secret. The token may also come from CAIRN_CONSOLE_TOKEN or
    /// the file's `token`; it is never taken on the command line, where others could read it.
    #[arg(long, env = "CAIRN_CONSOLE_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// People log in with their own token of the orchestrator's tokens file (the orchestrator
    /// must have one); excludes a shared token.
    #[arg(long)]
    pub user_tokens: bool,
    /// A name (or name:port) the console answers to besides its listen address and the
    /// loopback names: the name people reach it by, e.g. behind a reverse proxy or an Ingress
    /// (repeatable; env CAIRN_CONSOLE_PUBLIC_HOSTS, comma-separated).
    #[arg(long = "public-host", value_name = "HOST")]
    pub public_hosts: Vec<String>,
    /// Mark the session cookie Secure (set it when people reach the console over HTTPS).
    #[arg(long)]
    pub secure_cookie: bool,
}

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// Service name to check (e.g. cairn.v1.ArtifactStore); empty = the server as a whole.
    #[arg(long, default_value = "", conflicts_with = "http")]
    pub service: String,
    /// Check an HTTP endpoint instead of gRPC health, e.g. the web console's
    /// http://127.0.0.1:7480/readyz: exit 0 when it answers 2xx within 3 s (no --addr needed).
    #[arg(long, value_name = "URL")]
    pub http: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Upload a local file to a project path (streamed; atomic; refused if it exists with other
    /// bytes unless --overwrite).
    Put {
        /// Local file to upload ("-" = stdin).
        local: PathBuf,
        /// Project-relative destination path (e.g. docs/notes.md).
        path: String,
        /// Replace an existing file with different bytes.
        #[arg(long)]
        overwrite: bool,
        /// Refuse unless the bytes hash to this sha256 (hex).
        #[arg(long, value_name = "HEX")]
        sha256: Option<String>,
    },
    /// Download a project file to a local path (default: stdout).
    Get {
        /// Project-relative path.
        path: String,
        /// Local destination; omitted or "-" = stdout.
        local: Option<PathBuf>,
        /// First byte to read.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Bytes to read (0 = to the end).
        #[arg(long, default_value_t = 0)]
        length: u64,
    },
    /// List a directory of the project (direct children; -r for every file beneath).
    Ls {
        /// Project-relative directory ("" = the project root).
        #[arg(default_value = "")]
        prefix: String,
        /// Every file beneath the prefix.
        #[arg(long, short = 'r')]
        recursive: bool,
    },
    /// Describe one path (kind, size, sha256, modification time).
    Stat {
        /// Project-relative path.
        path: String,
    },
    /// Write a consistent backup of every project (or the one --project / CAIRN_PROJECT
    /// names) to a local file while the store keeps serving: a gzip tar with the sha256 of
    /// every file. Admin only.
    Backup {
        /// Local file to write (replaced whole when the backup is complete).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Restore a backup made by `store backup` into a store without its projects: every
    /// project of it (the store must have no project), or only the one --project /
    /// CAIRN_PROJECT names. Every file is checked first; a damaged backup restores nothing.
    /// Admin only.
    Restore {
        /// The backup file.
        file: PathBuf,
    },
    /// Print a run's events (events.jsonl), optionally following new ones.
    Events {
        /// Run id.
        run: String,
        /// First sequence number to print.
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Keep printing new events as they are appended (Ctrl-C to stop).
        #[arg(long, short = 'f')]
        follow: bool,
    },
}
