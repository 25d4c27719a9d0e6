//! Session snapshots as callers keep them: one file, `cairn-snapshot` magic, the
//! SnapshotHeader (length-prefixed protobuf), the payload the runner streamed and, when the
//! header has no sha256 (the runner sends its bytes as it makes them), a fixed-size trailer
//! with the payload's size and sha256 (the SnapshotEnd). `save` writes a PauseSession stream
//! into such a file, checking the payload against the size and sha256 as it arrives; `parts`
//! turns such a file back into ResumeSession's stream. The runner checks the bytes again: a
//! damaged file is never resumed.

use bytes::{BufMut, Bytes, BytesMut};
use cairn_proto::v1::{snapshot_part, SnapshotEnd, SnapshotHeader, SnapshotPart};
use cairn_sha256::Sha256;
pub use cairn_snapshot::Check;
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// First bytes of a snapshot file.
pub const MAGIC: &[u8] = b"cairn-snapshot\n";
/// Largest header accepted (it is small: ids, names, limits).
const MAX_HEADER: u32 = 64 * 1024;
/// Payload bytes per ResumeSession message.
const CHUNK: usize = 1 << 20;
/// First bytes of the trailer of a file whose header has no sha256.
const END_MAGIC: &[u8] = b"cairn-snapshot-end\n";
/// The trailer: END_MAGIC, the payload's size (u64, big-endian), its sha256 (32 bytes).
pub const TRAILER_LEN: usize = END_MAGIC.len() + 8 + 32;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{0}")]
    Rpc(#[from] tonic::Status),
    #[error("snapshot file: {0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not a whole snapshot whose payload matches its header.
    #[error("{0}")]
    Corrupt(String),
}

impl From<cairn_snapshot::Error> for SnapshotError {
    fn from(e: cairn_snapshot::Error) -> SnapshotError {
        match e {
            cairn_snapshot::Error::Io { source, .. } => SnapshotError::Io(source),
            other => SnapshotError::Corrupt(other.to_string()),
        }
    }
}

/// A snapshot written by `save`.
#[derive(Debug, Clone)]
pub struct Saved {
    /// With the payload's size and sha256 (from the SnapshotEnd when the runner sent one).
    pub header: SnapshotHeader,
    /// Bytes of the whole file, and its sha256 (hex).
    pub file_bytes: u64,
    pub file_sha256: String,
}

/// The file's bytes before the payload.
pub fn prefix(header: &SnapshotHeader) -> Vec<u8> {
    let body = header.encode_to_vec();
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Reads the prefix of a snapshot file; the reader is then at the payload.
pub async fn read_header(
    reader: &mut (impl AsyncRead + Unpin),
) -> Result<SnapshotHeader, SnapshotError> {
    let not_snapshot = || {
        SnapshotError::Corrupt(
            "not a cairn snapshot file (its first bytes are not the snapshot magic)".into(),
        )
    };
    // A reader that fails says why; one that ends early holds no snapshot.
    let short = |e: std::io::Error, what: SnapshotError| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => what,
        _ => SnapshotError::Io(e),
    };
    let mut magic = vec![0u8; MAGIC.len()];
    reader
        .read_exact(&mut magic)
        .await
        .map_err(|e| short(e, not_snapshot()))?;
    if magic != MAGIC {
        return Err(not_snapshot());
    }
    let len = reader
        .read_u32()
        .await
        .map_err(|e| short(e, not_snapshot()))?;
    if len > MAX_HEADER {
        return Err(SnapshotError::Corrupt(format!(
            "the snapshot header says it is {len} bytes long: the file is damaged"
        )));
    }
    let mut body = vec![0u8; len as usize];
    reader.read_exact(&mut body).await.map_err(|e| {
        let cut = SnapshotError::Corrupt("the snapshot file ends inside its header".into());
        short(e, cut)
    })?;
    SnapshotHeader::decode(body.as_slice())
        .map_err(|e| SnapshotError::Corrupt(format!("the snapshot header does not decode: {e}")))
}

/// The trailer of a file whose header has no sha256; None when `sha256` is not hex.
pub fn trailer(end: &SnapshotEnd) -> Option<Vec<u8>> {
    let sha = hex_bytes(&end.sha256)?;
    let mut out = Vec::with_capacity(TRAILER_LEN);
    out.extend_from_slice(END_MAGIC);
    out.extend_from_slice(&end.size_bytes.to_be_bytes());
    out.extend_from_slice(&sha);
    Some(out)
}

/// The SnapshotEnd a trailer holds.
fn parse_trailer(t: &[u8]) -> Result<SnapshotEnd, SnapshotError> {
    if t.len() != TRAILER_LEN || !t.starts_with(END_MAGIC) {
        return Err(SnapshotError::Corrupt(
            "the snapshot file does not end with its size and sha256 (it was cut short or altered)"
                .into(),
        ));
    }
    let at = END_MAGIC.len();
    let size = u64::from_be_bytes(t[at..at + 8].try_into().expect("8 bytes"));
    let sha = t[at + 8..].iter().map(|b| format!("{b:02x}")).collect();
    Ok(SnapshotEnd {
        sha256: sha,
        size_bytes: size,
    })
}

fn hex_bytes(hex: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if hex.len() != 64 {
        return None;
    }
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Writes a PauseSession stream to `out` as a snapshot file, as [`save_into`] does.
pub async fn save(
    stream: tonic::Streaming<SnapshotPart>,
    out: &mut (impl AsyncWrite + Unpin),
) -> Result<Saved, SnapshotError> {
    let saved = {
        let sink = futures::sink::unfold(&mut *out, |out, b: Bytes| async move {
            out.write_all(&b).await.map(|_| out)
        });
        futures::pin_mut!(sink);
        save_into(stream, &mut sink).await?
    };
    out.flush().await?;
    Ok(saved)
}

/// Sends a PauseSession stream into `sink` as the bytes of a snapshot file (its prefix, the
/// payload as it arrives, then the trailer when the runner sent its end after the bytes),
/// checking the payload against its header or its SnapshotEnd; fails (what was sent is then
/// not a snapshot to keep) when they differ or the stream ends without its end. Nothing is
/// held but the message at hand.
pub async fn save_into<S>(
    mut stream: tonic::Streaming<SnapshotPart>,
    sink: &mut S,
) -> Result<Saved, SnapshotError>
where
    S: futures::Sink<Bytes, Error = std::io::Error> + Unpin,
{
    use futures::SinkExt;
    let mut header = match stream.message().await? {
        Some(SnapshotPart {
            msg: Some(snapshot_part::Msg::Header(h)),
            ..
        }) => h,
        _ => {
            return Err(SnapshotError::Corrupt(
                "the runner's snapshot stream did not start with its header".into(),
            ))
        }
    };
    let head = prefix(&header);
    let with_trailer = header.sha256.is_empty();
    let mut file_hash = Sha256::new();
    file_hash.update(&head);
    let head_len = head.len() as u64;
    sink.feed(Bytes::from(head)).await?;
    let mut check = Check::new();
    while let Some(part) = stream.message().await? {
        match part.msg {
            Some(snapshot_part::Msg::Chunk(c)) => {
                check.chunk(&c)?;
                file_hash.update(&c);
                sink.feed(c).await?;
            }
            Some(snapshot_part::Msg::End(e)) => check.end(e)?,
            _ => {}
        }
    }
    let end = check.finish(&mut header)?;
    let mut file_bytes = head_len + end.size_bytes;
    if let Some(t) = with_trailer.then(|| trailer(&end)).flatten() {
        file_hash.update(&t);
        file_bytes += t.len() as u64;
        sink.feed(Bytes::from(t)).await?;
    }
    sink.flush().await?;
    Ok(Saved {
        file_bytes,
        file_sha256: file_hash.finish_hex(),
        header,
    })
}

/// Why the reader of [`parts_reporting`] failed, once it did (its stream then ended short,
/// and the runner refused the snapshot as damaged): the cause to report over that refusal.
#[derive(Clone, Debug, Default)]
pub struct ReadFailure(std::sync::Arc<std::sync::OnceLock<String>>);

impl ReadFailure {
    pub fn get(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }

    fn set(&self, why: String) {
        tracing::warn!(error = %why, "the snapshot's stream ends short");
        let _ = self.0.set(why);
    }
}

/// ResumeSession's stream from a snapshot file's payload (`reader` just past the header):
/// the header (naming the new session `session_id`, empty for a UUID, and asking for
/// `copies` sessions, a fork when above 1), the bytes and, for a header without a sha256,
/// the SnapshotEnd from the file's trailer. A read error or a damaged trailer ends the
/// stream early; the runner then refuses the short snapshot.
pub fn parts(
    header: SnapshotHeader,
    reader: impl AsyncRead + Unpin + Send + 'static,
    session_id: String,
    copies: u32,
) -> impl futures::Stream<Item = SnapshotPart> + Send + 'static {
    parts_reporting(header, reader, session_id, copies, ReadFailure::default())
}

/// [`parts`], saying in `failure` why the stream ended short when it did.
pub fn parts_reporting(
    header: SnapshotHeader,
    reader: impl AsyncRead + Unpin + Send + 'static,
    session_id: String,
    copies: u32,
    failure: ReadFailure,
) -> impl futures::Stream<Item = SnapshotPart> + Send + 'static {
    // The trailer is held back from the chunks and sent as the end.
    let hold = if header.sha256.is_empty() {
        TRAILER_LEN
    } else {
        0
    };
    let first = SnapshotPart {
        msg: Some(snapshot_part::Msg::Header(header)),
        session_id,
        copies,
    };
    let start = Some((reader, BytesMut::new()));
    let rest = futures::stream::unfold(start, move |state| {
        let failure = failure.clone();
        async move {
            let (mut reader, mut carry) = state?;
            let mut at_eof = false;
            // Read into spare room, never zero-filled first.
            carry.reserve(CHUNK + hold - carry.len().min(CHUNK + hold));
            while carry.len() < CHUNK + hold {
                let room = CHUNK + hold - carry.len();
                match reader.read_buf(&mut (&mut carry).limit(room)).await {
                    Ok(0) => {
                        at_eof = true;
                        break;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        failure.set(e.to_string());
                        return None;
                    }
                }
            }
            if carry.len() > hold {
                let tail = carry.split_off(carry.len() - hold);
                let part = SnapshotPart {
                    msg: Some(snapshot_part::Msg::Chunk(carry.freeze())),
                    ..Default::default()
                };
                return Some((part, Some((reader, tail))));
            }
            if !at_eof || hold == 0 {
                return None;
            }
            match parse_trailer(&carry) {
                Ok(end) => {
                    let part = SnapshotPart {
                        msg: Some(snapshot_part::Msg::End(end)),
                        ..Default::default()
                    };
                    Some((part, None))
                }
                Err(e) => {
                    failure.set(e.to_string());
                    None
                }
            }
        }
    });
    futures::StreamExt::chain(futures::stream::iter([first]), rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn sha(b: &[u8]) -> String {
        let mut h = Sha256::new();
        h.update(b);
        h.finish_hex()
    }

    /// A snapshot file as `save` writes it for a runner that sends the end after the bytes.
    fn streamed_file(payload: &[u8]) -> (Vec<u8>, SnapshotEnd) {
        let header = SnapshotHeader {
            format: 1,
            backend: "local".into(),
            ..Default::default()
        };
        let end = SnapshotEnd {
            sha256: sha(payload),
            size_bytes: payload.len() as u64,
        };
        let mut file = prefix(&header);
        file.extend_from_slice(payload);
        file.extend_from_slice(&trailer(&end).unwrap());
        (file, end)
    }

    /// What `parts` sends for `file`: the payload bytes it streamed, and its end.
    async fn sent(file: Vec<u8>) -> (Vec<u8>, Option<SnapshotEnd>, usize) {
        let mut reader = std::io::Cursor::new(file);
        let header = read_header(&mut reader).await.unwrap();
        let parts: Vec<SnapshotPart> = parts(header, reader, String::new(), 1).collect().await;
        assert!(matches!(parts[0].msg, Some(snapshot_part::Msg::Header(_))));
        let (mut bytes, mut end, mut chunks) = (Vec::new(), None, 0);
        for (i, p) in parts.into_iter().enumerate().skip(1) {
            match p.msg {
                Some(snapshot_part::Msg::Chunk(c)) => {
                    assert!(end.is_none(), "a chunk after the end, at part {i}");
                    assert!(c.len() <= CHUNK);
                    bytes.extend_from_slice(&c);
                    chunks += 1;
                }
                Some(snapshot_part::Msg::End(e)) => end = Some(e),
                other => panic!("unexpected part {other:?}"),
            }
        }
        (bytes, end, chunks)
    }

    #[tokio::test]
    async fn a_streamed_file_is_sent_as_its_payload_then_the_end_its_trailer_holds() {
        // Sizes around the chunk and the trailer: the trailer is never sent as bytes.
        for len in [
            0,
            1,
            TRAILER_LEN,
            CHUNK - 1,
            CHUNK,
            CHUNK + 1,
            2 * CHUNK + TRAILER_LEN,
        ] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let (file, end) = streamed_file(&payload);
            let (bytes, got, chunks) = sent(file).await;
            assert_eq!(bytes, payload, "payload of {len} bytes");
            assert_eq!(got, Some(end), "end of {len} bytes");
            assert_eq!(chunks, len.div_ceil(CHUNK), "chunks of {len} bytes");
        }
    }

    #[tokio::test]
    async fn a_file_with_its_sha256_in_the_header_is_sent_whole_and_without_an_end() {
        let payload = vec![7u8; CHUNK + 100];
        let header = SnapshotHeader {
            format: 1,
            sha256: sha(&payload),
            size_bytes: payload.len() as u64,
            ..Default::default()
        };
        let mut file = prefix(&header);
        file.extend_from_slice(&payload);
        let (bytes, end, _) = sent(file).await;
        assert_eq!(bytes, payload);
        assert_eq!(end, None);
    }

    #[tokio::test]
    async fn a_streamed_file_cut_short_or_with_a_damaged_trailer_is_sent_without_an_end() {
        let (file, _) = streamed_file(&[5u8; 5000]);
        let cut = file[..file.len() - 10].to_vec();
        let mut magic = file.clone();
        let at = file.len() - TRAILER_LEN;
        magic[at] ^= 1;
        for damaged in [cut, magic] {
            let (_, end, _) = sent(damaged).await;
            assert_eq!(end, None, "a damaged trailer became an end");
        }
    }

    #[test]
    fn a_trailer_reads_back_as_the_end_it_was_made_from() {
        let end = SnapshotEnd {
            sha256: sha(b"x"),
            size_bytes: u64::MAX - 3,
        };
        let t = trailer(&end).unwrap();
        assert_eq!(t.len(), TRAILER_LEN);
        assert_eq!(parse_trailer(&t).unwrap(), end);
        assert!(trailer(&SnapshotEnd {
            sha256: "zz".repeat(32),
            size_bytes: 1
        })
        .is_none());
    }
}
