//! `cairn serve <service>`: one service standalone, configured like its own binary: its own
//! `--config` file, or its section of the one configuration (`cairn --config FILE serve ...`),
//! then its environment variables, then flags.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::cli::{ConsoleArgs, Global, ServeArgs, ServeService};
use crate::settings::{self, File};

/// The service's section of the one configuration as a file the service reads as its own
/// (`None` without `--config` / `CAIRN_CONFIG`). Giving both files is refused.
fn section_file(
    global: &Global,
    service: &str,
    own: &Option<PathBuf>,
) -> anyhow::Result<Option<tempfile::NamedTempFile>> {
    let Some(path) = &global.config else {
        return Ok(None);
    };
    if let Some(own) = own {
        anyhow::bail!(
            "both {} (the one configuration) and --config {} were given; keep one",
            path.display(),
            own.display()
        );
    }
    let text = File::read(Some(path))?.section_toml(service)?;
    let mut file = tempfile::NamedTempFile::new()?;
    std::io::Write::write_all(&mut file, text.as_bytes())?;
    Ok(Some(file))
}

pub async fn run(global: &Global, args: ServeArgs) -> anyhow::Result<ExitCode> {
    // The TLS flags are global: `cairn serve <svc> --tls-dir DIR` and `cairn --tls-dir DIR serve`.
    let tls = global.tls.clone();
    match args.service {
        ServeService::ArtifactStore(mut config) => {
            let section = section_file(global, "artifact_store", &config.config)?;
            if let Some(f) = &section {
                config.config = Some(f.path().to_path_buf());
            }
            config.tls = tls;
            let config = config.load()?;
            let listen = config.listen.to_string();
            cairn_server::check_listen_text(&listen, config.tls.is_set(), config.insecure_listen)?;
            let listener = cairn_server::bind(&listen).await?;
            cairn_artifact_store::serve(config, listener, cairn_server::shutdown_signal()).await?;
        }
        ServeService::Ingest(mut config) => {
            let section = section_file(global, "ingest", &config.config)?;
            if let Some(f) = &section {
                config.config = Some(f.path().to_path_buf());
            }
            config.tls = tls;
            let config = config.load()?;
            let listen = config.listen.to_string();
            cairn_server::check_listen_text(&listen, config.tls.is_set(), config.insecure_listen)?;
            let listener = cairn_server::bind(&listen).await?;
            cairn_ingest::serve(config, listener, cairn_server::shutdown_signal()).await?;
        }
        ServeService::SandboxRunner(mut config) => {
            let section = section_file(global, "sandbox_runner", &config.config)?;
            if let Some(f) = &section {
                config.config = Some(f.path().to_path_buf());
            }
            config.tls = tls;
            let config = config.load()?;
            cairn_server::check_listen_text(
                &config.listen,
                config.tls.is_set(),
                config.insecure_listen,
            )?;
            let listener = cairn_server::bind(&config.listen).await?;
            cairn_sandbox_runner::serve(config, listener, cairn_server::shutdown_signal()).await?;
        }
        ServeService::Orchestrator(mut config) => {
            let section = section_file(global, "orchestrator", &config.config)?;
            if let Some(f) = &section {
                config.config = Some(f.path().to_path_buf());
            }
            config.tls = tls;
            let config = config.load()?;
            cairn_server::check_listen_text(
                &config.listen,
                config.tls.is_set(),
                config.insecure_listen,
            )?;
            let listener = cairn_server::bind(&config.listen).await?;
            cairn_orchestrator::serve(config, listener, cairn_server::shutdown_signal()).await?;
        }
        ServeService::Console(args) => {
            let config = console_config(global, &args)?;
            let listener = cairn_server::bind(&config.listen).await?;
            cairn_console::ConsoleServer::new(config, listener)?
                .serve(cairn_server::shutdown_signal())
                .await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The console's settings: its own `--config` file or the `[console]` section of the one
/// configuration, then `CAIRN_CONSOLE_*`, then the flags (the global TLS flags included).
fn console_config(
    global: &Global,
    args: &ConsoleArgs,
) -> anyhow::Result<cairn_console::ConsoleConfig> {
    let file = match (&global.config, &args.config) {
        (Some(one), Some(own)) => anyhow::bail!(
            "both {} (the one configuration) and --config {} were given; keep one",
            one.display(),
            own.display()
        ),
        (_, Some(own)) => File::read_own(own, "console")?,
        (one, None) => File::read(one.as_deref())?,
    };
    let mut flags = settings::tls_flags(global);
    for (key, value) in [
        ("listen", &args.listen),
        ("orchestrator_addr", &args.orchestrator_addr),
        ("store_addr", &args.store_addr),
    ] {
        if let Some(v) = value {
            flags.push((key, v.clone()));
        }
    }
    if args.user_tokens {
        flags.push(("user_tokens", "true".into()));
    }
    if args.secure_cookie {
        flags.push(("secure_cookie", "true".into()));
    }
    let mut config = file
        .section(
            "console",
            settings::console_defaults(global),
            &settings::CONSOLE_ENV,
            &flags,
        )?
        .config;
    config.enabled = true;
    config
        .public_hosts
        .extend(args.public_hosts.iter().cloned());
    if let Some(path) = &args.token_file {
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the console token file {}", path.display()))?;
        let token = token.trim();
        if token.is_empty() {
            anyhow::bail!(
                "the console token file {} is empty: write the token into it (e.g. `openssl rand -hex 16`)",
                path.display()
            );
        }
        config.token = Some(token.to_owned());
    }
    config.check()?;
    Ok(config)
}
