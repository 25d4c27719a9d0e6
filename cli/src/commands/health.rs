//! `cairn health`: the gRPC health protocol against --addr (used by container health checks).

use std::process::ExitCode;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::cli::{Global, HealthArgs};

pub async fn run(global: &Global, args: HealthArgs) -> anyhow::Result<ExitCode> {
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
