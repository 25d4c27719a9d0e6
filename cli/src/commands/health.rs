//! `cairn health`: the gRPC health protocol against --addr (used by container health checks).

use std::process::ExitCode;

use anyhow::Context;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::cli::{Global, HealthArgs};

pub async fn run(global: &Global, args: HealthArgs) -> anyhow::Result<ExitCode> {
    if let Some(url) = &args.http {
        return http(global, url).await;
    }
    let Some(addr) = &global.addr else {
        anyhow::bail!("cairn health needs --addr (or CAIRN_ADDR): the address to check");
    };
    let tls = global.tls.config().load(crate::embedded::IDENTITY)?;
    let mut client = HealthClient::new(cairn_server::connect_tls(addr, tls.as_ref())?);
    let status = client
        .check(HealthCheckRequest {
            service: args.service.clone(),
        })
        .await?
        .into_inner()
        .status();
    let serving = status == ServingStatus::Serving;
    if global.json {
        crate::output::json(
            &serde_json::json!({"addr": addr, "service": args.service, "status": status.as_str_name()}),
        )?;
    } else {
        println!(
            "{addr} {}: {}",
            if args.service.is_empty() {
                "(server)"
            } else {
                &args.service
            },
            status.as_str_name()
        );
    }
    Ok(if serving {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `--http URL`: one GET; 2xx is healthy. (Container images have no curl; probes use this.)
async fn http(global: &Global, url: &str) -> anyhow::Result<ExitCode> {
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(3))
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let status = client
        .get(url)
        .send()
        .await
        .with_context(|| format!("no HTTP answer from {url}"))?
        .status();
    if global.json {
        crate::output::json(&serde_json::json!({"url": url, "status": status.as_u16()}))?;
    } else {
        println!("{url}: {status}");
    }
    Ok(if status.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
