//! `cairn up`: every service in one process on one address, plus the web console.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use cairn_console::{ConsoleConfig, ConsoleServer};
use tokio::sync::watch;

use crate::cli::{Global, UpArgs};
use crate::embedded;
use crate::settings::Settings;

pub async fn run(global: &Global, args: UpArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(global)?;
    let own = &settings.orchestrator.config;
    let tls = own.tls.is_set();
    let (listener, addr): (cairn_server::Listen, String) = match &args.socket {
        Some(path) => {
            anyhow::ensure!(
                !tls,
                "--socket serves without TLS (the socket file's mode, 0600, decides who may connect), but TLS is configured (--tls-dir, CAIRN_TLS_DIR or [tls]): leave out one of them"
            );
            let listener = cairn_server::unix::Listener::bind(path)?;
            let addr = listener.addr();
            (listener.into(), addr)
        }
        None => {
            cairn_server::check_listen_text(&args.listen, tls, own.insecure_listen)?;
            let listener = cairn_server::bind(&args.listen).await?;
            let addr = listener.local_addr()?.to_string();
            (listener.into(), addr)
        }
    };
    // Without TLS the services and the console call each other in memory: nothing on the port
    // needs to be trusted for them.
    let in_process = (!tls).then(cairn_server::inproc::Listener::new);
    let internal = in_process
        .as_ref()
        .map_or(addr.clone(), |l| l.addr().to_owned());
    // The console is checked and bound before any service starts: a console that refuses to
    // start (no token beyond loopback, a bad setting, a taken port) fails `cairn up` at once
    // with its reason, and nothing is left running.
    let console = if args.no_console {
        None
    } else {
        Some(console_server(&settings, &args, &internal).await?)
    };
    let mut hosted = embedded::host_all(
        &settings,
        &addr,
        embedded::Needs {
            sandbox: true,
            orchestrator: true,
            tokens_file: args.tokens_file.clone(),
            ..Default::default()
        },
        in_process,
    )
    .await?;
    let metrics = match own.metrics_listen.trim() {
        "" => None,
        at => {
            let listener = cairn_server::bind(at).await?;
            let url = format!("http://{}/metrics", listener.local_addr()?);
            hosted.metrics(listener);
            Some(url)
        }
    };
    // One write, whose failure is ignored: a caller that reads only the first line and closes
    // the pipe must not stop the services.
    let mut said = format!(
        "cairn is up on {addr} (data root {}); use CAIRN_ADDR={addr} with other cairn commands. Ctrl-C stops.\n{}\n",
        global.data_root.display(),
        trust_mode(tls, hosted.tokens_required, args.socket.as_deref())
    );
    if let Some(url) = metrics {
        said.push_str(&format!("metrics: {url}\n"));
    }
    let _ = std::io::stderr().write_all(said.as_bytes());

    // One signal stops both the gRPC services and the console; a console that stops with an
    // error stops the services too.
    let (stop, stopped) = watch::channel(false);
    let console = console.map(|server| {
        // A closed stderr (the caller read the first line) must not stop the services.
        let _ = writeln!(std::io::stderr(), "web console: {}", server.url());
        let mut rx = stopped.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let served = server
                .serve(async move {
                    let _ = rx.wait_for(|s| *s).await;
                })
                .await;
            let _ = stop.send(true);
            served
        })
    });
    let mut rx = stopped.clone();
    let served = hosted.serve(listener, async move {
        tokio::select! {
            () = cairn_server::shutdown_signal() => {},
            _ = rx.wait_for(|s| *s) => {},
        }
    });
    let result = served.await;
    let _ = stop.send(true);
    if let Some(console) = console {
        console
            .await
            .context("the console task failed")?
            .context("the console failed")?;
    }
    result?;
    let _ = writeln!(std::io::stderr(), "cairn stopped");
    Ok(ExitCode::SUCCESS)
}

/// The one line `cairn up` prints about who may call it.
fn trust_mode(tls: bool, tokens: bool, socket: Option<&std::path::Path>) -> String {
    match (socket, tokens) {
        (Some(path), false) => return format!("trust: the Unix socket {} (mode 0600): only its owner and root can connect, and they may do everything (give --tokens-file to require tokens too)", path.display()),
        (Some(path), true) => return format!("trust: tokens, on the Unix socket {} (mode 0600): only its owner and root can connect, and every call needs a token (the store, ingest and the sandbox-runner take admin tokens only)", path.display()),
        (None, _) => {}
    }
    let said = match (tls, tokens) {
        (true, false) => "trust: mutual TLS: every call needs a client certificate of the PKI",
        (true, true) => "trust: mutual TLS, and people's tokens: every call needs a client certificate; the orchestrator also checks the token",
        (false, true) => "trust: tokens: every call needs a token (the store, ingest and the sandbox-runner take admin tokens only); no call is trusted for coming from this machine",
        (false, false) => "trust: NONE: no authentication is configured, so every local user who reaches this port may do everything (give --tokens-file or --tls-dir to require credentials, or --socket PATH to keep other local users out)",
    };
    said.to_owned()
}

/// The console of `cairn up`, checked and bound: the `[console]` settings with the flags of
/// `cairn up` over them, dialling the services at `addr`.
async fn console_server(
    settings: &Settings,
    args: &UpArgs,
    addr: &str,
) -> anyhow::Result<ConsoleServer> {
    let from_file = settings.console.config.clone();
    let listen = args
        .console_listen
        .clone()
        .unwrap_or(from_file.listen.clone());
    let mut public_hosts = from_file.public_hosts.clone();
    public_hosts.extend(args.console_public_hosts.iter().cloned());
    let config = ConsoleConfig {
        enabled: true,
        listen: listen.clone(),
        orchestrator_addr: addr.to_owned(),
        store_addr: addr.to_owned(),
        token: args
            .console_token
            .clone()
            .or(from_file.token.clone())
            .filter(|t| !t.is_empty()),
        tls: settings.orchestrator.config.tls.clone(),
        // People log in with their own tokens from the same file.
        user_tokens: args.tokens_file.is_some() || from_file.user_tokens,
        public_hosts,
        ..from_file
    };
    // A socket keeps other local users away from the services; a console anyone on this
    // machine may use without logging in would let them back in.
    anyhow::ensure!(
        args.socket.is_none() || config.token.is_some() || config.user_tokens,
        "--socket keeps other local users away from the services, but the web console on {listen} would let them in without a login: give --console-token (or --tokens-file), or --no-console"
    );
    let listener = cairn_server::bind(&listen)
        .await
        .with_context(|| format!("the console's listen address {listen:?}"))?;
    ConsoleServer::new(config, listener)
        .context("the web console cannot start (--no-console starts cairn without it)")
}
