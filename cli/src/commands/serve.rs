//! `cairn serve <service>`: one service standalone, configured like its own binary: its own
//! `--config` file, or its section of the one configuration (`cairn --config FILE serve ...`),
//! then its environment variables, then flags.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::{Global, ServeArgs, ServeService};
use crate::settings::File;

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
    }
    Ok(ExitCode::SUCCESS)
}
