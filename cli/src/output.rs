//! Printing results: JSON on stdout with --json, otherwise short human-readable lines.

use serde::Serialize;

/// Prints `value` as one JSON document on stdout.
pub fn json(value: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// A write to stdout failed: a closed pipe ends the process the way SIGPIPE ends any Unix
/// tool (quietly, killed by the signal); any other error is reported once, exit 1.
#[allow(unsafe_code)]
pub fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        use nix::sys::signal::{raise, signal, SigHandler, Signal};
        // SAFETY: restoring the default action of SIGPIPE installs no handler code.
        unsafe {
            let _ = signal(Signal::SIGPIPE, SigHandler::SigDfl);
        }
        let _ = raise(Signal::SIGPIPE);
        std::process::exit(141);
    }
    eprintln!("error: cannot write to stdout: {e}");
    std::process::exit(i32::from(crate::failure::exit::FAILED));
}

/// Human-readable byte count.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bytes_are_readable() {
        assert_eq!(super::bytes(12), "12 B");
        assert_eq!(super::bytes(1536), "1.5 KiB");
        assert_eq!(super::bytes(3 << 30), "3.0 GiB");
    }
}
