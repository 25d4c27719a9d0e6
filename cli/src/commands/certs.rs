//! `cairn certs`: the PKI for mutual TLS (a CA and one certificate per identity).

use std::process::ExitCode;

use anyhow::Context;
use cairn_server::pki::{self, PkiSpec};

use crate::cli::{CertsCommand, Global};

pub async fn run(global: &Global, cmd: CertsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        CertsCommand::Init(args) => {
            let mut names = args.names;
            if args.if_missing && args.out.join("ca.pem").exists() {
                if names.is_empty() {
                    names = cairn_server::tls::IDENTITIES.map(String::from).to_vec();
                }
                names.retain(|id| !args.out.join(format!("{id}.pem")).exists());
                if names.is_empty() {
                    eprintln!(
                        "{} already holds a PKI (ca.pem) with every identity asked for; nothing written",
                        args.out.display()
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                eprintln!(
                    "{} holds a PKI (ca.pem); its CA issues the identities it lacks: {}",
                    args.out.display(),
                    names.join(", ")
                );
            }
            let spec = PkiSpec {
                days: args.days,
                dns: args.dns,
                identities: names,
                force: args.force,
                split: args.split,
                owner: args.owner,
                ..PkiSpec::new(args.out)
            };
            let written = pki::init(&spec)?;
            print_files(global, &written)?;
            if !global.json {
                eprintln!(
                    "PKI written to {}: give it to every service and client with --tls-dir {} (or CAIRN_TLS_DIR); keep ca.key offline",
                    spec.out.display(),
                    spec.out.display()
                );
            }
        }
        CertsCommand::Renew(args) => {
            let written = pki::renew(&args.dir, args.days)?;
            print_files(global, &written)?;
            if !global.json {
                eprintln!(
                    "{} certificates renewed for {} days from the CA in {}; running services pick them up within seconds (or send them SIGHUP); clients on restart",
                    written.len(),
                    args.days,
                    args.dir.display()
                );
            }
        }
        CertsCommand::Show { cert, served } => {
            let info = match (cert, served) {
                (Some(cert), _) => pki::describe(&cert)?,
                (None, Some(addr)) => {
                    let tls = global
                        .tls
                        .config()
                        .load(crate::embedded::IDENTITY)
                        .context("reading the TLS files (--tls-dir / CAIRN_TLS_DIR)")?
                        .context("--served dials with your TLS settings: give --tls-dir (or CAIRN_TLS_DIR) with the cli certificate")?;
                    let name = global.tls_server_name.as_deref();
                    let der = cairn_server::served_certificate(&addr, &tls, name).await?;
                    pki::describe_der(&der)?
                }
                (None, None) => anyhow::bail!("name a certificate file, or --served HOST:PORT"),
            };
            if global.json {
                crate::output::json(&serde_json::json!({
                    "identity": info.identity,
                    "names": info.names,
                    "not_before": info.not_before,
                    "not_after": info.not_after,
                    "serial": info.serial,
                    "issuer": info.issuer,
                }))?;
            } else {
                println!(
                    "identity: {}",
                    info.identity
                        .as_deref()
                        .unwrap_or("(none: not a cairn certificate)")
                );
                println!("names: {}", info.names.join(", "));
                println!("valid: {} .. {}", info.not_before, info.not_after);
                println!("serial: {}", info.serial);
                println!("issuer: {}", info.issuer);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The files written: one a line, or `{"files": [...]}` with --json.
fn print_files(global: &Global, written: &[std::path::PathBuf]) -> anyhow::Result<()> {
    if global.json {
        let files: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
        crate::output::json(&serde_json::json!({ "files": files }))?;
    } else {
        for path in written {
            println!("{}", path.display());
        }
    }
    Ok(())
}
