//! A 1 GiB streamed Put and Get against the store binary, whose peak RSS must stay under
//! 100 MiB. The bytes are generated on the fly; the client never holds the whole file either.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use cairn_proto::v1::{get_response, put_request, GetRequest, PutHeader, PutRequest, WriteOutcome};
use common::*;
use futures::StreamExt;
use sha2::{Digest, Sha256};

const CHUNK: usize = 1 << 20;
const CHUNKS: u64 = 1024;

/// Chunk `i` of the body: a fixed pseudo-random block with `i` stamped into its first bytes.
fn chunk(block: &[u8], i: u64) -> Bytes {
    let mut c = block.to_vec();
    c[..8].copy_from_slice(&i.to_le_bytes());
    Bytes::from(c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_put_and_get_with_flat_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Process::spawn(tmp.path());
    let mut client = connect(&store.addr).await;

    let mut block = vec![0u8; CHUNK];
    Bytegen::new(42).fill(&mut block);
    let mut expected = Sha256::new();
    for i in 0..CHUNKS {
        expected.update(chunk(&block, i));
    }
    let expected = hex::encode(expected.finalize());

    let header = PutHeader {
        expected_sha256: expected.clone(),
        expected_size: Some(CHUNKS * CHUNK as u64),
        ..header("big", "workspace/one.gib")
    };
    let block2 = block.clone();
    let body = futures::stream::iter(0..CHUNKS).map(move |i| PutRequest {
        msg: Some(put_request::Msg::Chunk(chunk(&block2, i))),
    });
    let stream = futures::stream::once(async {
        PutRequest {
            msg: Some(put_request::Msg::Header(header)),
        }
    })
    .chain(body);
    let started = std::time::Instant::now();
    let r = client.put(stream).await.unwrap().into_inner();
    let put_secs = started.elapsed().as_secs_f64();
    assert_eq!(outcome(&r), WriteOutcome::Created);
    let digest = r.digest.unwrap();
    assert_eq!(
        (digest.sha256.as_str(), digest.size_bytes),
        (expected.as_str(), CHUNKS * CHUNK as u64)
    );

    let started = std::time::Instant::now();
    let mut stream = client
        .get(GetRequest {
            project_id: "big".into(),
            path: "workspace/one.gib".into(),
            offset: 0,
            length: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut got = Sha256::new();
    let mut size = 0u64;
    let mut info_sha = String::new();
    while let Some(msg) = stream.next().await {
        match msg.unwrap().msg {
            Some(get_response::Msg::Info(info)) => info_sha = info.sha256,
            Some(get_response::Msg::Chunk(c)) => {
                assert!(c.len() <= 1 << 20, "Get chunks are at most 1 MiB");
                size += c.len() as u64;
                got.update(&c);
            }
            None => {}
        }
    }
    let get_secs = started.elapsed().as_secs_f64();
    assert_eq!(info_sha, expected);
    assert_eq!(size, CHUNKS * CHUNK as u64);
    assert_eq!(
        hex::encode(got.finalize()),
        expected,
        "the bytes read back hash to the same digest"
    );

    let peak_mib = store.peak_rss_kib() / 1024;
    eprintln!("1 GiB: put {put_secs:.1}s, get {get_secs:.1}s, store peak RSS {peak_mib} MiB");
    assert!(peak_mib < 100, "store peak RSS {peak_mib} MiB >= 100 MiB");
}
