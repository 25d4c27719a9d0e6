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
            let (info, served) = match (cert, served) {
                (Some(cert), _) => (pki::describe(&cert)?, None),
                (None, Some(addr)) => {
                    let tls = global
                        .tls
                        .config()
                        .load(crate::embedded::IDENTITY)
                        .context("reading the TLS files (--tls-dir / CAIRN_TLS_DIR)")?
                        .context("--served dials with your TLS settings: give --tls-dir (or CAIRN_TLS_DIR) with the cli certificate")?;
                    let name = global.tls_server_name.as_deref();
                    let der = cairn_server::served_certificate(&addr, &tls, name).await?;
                    // TLS 1.3 ends the client's handshake before the server has checked the
                    // client's certificate: only a call answered shows it was accepted.
                    let refused = accepted_by(&addr, &tls, name).await.err();
                    (pki::describe_der(&der)?, Some(refused))
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
                    "accepted": served.as_ref().map(Option::is_none),
                    "refused_because": served.as_ref().and_then(|r| r.as_deref()),
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
                match &served {
                    Some(None) => println!("your certificate: accepted"),
                    Some(Some(why)) => println!("your certificate: refused ({why})"),
                    None => {}
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether the service at `addr` answers a call made with `tls` (its health check): `Err`
/// with the reason when the connection is refused, e.g. a certificate of a CA it no longer
/// trusts. An answer of any status means the TLS layer accepted the certificate.
async fn accepted_by(
    addr: &str,
    tls: &cairn_server::Tls,
    name: Option<&str>,
) -> Result<(), String> {
    let channel = cairn_server::connect_named(addr, Some(tls), name).map_err(|e| e.to_string())?;
    match cairn_server::serving(channel, "", std::time::Duration::from_secs(5)).await {
        Ok(_) => Ok(()),
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::Cancelled
                    | tonic::Code::DeadlineExceeded
            ) =>
        {
            Err(s.message().to_owned())
        }
        Err(_) => Ok(()),
    }
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
