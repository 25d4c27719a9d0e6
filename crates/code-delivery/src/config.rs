//! The `[code_delivery]` section. Containers and task directories belong to the sandbox
//! runner: their settings are the runner's (`work_root`, `image`, `container_prefix`,
//! `container_suffix`, `sweep_all_prefixed`), not keys of this section.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArchiveFormat {
    Zip,
    #[serde(rename = "tar.gz")]
    TarGz,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CodeDeliveryConfig {
    /// The code delivery node type is available.
    pub enabled: bool,
    /// `run_bash_command` timeout when the model gives none.
    pub default_command_timeout_seconds: u64,
    /// Most characters of stdout/stderr returned to the model per command.
    pub max_command_output_chars: u64,
    /// `end` archive format when the model gives none.
    pub default_archive_format: ArchiveFormat,
    /// Largest archive `end` may pack.
    pub max_archive_size_mb: u64,
    /// Close the session (container and task directory) when the task ends.
    pub cleanup_on_finish: bool,
    /// Attempts of one LLM request before the task fails (passed as
    /// `AgentRequest::max_attempts`).
    pub llm_max_retries_per_request: u32,
    /// Send the failure notice to the target when an LLM request used all its attempts.
    pub notify_on_llm_failure: bool,
    /// Seconds between checkpoints of a task's session when its node sets no
    /// `checkpoint_every_s`; 0 = none.
    pub checkpoint_every_s: u64,
    /// Milliseconds a task's session may sit idle while the model answers before it is
    /// paused (checkpointed and closed) when its node sets no `pause_after_ms`; 0 = never.
    pub pause_after_ms: u64,
}

impl Default for CodeDeliveryConfig {
    fn default() -> Self {
        CodeDeliveryConfig {
            enabled: true,
            default_command_timeout_seconds: 600,
            max_command_output_chars: 20_000,
            default_archive_format: ArchiveFormat::Zip,
            max_archive_size_mb: 200,
            cleanup_on_finish: true,
            llm_max_retries_per_request: 5,
            notify_on_llm_failure: true,
            checkpoint_every_s: 0,
            pause_after_ms: 0,
        }
    }
}

impl CodeDeliveryConfig {
    /// Checks the section; the message names the key to fix.
    pub fn check(&self) -> Result<(), String> {
        if self.llm_max_retries_per_request == 0 {
            return Err("code_delivery.llm_max_retries_per_request must be at least 1".into());
        }
        if self.default_command_timeout_seconds == 0
            || self.max_archive_size_mb == 0
            || self.max_command_output_chars == 0
        {
            return Err("code_delivery.default_command_timeout_seconds, max_command_output_chars and max_archive_size_mb must be more than 0".into());
        }
        if self.checkpoint_every_s > cairn_graph::code_delivery::MAX_CHECKPOINT_EVERY_S {
            return Err(format!(
                "code_delivery.checkpoint_every_s must be at most {} (a day); 0 turns checkpoints off",
                cairn_graph::code_delivery::MAX_CHECKPOINT_EVERY_S
            ));
        }
        let min = cairn_graph::code_delivery::MIN_PAUSE_AFTER_MS;
        if self.pause_after_ms != 0 && self.pause_after_ms < min {
            return Err(format!(
                "code_delivery.pause_after_ms must be 0 (never) or at least {min} (a second)"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_section_parses() {
        let text = r#"
enabled = true
default_command_timeout_seconds = 600
max_command_output_chars = 20000
default_archive_format = "tar.gz"
max_archive_size_mb = 200
cleanup_on_finish = true
llm_max_retries_per_request = 5
notify_on_llm_failure = true
checkpoint_every_s = 0
pause_after_ms = 0
"#;
        let c: CodeDeliveryConfig = toml::from_str(text).unwrap();
        assert_eq!(c.default_archive_format, ArchiveFormat::TarGz);
        assert_eq!(
            c,
            CodeDeliveryConfig {
                default_archive_format: ArchiveFormat::TarGz,
                ..Default::default()
            }
        );
        assert!(toml::from_str::<CodeDeliveryConfig>("nope = 1").is_err());
        // Runner settings are the runner's: here they are unknown keys, not silently ignored.
        for key in [
            "task_root = \"x\"",
            "docker_image = \"ubuntu:24.04\"",
            "container_name_prefix = \"p\"",
            "container_name_suffix = \"s\"",
            "cleanup_on_start = true",
        ] {
            assert!(toml::from_str::<CodeDeliveryConfig>(key).is_err(), "{key}");
        }
        let round = toml::to_string(&CodeDeliveryConfig::default()).unwrap();
        assert_eq!(
            toml::from_str::<CodeDeliveryConfig>(&round).unwrap(),
            CodeDeliveryConfig::default()
        );
    }
}
