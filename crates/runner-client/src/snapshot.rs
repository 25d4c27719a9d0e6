//! Session snapshots as callers keep them: one file, `cairn-snapshot` magic, the
//! SnapshotHeader (length-prefixed protobuf), then the payload the runner streamed. `save`
//! writes a PauseSession stream into such a file, checking the payload against the header's
//! size and sha256 as it arrives; `parts` turns such a file back into ResumeSession's stream.
//! The runner checks the bytes again: a damaged file is never resumed.

use bytes::Bytes;
use cairn_proto::v1::{snapshot_part, SnapshotHeader, SnapshotPart};
use cairn_sha256::Sha256;
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// First bytes of a snapshot file.
pub const MAGIC: &[u8] = b"cairn-snapshot\n";
/// Largest header accepted (it is small: ids, names, limits).
const MAX_HEADER: u32 = 64 * 1024;
/// Payload bytes per ResumeSession message.
const CHUNK: usize = 256 * 1024;

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

/// A snapshot written by `save`.
#[derive(Debug, Clone)]
pub struct Saved {
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
    let mut magic = vec![0u8; MAGIC.len()];
    reader
        .read_exact(&mut magic)
        .await
        .map_err(|_| not_snapshot())?;
    if magic != MAGIC {
        return Err(not_snapshot());
    }
    let len = reader.read_u32().await.map_err(|_| not_snapshot())?;
    if len > MAX_HEADER {
        return Err(SnapshotError::Corrupt(format!(
            "the snapshot header says it is {len} bytes long: the file is damaged"
        )));
    }
    let mut body = vec![0u8; len as usize];
    reader
        .read_exact(&mut body)
        .await
        .map_err(|_| SnapshotError::Corrupt("the snapshot file ends inside its header".into()))?;
    SnapshotHeader::decode(body.as_slice())
        .map_err(|e| SnapshotError::Corrupt(format!("the snapshot header does not decode: {e}")))
}

/// Writes a PauseSession stream to `out` as a snapshot file, checking the payload against
/// its header; fails (the file is then not a snapshot to keep) when they differ.
pub async fn save(
    mut stream: tonic::Streaming<SnapshotPart>,
    out: &mut (impl AsyncWrite + Unpin),
) -> Result<Saved, SnapshotError> {
    let header = match stream.message().await? {
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
    let mut file_hash = Sha256::new();
    file_hash.update(&head);
    out.write_all(&head).await?;
    let (mut payload_hash, mut size) = (Sha256::new(), 0u64);
    while let Some(part) = stream.message().await? {
        if let Some(snapshot_part::Msg::Chunk(c)) = part.msg {
            payload_hash.update(&c);
            file_hash.update(&c);
            size += c.len() as u64;
            out.write_all(&c).await?;
        }
    }
    out.flush().await?;
    let sha = payload_hash.finish_hex();
    if size != header.size_bytes || sha != header.sha256 {
        return Err(SnapshotError::Corrupt(format!(
            "the snapshot arrived as {size} bytes with sha256 {sha}; its header says {} bytes with sha256 {}",
            header.size_bytes, header.sha256
        )));
    }
    Ok(Saved {
        file_bytes: head.len() as u64 + size,
        file_sha256: file_hash.finish_hex(),
        header,
    })
}

/// ResumeSession's stream from a snapshot file's payload (`reader` just past the header):
/// the header (naming the new session `session_id`, empty for a UUID, and asking for
/// `copies` sessions, a fork when above 1), then the bytes. A read error ends the stream
/// early; the runner then refuses the short snapshot.
pub fn parts(
    header: SnapshotHeader,
    reader: impl AsyncRead + Unpin + Send + 'static,
    session_id: String,
    copies: u32,
) -> impl futures::Stream<Item = SnapshotPart> + Send + 'static {
    let first = SnapshotPart {
        msg: Some(snapshot_part::Msg::Header(header)),
        session_id,
        copies,
    };
    let chunks = futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let mut buf = vec![0u8; CHUNK];
        let mut filled = 0;
        while filled < CHUNK {
            match reader.read(&mut buf[filled..]).await {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the snapshot file failed; its stream ends short");
                    return None;
                }
            }
        }
        if filled == 0 {
            return None;
        }
        buf.truncate(filled);
        let part = SnapshotPart {
            msg: Some(snapshot_part::Msg::Chunk(Bytes::from(buf))),
            ..Default::default()
        };
        Some((part, Some(reader)))
    });
    futures::StreamExt::chain(futures::stream::iter([first]), chunks)
}
