//! The seek index of a run's event log: `.cairn/runs/<run>/events.idx` beside `events.jsonl`,
//! one 16-byte record (seq, byte offset of its line; little-endian u64s) for every event whose
//! seq is 1 modulo [`STRIDE`]. A reader from seq N starts at the line of the last record at
//! or before N instead of the log's start.
//!
//! It is a hint, never trusted: a record is used only after the line at its offset is read back
//! and carries its seq (else an earlier record is tried, then the start of the log). Records
//! are appended after the events they point at are durable, without an fsync; when a log is
//! first opened, records beyond the log, a torn record or a last record that does not verify
//! are cut off, and the records the log has lines for but the index lacks (a crash between the
//! two writes, a deleted index) are added by reading the log from the last good record.
//!
//! May depend on: nothing in the crate.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

/// Events between two records.
pub const STRIDE: u64 = 256;
const RECORD: usize = 16;
/// Longest line read back to verify a record.
const MAX_PROBE: usize = 64 << 10;

/// Whether the event `seq` gets a record.
pub fn is_mark(seq: u64) -> bool {
    seq % STRIDE == 1
}

/// One record's bytes.
pub fn encode(seq: u64, offset: u64) -> [u8; RECORD] {
    let mut out = [0u8; RECORD];
    out[..8].copy_from_slice(&seq.to_le_bytes());
    out[8..].copy_from_slice(&offset.to_le_bytes());
    out
}

/// The complete records of an index file (a torn last record is left out).
pub fn read_marks(index: &File) -> std::io::Result<Vec<(u64, u64)>> {
    let len = index.metadata()?.len() as usize;
    let mut bytes = vec![0u8; len - len % RECORD];
    index.read_exact_at(&mut bytes, 0)?;
    Ok(bytes
        .chunks_exact(RECORD)
        .map(|r| {
            let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
            (word(&r[..8]), word(&r[8..]))
        })
        .collect())
}

/// The seq of an event line (the fixed `"seq":` field the store writes second; any other
/// spelling parsed as JSON).
pub fn seq_of(line: &[u8]) -> Option<u64> {
    let fast = line
        .windows(7)
        .take(96)
        .position(|w| w == b",\"seq\":")
        .and_then(|at| {
            let digits: &[u8] = &line[at + 7..];
            let end = digits.iter().position(|b| !b.is_ascii_digit())?;
            std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
        });
    fast.or_else(|| {
        let v: serde_json::Value = serde_json::from_slice(line).ok()?;
        v.get("seq")?.as_u64()
    })
}

/// Whether the line at `offset` of `log` (holding `len` bytes of whole lines) starts there
/// and carries `seq`.
pub fn verify(log: &File, len: u64, seq: u64, offset: u64) -> bool {
    if offset >= len {
        return false;
    }
    if offset > 0 {
        let mut before = [0u8; 1];
        if log.read_exact_at(&mut before, offset - 1).is_err() || before[0] != b'\n' {
            return false;
        }
    }
    let want = (len - offset).min(MAX_PROBE as u64) as usize;
    let mut buf = vec![0u8; want];
    if log.read_exact_at(&mut buf, offset).is_err() {
        return false;
    }
    let line = match buf.iter().position(|b| *b == b'\n') {
        Some(end) => &buf[..end],
        None => &buf[..],
    };
    seq_of(line) == Some(seq)
}

/// Where a reader from `from` starts: the offset and seq of the last verified record at or
/// before `from`, or (0, 1) (the log's start).
pub fn start(log: &File, len: u64, marks: &[(u64, u64)], from: u64) -> (u64, u64) {
    let below = marks.partition_point(|(seq, _)| *seq <= from);
    marks[..below]
        .iter()
        .rev()
        .find(|(seq, offset)| verify(log, len, *seq, *offset))
        .map_or((0, 1), |(seq, offset)| (*offset, *seq))
}

/// Brings `index` in line with `log` (`len` bytes of whole lines, last seq `last_seq`) when
/// the log is opened: cuts records that do not hold, adds the missing ones. Returns how many
/// records it added.
pub fn repair(index: &File, log: &File, len: u64, last_seq: u64) -> std::io::Result<usize> {
    let marks = read_marks(index)?;
    // The sorted prefix within the log; then the last one that verifies.
    let mut keep = marks
        .windows(2)
        .position(|w| w[1].0 <= w[0].0 || w[1].1 <= w[0].1)
        .map_or(marks.len(), |i| i + 1);
    keep = marks[..keep].partition_point(|(seq, offset)| *seq <= last_seq && *offset < len);
    while keep > 0 && !verify(log, len, marks[keep - 1].0, marks[keep - 1].1) {
        keep -= 1;
    }
    if (keep * RECORD) as u64 != index.metadata()?.len() {
        index.set_len((keep * RECORD) as u64)?;
    }
    let (mut offset, mut seq) = match keep {
        0 => (0, 0),
        n => (marks[n - 1].1, marks[n - 1].0),
    };
    if seq + STRIDE > last_seq && keep > 0 {
        return Ok(0);
    }
    // Read on from the last good record (or the start) and record every mark after it.
    let mut reader = BufReader::with_capacity(1 << 20, log.try_clone()?);
    reader.seek(SeekFrom::Start(offset))?;
    let mut added = Vec::new();
    let mut line = Vec::new();
    while offset < len {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 || line.last() != Some(&b'\n') {
            break;
        }
        if let Some(s) = seq_of(&line[..n - 1]) {
            if is_mark(s) && s > seq {
                added.extend_from_slice(&encode(s, offset));
                seq = s;
            }
        }
        offset += n as u64;
    }
    // The index is opened O_APPEND: this lands after the records kept.
    std::io::Write::write_all(&mut &*index, &added)?;
    Ok(added.len() / RECORD)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn log_of(n: u64) -> (tempfile::TempDir, File, u64) {
        let tmp = tempfile::tempdir().unwrap();
        let mut text = String::new();
        for seq in 1..=n {
            text.push_str(&format!(
                "{{\"ts\":\"2026-01-01T00:00:00Z\",\"seq\":{seq},\"type\":\"t\",\"pad\":\"{}\"}}\n",
                "x".repeat((seq % 7) as usize)
            ));
        }
        let path = tmp.path().join("events.jsonl");
        std::fs::write(&path, &text).unwrap();
        let file = File::open(&path).unwrap();
        (tmp, file, text.len() as u64)
    }

    fn index_in(tmp: &tempfile::TempDir) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(tmp.path().join("events.idx"))
            .unwrap()
    }

    #[test]
    fn seq_is_read_fast_or_as_json() {
        assert_eq!(seq_of(br#"{"ts":"x","seq":42,"type":"t"}"#), Some(42));
        assert_eq!(seq_of(br#"{"type":"t","seq":7}"#), Some(7));
        assert_eq!(seq_of(b"not json"), None);
    }

    #[test]
    fn a_missing_index_is_built_and_each_record_verifies() {
        let (tmp, log, len) = log_of(1000);
        let index = index_in(&tmp);
        assert_eq!(repair(&index, &log, len, 1000).unwrap(), 4);
        let marks = read_marks(&index).unwrap();
        assert_eq!(
            marks.iter().map(|m| m.0).collect::<Vec<_>>(),
            [1, 257, 513, 769]
        );
        assert!(marks.iter().all(|(s, o)| verify(&log, len, *s, *o)));
        assert_eq!(start(&log, len, &marks, 600).1, 513);
        assert_eq!(start(&log, len, &marks, 256).1, 1);
        // Up to date: nothing to add.
        assert_eq!(repair(&index, &log, len, 1000).unwrap(), 0);
    }

    #[test]
    fn bad_records_are_skipped_when_reading_and_cut_when_repairing() {
        let (tmp, log, len) = log_of(1000);
        let index = index_in(&tmp);
        repair(&index, &log, len, 1000).unwrap();
        let good = read_marks(&index).unwrap();
        // Record of 513 points one byte off; a torn record follows.
        index.set_len(2 * RECORD as u64).unwrap();
        for bytes in [
            &encode(513, good[2].1 + 1)[..],
            &encode(good[3].0, good[3].1)[..],
            &[1, 2, 3][..],
        ] {
            std::io::Write::write_all(&mut &index, bytes).unwrap();
        }
        let marks = read_marks(&index).unwrap();
        assert_eq!(marks.len(), 4);
        // A reader from 600 falls back to 257, the last record that verifies.
        assert_eq!(start(&log, len, &marks, 600).1, 257);
        // The last record (769) still verifies: repair keeps the sorted prefix as it is.
        repair(&index, &log, len, 1000).unwrap();
        assert_eq!(read_marks(&index).unwrap().len(), 4);
        // A last record pointing past the log is cut, so is the bad one before it; both are
        // found again from the last good record.
        index.set_len(3 * RECORD as u64).unwrap();
        std::io::Write::write_all(&mut &index, &encode(769, len + 10)).unwrap();
        assert_eq!(repair(&index, &log, len, 1000).unwrap(), 2);
        assert_eq!(read_marks(&index).unwrap(), good);
        // Garbage throughout: rebuilt from the start.
        index.set_len(0).unwrap();
        std::io::Write::write_all(&mut &index, &[0xff; 64]).unwrap();
        repair(&index, &log, len, 1000).unwrap();
        assert_eq!(read_marks(&index).unwrap(), good);
    }
}
