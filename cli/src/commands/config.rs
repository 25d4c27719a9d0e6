//! `cairn config show`: every service's effective configuration and where each value came from.

use std::process::ExitCode;

use serde_json::json;

use crate::cli::{ConfigCommand, Global};
use crate::output;
use crate::settings::Settings;

pub fn run(global: &Global, cmd: ConfigCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ConfigCommand::Show => {
            let settings = Settings::load(global)?;
            let rows = settings.rows()?;
            if global.json {
                let file = settings.file.path.as_ref().map(|p| p.display().to_string());
                output::json(&json!({
                    "file": file,
                    "values": rows
                        .iter()
                        .map(|(section, key, value, source)| json!({
                            "section": section,
                            "key": key,
                            "value": value,
                            "source": source.as_str(),
                        }))
                        .collect::<Vec<_>>(),
                }))?;
            } else {
                match &settings.file.path {
                    Some(p) => println!("# configuration file: {}", p.display()),
                    None => println!("# no configuration file (--config / CAIRN_CONFIG)"),
                }
                let mut section = "";
                for (s, key, value, source) in &rows {
                    if s != section {
                        println!("\n[{s}]");
                        section = s;
                    }
                    println!("{key} = {value}  # {}", source.as_str());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
