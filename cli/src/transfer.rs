//! Streaming file bodies to and from the artifact-store (header message, then chunks), with
//! memory bounded by a few chunks whatever the file size.

use crate::embedded::Authed;
use bytes::Bytes;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::{
    get_response, put_request, FileInfo, GetRequest, PutHeader, PutRequest, PutResponse,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

const CHUNK: usize = 1 << 20;

/// Uploads everything `reader` yields under `header`.
pub async fn put(
    client: &mut ArtifactStoreClient<Authed>,
    header: PutHeader,
    mut reader: impl AsyncRead + Unpin + Send + 'static,
) -> anyhow::Result<PutResponse> {
    let (tx, rx) = tokio::sync::mpsc::channel::<PutRequest>(4);
    let first = PutRequest {
        msg: Some(put_request::Msg::Header(header)),
    };
    tx.send(first).await.ok();
    // The reader runs beside the call; a read error aborts the stream so nothing is published.
    let pump = tokio::spawn(async move {
        loop {
            let mut buf = vec![0u8; CHUNK];
            let mut filled = 0;
            while filled < CHUNK {
                let n = reader.read(&mut buf[filled..]).await?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            if filled == 0 {
                return Ok::<(), std::io::Error>(());
            }
            buf.truncate(filled);
            let msg = PutRequest {
                msg: Some(put_request::Msg::Chunk(Bytes::from(buf))),
            };
            if tx.send(msg).await.is_err() {
                return Ok(());
            }
            if filled < CHUNK {
                return Ok(());
            }
        }
    });
    let response = client.put(ReceiverStream::new(rx)).await;
    match pump.await {
        Ok(Err(e)) => return Err(anyhow::Error::new(e).context("reading the local file")),
        Err(e) => anyhow::bail!("upload task failed: {e}"),
        Ok(Ok(())) => {}
    }
    Ok(response?.into_inner())
}

/// Downloads `request` into `writer`; returns the file's description.
pub async fn get(
    client: &mut ArtifactStoreClient<Authed>,
    request: GetRequest,
    writer: &mut (impl AsyncWrite + Unpin),
) -> anyhow::Result<FileInfo> {
    let mut stream = client.get(request).await?.into_inner();
    let mut info = None;
    while let Some(msg) = stream.next().await {
        match msg?.msg {
            Some(get_response::Msg::Info(i)) => info = Some(i),
            Some(get_response::Msg::Chunk(c)) => writer.write_all(&c).await?,
            None => {}
        }
    }
    writer.flush().await?;
    info.ok_or_else(|| anyhow::anyhow!("the store sent no file header"))
}
