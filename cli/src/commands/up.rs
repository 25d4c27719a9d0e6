//! `cairn up`: every service in one process on one address, plus the web console.

use std::process::ExitCode;

use anyhow::Context;
use cairn_console::{console_url, serve_console, ConsoleConfig};
use tokio::sync::watch;

use crate::cli::{Global, UpArgs};
use crate::embedded;
use crate::settings::Settings;

pub async fn run(global: &Global, args: UpArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(global)?;
    let own = &settings.orchestrator.config;
    cairn_server::check_listen_text(&args.listen, own.tls.is_set(), own.insecure_listen)?;
    let listener = cairn_server::bind(&args.listen).await?;
    let addr = listener.local_addr()?.to_string();
    let hosted = embedded::host_all(
        &settings,
        &addr,
        embedded::Needs {
            sandbox: true,
            orchestrator: true,
            tokens_file: args.tokens_file.clone(),
            ..Default::default()
        },
        false,
    )
    .await?;
    eprintln!(
        "cairn is up on {addr} (data root {}); use CAIRN_ADDR={addr} with other cairn commands. Ctrl-C stops.",
        global.data_root.display()
    );

    // One signal stops both the gRPC services and the console.
    let (stop, stopped) = watch::channel(false);
    let mut console = None;
    if !args.no_console {
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
            orchestrator_addr: addr.clone(),
            store_addr: addr.clone(),
            token: args
                .console_token
                .clone()
                .or(from_file.token.clone())
                .filter(|t| !t.is_empty()),
            tls: own.tls.clone(),
            // People log in with their own tokens from the same file.
            user_tokens: args.tokens_file.is_some() || from_file.user_tokens,
            public_hosts,
            ..from_file
        };
        let console_listener = cairn_server::bind(&listen)
            .await
            .with_context(|| format!("the console's listen address {listen:?}"))?;
        eprintln!(
            "web console: {}",
            console_url(console_listener.local_addr()?)
        );
        let mut rx = stopped.clone();
        console = Some(tokio::spawn(serve_console(
            config,
            console_listener,
            async move {
                let _ = rx.wait_for(|s| *s).await;
            },
        )));
    }
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
    eprintln!("cairn stopped");
    Ok(ExitCode::SUCCESS)
}
