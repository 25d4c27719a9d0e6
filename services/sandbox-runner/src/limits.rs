//! Resource limits: the server's defaults and maxima, and a request's limits resolved against
//! them (0 = default; a request may lower a limit, never raise it above the maximum).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

const MIB: u64 = 1024 * 1024;

/// The smallest memory limit a sandbox gets: Docker refuses less than 6 MiB, and no
/// interpreter starts in less on the local backend either.
pub const MIN_MEMORY_BYTES: u64 = 6 * MIB;

/// The smallest `max_total_output_bytes` a runner accepts.
pub const MIN_AREA_BYTES: u64 = MIB;

/// Every limit of sandbox.proto `Limits`, resolved (no zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub timeout_ms: u64,
    pub memory_bytes: u64,
    pub cpu_millis: u64,
    pub pids: u64,
    pub max_input_files: u64,
    pub max_input_bytes: u64,
    pub max_output_files: u64,
    pub max_output_bytes: u64,
    pub max_stdout_bytes: u64,
    pub max_stderr_bytes: u64,
}

impl Limits {
    /// Applied when neither the config nor the request says otherwise.
    pub const DEFAULTS: Limits = Limits {
        timeout_ms: 30_000,
        memory_bytes: 512 * MIB,
        cpu_millis: 1000,
        pids: 256,
        max_input_files: 1000,
        max_input_bytes: 16 * MIB,
        max_output_files: 1000,
        max_output_bytes: 16 * MIB,
        max_stdout_bytes: MIB,
        max_stderr_bytes: MIB,
    };

    /// Ceilings a request may not exceed. Outputs and stdout/stderr travel in one reply, so
    /// their sum stays below cairn_server::MAX_MESSAGE_BYTES.
    pub const MAXIMA: Limits = Limits {
        timeout_ms: 3_600_000,
        memory_bytes: 8 * 1024 * MIB,
        cpu_millis: 8000,
        pids: 4096,
        max_input_files: 10_000,
        max_input_bytes: 32 * MIB,
        max_output_files: 10_000,
        max_output_bytes: 32 * MIB,
        max_stdout_bytes: 8 * MIB,
        max_stderr_bytes: 8 * MIB,
    };

    fn fields(&self) -> [(&'static str, u64); 10] {
        [
            ("timeout_ms", self.timeout_ms),
            ("memory_bytes", self.memory_bytes),
            ("cpu_millis", self.cpu_millis),
            ("pids", self.pids),
            ("max_input_files", self.max_input_files),
            ("max_input_bytes", self.max_input_bytes),
            ("max_output_files", self.max_output_files),
            ("max_output_bytes", self.max_output_bytes),
            ("max_stdout_bytes", self.max_stdout_bytes),
            ("max_stderr_bytes", self.max_stderr_bytes),
        ]
    }

    /// Checks that these defaults are positive and within `max` (config load).
    pub fn check_against(&self, max: &Limits) -> Result<()> {
        for ((name, value), (_, ceiling)) in self.fields().into_iter().zip(max.fields()) {
            if value == 0 || ceiling == 0 {
                return Err(Error::Config(format!(
                    "defaults.{name} and max.{name} must be positive"
                )));
            }
            if value > ceiling {
                return Err(Error::Config(format!(
                    "defaults.{name} = {value} is above max.{name} = {ceiling}: lower the default or raise the maximum"
                )));
            }
        }
        let reply = max.max_output_bytes + max.max_stdout_bytes + max.max_stderr_bytes;
        if reply as usize > cairn_server::MAX_MESSAGE_BYTES - MIB as usize {
            return Err(Error::Config(format!(
                "max.max_output_bytes + max.max_stdout_bytes + max.max_stderr_bytes = {reply} does not fit one gRPC reply ({} bytes)",
                cairn_server::MAX_MESSAGE_BYTES
            )));
        }
        Ok(())
    }

    /// A request's limits: 0 takes the default, above the maximum is InvalidArgument.
    pub fn resolve(
        requested: Option<&cairn_proto::Limits>,
        defaults: &Limits,
        max: &Limits,
    ) -> Result<Limits> {
        let Some(r) = requested else {
            return Ok(*defaults);
        };
        let pick = |name: &'static str, req: u64, default: u64, ceiling: u64| -> Result<u64> {
            match req {
                0 => Ok(default),
                v if name == "memory_bytes" && v < MIN_MEMORY_BYTES => Err(Error::LimitBelowMin {
                    name,
                    requested: v,
                    min: MIN_MEMORY_BYTES,
                }),
                v if v > ceiling => Err(Error::LimitAboveMax {
                    name,
                    requested: v,
                    max: ceiling,
                }),
                v => Ok(v),
            }
        };
        Ok(Limits {
            timeout_ms: pick(
                "timeout_ms",
                r.timeout_ms,
                defaults.timeout_ms,
                max.timeout_ms,
            )?,
            memory_bytes: pick(
                "memory_bytes",
                r.memory_bytes,
                defaults.memory_bytes,
                max.memory_bytes,
            )?,
            cpu_millis: pick(
                "cpu_millis",
                r.cpu_millis,
                defaults.cpu_millis,
                max.cpu_millis,
            )?,
            pids: pick("pids", r.pids, defaults.pids, max.pids)?,
            max_input_files: pick(
                "max_input_files",
                r.max_input_files,
                defaults.max_input_files,
                max.max_input_files,
            )?,
            max_input_bytes: pick(
                "max_input_bytes",
                r.max_input_bytes,
                defaults.max_input_bytes,
                max.max_input_bytes,
            )?,
            max_output_files: pick(
                "max_output_files",
                r.max_output_files,
                defaults.max_output_files,
                max.max_output_files,
            )?,
            max_output_bytes: pick(
                "max_output_bytes",
                r.max_output_bytes,
                defaults.max_output_bytes,
                max.max_output_bytes,
            )?,
            max_stdout_bytes: pick(
                "max_stdout_bytes",
                r.max_stdout_bytes,
                defaults.max_stdout_bytes,
                max.max_stdout_bytes,
            )?,
            max_stderr_bytes: pick(
                "max_stderr_bytes",
                r.max_stderr_bytes,
                defaults.max_stderr_bytes,
                max.max_stderr_bytes,
            )?,
        })
    }

    pub fn to_proto(self) -> cairn_proto::Limits {
        cairn_proto::Limits {
            timeout_ms: self.timeout_ms,
            memory_bytes: self.memory_bytes,
            cpu_millis: self.cpu_millis,
            pids: self.pids,
            max_input_files: self.max_input_files,
            max_input_bytes: self.max_input_bytes,
            max_output_files: self.max_output_files,
            max_output_bytes: self.max_output_bytes,
            max_stdout_bytes: self.max_stdout_bytes,
            max_stderr_bytes: self.max_stderr_bytes,
        }
    }
}

/// A partial `[defaults]` or `[max]` table of the config file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsTable {
    pub timeout_ms: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub cpu_millis: Option<u64>,
    pub pids: Option<u64>,
    pub max_input_files: Option<u64>,
    pub max_input_bytes: Option<u64>,
    pub max_output_files: Option<u64>,
    pub max_output_bytes: Option<u64>,
    pub max_stdout_bytes: Option<u64>,
    pub max_stderr_bytes: Option<u64>,
}

impl LimitsTable {
    /// `base` with this table's values laid over it.
    pub fn over(&self, base: Limits) -> Limits {
        Limits {
            timeout_ms: self.timeout_ms.unwrap_or(base.timeout_ms),
            memory_bytes: self.memory_bytes.unwrap_or(base.memory_bytes),
            cpu_millis: self.cpu_millis.unwrap_or(base.cpu_millis),
            pids: self.pids.unwrap_or(base.pids),
            max_input_files: self.max_input_files.unwrap_or(base.max_input_files),
            max_input_bytes: self.max_input_bytes.unwrap_or(base.max_input_bytes),
            max_output_files: self.max_output_files.unwrap_or(base.max_output_files),
            max_output_bytes: self.max_output_bytes.unwrap_or(base.max_output_bytes),
            max_stdout_bytes: self.max_stdout_bytes.unwrap_or(base.max_stdout_bytes),
            max_stderr_bytes: self.max_stderr_bytes.unwrap_or(base.max_stderr_bytes),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn zero_takes_default_and_above_max_is_refused() {
        let req = cairn_proto::Limits {
            timeout_ms: 0,
            pids: 10,
            ..Default::default()
        };
        let l = Limits::resolve(Some(&req), &Limits::DEFAULTS, &Limits::MAXIMA).unwrap();
        assert_eq!(l.timeout_ms, Limits::DEFAULTS.timeout_ms);
        assert_eq!(l.pids, 10);
        let req = cairn_proto::Limits {
            memory_bytes: Limits::MAXIMA.memory_bytes + 1,
            ..Default::default()
        };
        let err = Limits::resolve(Some(&req), &Limits::DEFAULTS, &Limits::MAXIMA).unwrap_err();
        assert!(err.to_string().contains("memory_bytes"), "{err}");
    }

    #[test]
    fn defaults_fit_maxima() {
        Limits::DEFAULTS.check_against(&Limits::MAXIMA).unwrap();
    }
}
