//! Timestamps as the store writes them: RFC 3339 UTC with milliseconds.
//!
//! May depend on: nothing of the crate.

/// Now as RFC 3339 UTC with milliseconds ("2026-01-01T00:00:00.000Z").
pub fn timestamp_now() -> String {
    timestamp(time::OffsetDateTime::now_utc())
}

/// A time as RFC 3339 UTC with milliseconds.
pub fn timestamp(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// A stat's modification time as RFC 3339.
pub fn mtime_of(st: &rustix::fs::Stat) -> String {
    let nanos = i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec as i64);
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .map(timestamp)
        .unwrap_or_default()
}
