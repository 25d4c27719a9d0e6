//! The check of a streamed payload: against its header's size and sha256 or, when the header
//! has none (the runner sends the bytes as it makes them), against the SnapshotEnd that
//! follows the bytes. Used by the runner that takes a snapshot in and by the callers that
//! store one.

use cairn_proto::v1::{SnapshotEnd, SnapshotHeader};
use cairn_sha256::Sha256;

use crate::Error;

pub struct Check {
    hash: Sha256,
    size: u64,
    end: Option<SnapshotEnd>,
}

impl Default for Check {
    fn default() -> Self {
        Self::new()
    }
}

impl Check {
    pub fn new() -> Check {
        Check {
            hash: Sha256::new(),
            size: 0,
            end: None,
        }
    }

    /// Payload bytes so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// A payload chunk; refused after the end.
    pub fn chunk(&mut self, c: &[u8]) -> Result<(), Error> {
        if self.end.is_some() {
            return Err(Error::Corrupt(
                "snapshot bytes came after the snapshot's end: it is not one snapshot".into(),
            ));
        }
        self.hash.update(c);
        self.size += c.len() as u64;
        Ok(())
    }

    /// The SnapshotEnd; refused twice.
    pub fn end(&mut self, e: SnapshotEnd) -> Result<(), Error> {
        if self.end.replace(e).is_some() {
            return Err(Error::Corrupt(
                "the snapshot's end came twice: it is not one snapshot".into(),
            ));
        }
        Ok(())
    }

    /// What the payload is, when it matches: the header gets the end's size and sha256 when
    /// it had none.
    pub fn finish(self, header: &mut SnapshotHeader) -> Result<SnapshotEnd, Error> {
        let end = match (header.sha256.is_empty(), self.end) {
            (true, None) => {
                return Err(Error::Corrupt(format!(
                    "the snapshot stream ended after {} bytes without the snapshot's end: it was cut short, and is no snapshot; send it whole",
                    self.size
                )))
            }
            (true, Some(e)) => {
                crate::is_sha256(&e.sha256, "end")?;
                e
            }
            (false, Some(e))
                if (e.sha256.as_str(), e.size_bytes)
                    != (header.sha256.as_str(), header.size_bytes) =>
            {
                return Err(Error::Corrupt(
                    "the snapshot's end disagrees with its header: it is not one snapshot".into(),
                ))
            }
            (false, _) => SnapshotEnd {
                sha256: header.sha256.clone(),
                size_bytes: header.size_bytes,
            },
        };
        let sha = self.hash.finish_hex();
        if self.size != end.size_bytes || sha != end.sha256 {
            return Err(Error::Corrupt(format!(
                "the snapshot arrived as {} bytes with sha256 {sha} and was sent as {} bytes with sha256 {}: it was cut short, altered or damaged; nothing was resumed from it",
                self.size, end.size_bytes, end.sha256
            )));
        }
        header.sha256.clone_from(&end.sha256);
        header.size_bytes = end.size_bytes;
        Ok(end)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn end_of(bytes: &[u8]) -> SnapshotEnd {
        let mut h = Sha256::new();
        h.update(bytes);
        SnapshotEnd {
            sha256: h.finish_hex(),
            size_bytes: bytes.len() as u64,
        }
    }

    fn run(
        header: &mut SnapshotHeader,
        chunks: &[&[u8]],
        end: Option<SnapshotEnd>,
    ) -> Result<SnapshotEnd, Error> {
        let mut c = Check::new();
        for ch in chunks {
            c.chunk(ch)?;
        }
        if let Some(e) = end {
            c.end(e)?;
        }
        c.finish(header)
    }

    /// A header, the chunks that follow it, and the end after them.
    type Case<'a> = (SnapshotHeader, &'a [&'a [u8]], Option<SnapshotEnd>);

    #[test]
    fn a_payload_matches_its_end_or_its_header_and_nothing_else() {
        let good = end_of(b"abcdef");
        // Streamed: the end fills the header.
        let mut h = SnapshotHeader::default();
        assert_eq!(
            run(&mut h, &[b"abc", b"def"], Some(good.clone())).unwrap(),
            good
        );
        assert_eq!((h.sha256.as_str(), h.size_bytes), (good.sha256.as_str(), 6));
        // The digest in the header, no end, or the same end.
        let mut h2 = h.clone();
        assert!(run(&mut h2, &[b"abcdef"], None).is_ok());
        assert!(run(&mut h.clone(), &[b"abcdef"], Some(good.clone())).is_ok());
        // Refused: no end, other bytes, fewer bytes, an end against the header, bad hex.
        let cases: Vec<Case<'_>> = vec![
            (SnapshotHeader::default(), &[b"abcdef"], None),
            (SnapshotHeader::default(), &[b"abcdeF"], Some(good.clone())),
            (SnapshotHeader::default(), &[b"abcde"], Some(good.clone())),
            (h.clone(), &[b"abcdef"], Some(end_of(b"x"))),
            (h.clone(), &[b"abcdeX"], None),
            (
                SnapshotHeader::default(),
                &[b"abcdef"],
                Some(SnapshotEnd {
                    sha256: "zz".into(),
                    size_bytes: 6,
                }),
            ),
        ];
        for (mut header, chunks, end) in cases {
            assert!(
                matches!(run(&mut header, chunks, end), Err(Error::Corrupt(_))),
                "{chunks:?}"
            );
        }
    }

    #[test]
    fn bytes_after_the_end_and_a_second_end_are_refused() {
        let mut c = Check::new();
        c.chunk(b"ab").unwrap();
        c.end(end_of(b"ab")).unwrap();
        assert!(matches!(c.chunk(b"c"), Err(Error::Corrupt(_))));
        assert!(matches!(c.end(end_of(b"ab")), Err(Error::Corrupt(_))));
    }
}
