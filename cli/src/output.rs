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

/// How long ago an RFC 3339 time was, at `now`, in its largest whole unit ("40 s", "5 min",
/// "3 h", "12 d"); "" when the time does not parse.
pub fn age(at: &str, now: time::OffsetDateTime) -> String {
    let Ok(t) = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
    else {
        return String::new();
    };
    let s = (now - t).whole_seconds().max(0);
    match s {
        0..=119 => format!("{s} s"),
        120..=7_199 => format!("{} min", s / 60),
        7_200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn ages_are_readable() {
        let now = time::OffsetDateTime::parse(
            "2026-11-29T10:00:00Z",
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        assert_eq!(super::age("2026-11-29T09:59:20Z", now), "40 s");
        assert_eq!(super::age("2026-11-29T09:55:00Z", now), "5 min");
        assert_eq!(super::age("2026-11-29T07:00:00Z", now), "3 h");
        assert_eq!(super::age("2026-11-17T10:00:00Z", now), "12 d");
        // A clock behind the store's reads as now; a missing time as nothing.
        assert_eq!(super::age("2026-11-29T10:00:05Z", now), "0 s");
        assert_eq!(super::age("", now), "");
    }

    #[test]
    fn bytes_are_readable() {
        assert_eq!(super::bytes(12), "12 B");
        assert_eq!(super::bytes(1536), "1.5 KiB");
        assert_eq!(super::bytes(3 << 30), "3.0 GiB");
    }
}
