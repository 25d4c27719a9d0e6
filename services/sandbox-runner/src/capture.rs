//! Byte-capped capture of a stdout/stderr stream: keeps the first `cap` bytes, counts the rest,
//! never grows past the cap whatever the program writes. Bytes, not text: invalid UTF-8 is kept.

#[derive(Debug)]
pub struct Capture {
    kept: Vec<u8>,
    cap: usize,
    seen: u64,
}

impl Capture {
    pub fn new(cap: u64) -> Capture {
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        Capture {
            kept: Vec::with_capacity(cap.min(64 * 1024)),
            cap,
            seen: 0,
        }
    }

    /// Adds `data`; returns the part that was kept (for live streaming).
    pub fn push<'a>(&mut self, data: &'a [u8]) -> &'a [u8] {
        self.seen += data.len() as u64;
        let room = self.cap.saturating_sub(self.kept.len());
        let take = &data[..data.len().min(room)];
        self.kept.extend_from_slice(take);
        take
    }

    /// More was written than kept.
    pub fn truncated(&self) -> bool {
        self.seen > self.kept.len() as u64
    }

    /// Bytes the program wrote in all.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Records that the program wrote `total` bytes in all, when fewer reached this capture
    /// (a sandbox agent that forwards only the first cap bytes and counts the rest).
    pub fn wrote(&mut self, total: u64) {
        self.seen = self.seen.max(total);
    }

    pub fn bytes(&self) -> &[u8] {
        &self.kept
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.kept
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::Capture;

    #[test]
    fn keeps_the_first_cap_bytes_and_flags_the_rest() {
        let mut c = Capture::new(5);
        assert_eq!(c.push(b"abc"), b"abc");
        assert_eq!(c.push(b"defg"), b"de");
        assert_eq!(c.push(b"h"), b"");
        assert!(c.truncated());
        assert_eq!(c.seen(), 8);
        assert_eq!(c.into_bytes(), b"abcde");
    }

    #[test]
    fn a_reported_total_counts_bytes_that_never_arrived() {
        let mut c = Capture::new(4);
        c.push(b"abcde");
        c.wrote(50 << 20);
        assert_eq!(c.seen(), 50 << 20);
        assert!(c.truncated());
        // A smaller report never hides bytes that did arrive.
        c.wrote(1);
        assert_eq!(c.seen(), 50 << 20);
        assert_eq!(c.bytes(), b"abcd");
    }
}
