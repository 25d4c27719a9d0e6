//! Streamed Puts and checked reads against the real store, in-process on loopback: a Put is
//! published only when the size and sha256 sent after its bytes match them, and a checked read
//! never hands on the whole of a file that does not match what was stored.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use cairn_proto::v1::PutEnd;
use cairn_store_client::streamed::Expected;
use cairn_store_client::{PutOptions, Store};
use futures::StreamExt;

const PROJECT: &str = "streamed";

async fn store(root: &std::path::Path) -> Store {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service =
        cairn_artifact_store::artifact_store_service(cairn_artifact_store::Config::new(root))
            .await
            .unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    Store::connect(&format!("http://{addr}")).unwrap()
}

/// 3 MiB and a few bytes, in uneven chunks.
fn body() -> (Vec<u8>, Vec<Bytes>) {
    let all: Vec<u8> = (0..(3 << 20) + 5).map(|i| (i * 7 % 251) as u8).collect();
    let chunks = all
        .chunks(700_000)
        .map(Bytes::copy_from_slice)
        .collect::<Vec<_>>();
    (all, chunks)
}

fn end_of(bytes: &[u8]) -> PutEnd {
    PutEnd {
        sha256: cairn_sha256::sha256_hex(bytes),
        size_bytes: bytes.len() as u64,
    }
}

/// The file beneath `dir` whose path ends with `rel`.
fn find_file(dir: &std::path::Path, rel: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, rel) {
                return Some(found);
            }
        } else if path.to_string_lossy().ends_with(rel) {
            return Some(path);
        }
    }
    None
}

/// Everything a checked read hands on: the bytes before its error, and the error.
async fn read_all(
    s: &Store,
    path: &str,
    expect: Option<Expected>,
) -> Option<(Vec<u8>, Option<String>)> {
    let mut body = Box::pin(s.read_checked(PROJECT, path, expect).await.unwrap()?);
    let mut got = Vec::new();
    while let Some(item) = body.next().await {
        match item {
            Ok(c) => got.extend_from_slice(&c),
            Err(e) => return Some((got, Some(e.to_string()))),
        }
    }
    Some((got, None))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_put_is_published_only_when_its_end_matches_its_bytes() {
    let root = tempfile::tempdir().unwrap();
    let s = store(root.path()).await;
    let opts = PutOptions::default();
    let (all, chunks) = body();
    let put = |path: &'static str, end: Option<PutEnd>| {
        let s = s.clone();
        let chunks = chunks.clone();
        let opts = opts.clone();
        async move {
            s.put_streamed(
                PROJECT,
                path,
                &opts,
                futures::stream::iter(chunks),
                async move { end },
            )
            .await
        }
    };

    put("docs/whole.bin", Some(end_of(&all))).await.unwrap();
    assert_eq!(
        s.get(PROJECT, "docs/whole.bin").await.unwrap().unwrap(),
        all
    );

    // No end (the sender failed before it), another sha256, another size: nothing published.
    let mut other = end_of(&all);
    other.sha256 = cairn_sha256::sha256_hex(b"other bytes");
    let mut shorter = end_of(&all);
    shorter.size_bytes -= 1;
    for (path, end) in [
        ("docs/no-end.bin", None),
        ("docs/other-sha.bin", Some(other)),
        ("docs/other-size.bin", Some(shorter)),
    ] {
        let refused = put(path, end).await;
        assert!(refused.is_err(), "{path} was taken: {refused:?}");
        assert_eq!(s.get(PROJECT, path).await.unwrap(), None, "{path}");
    }

    // A streamed Put cannot be deferred to its run's events (it could not be sent again).
    let deferred = PutOptions {
        with_run_events: true,
        run_id: "r1".into(),
        ..Default::default()
    };
    let refused = s
        .put_streamed(
            PROJECT,
            "docs/deferred.bin",
            &deferred,
            futures::stream::iter(chunks.clone()),
            std::future::ready(Some(end_of(&all))),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checked_read_never_hands_on_the_whole_of_bytes_that_do_not_match() {
    let root = tempfile::tempdir().unwrap();
    let s = store(root.path()).await;
    let (all, _) = body();
    s.put(
        PROJECT,
        "docs/f.bin",
        Bytes::from(all.clone()),
        &PutOptions::default(),
    )
    .await
    .unwrap();
    let right = Expected {
        sha256: cairn_sha256::sha256_hex(&all),
        size: all.len() as u64,
    };

    // Against what was written, and against the store's own sha256.
    for expect in [Some(right.clone()), None] {
        let (got, err) = read_all(&s, "docs/f.bin", expect).await.unwrap();
        assert_eq!(err, None);
        assert!(got == all, "the bytes differ");
    }

    // Not what was written (another sha256, another size): refused before any byte.
    let wrong_sha = Expected {
        sha256: cairn_sha256::sha256_hex(b"something else"),
        ..right.clone()
    };
    let wrong_size = Expected {
        size: right.size + 1,
        ..right.clone()
    };
    for wrong in [wrong_sha, wrong_size] {
        let (got, err) = read_all(&s, "docs/f.bin", Some(wrong)).await.unwrap();
        assert!(got.is_empty(), "{} bytes handed on", got.len());
        let err = err.expect("refused");
        assert!(
            err.contains("docs/f.bin") && err.contains("sha256"),
            "the error names the file and the sha256: {err}"
        );
    }

    // One byte flipped behind the store's back: the store hashes the changed file again, so
    // it no longer vouches for what was written and is refused before any byte.
    let stored = find_file(root.path(), "docs/f.bin").expect("the file is in the data root");
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&stored, &bytes).unwrap();
    let (got, err) = read_all(&s, "docs/f.bin", Some(right)).await.unwrap();
    assert!(got.is_empty(), "{} bytes handed on", got.len());
    assert!(err.unwrap().contains("that were written"));

    // No such file.
    assert!(read_all(&s, "docs/none.bin", None).await.is_none());
}

/// A Get's answer whose bytes are not those its header vouches for (a file changed while it
/// was read): every chunk but the last passes as it comes, then the error, whether the
/// reader expected the header's digest or one of its own.
#[tokio::test]
async fn bytes_that_do_not_match_the_header_never_pass_whole() {
    use cairn_proto::v1::{get_response, FileInfo, GetResponse};
    let (all, chunks) = body();
    let info = FileInfo {
        sha256: cairn_sha256::sha256_hex(&all),
        size_bytes: all.len() as u64,
        ..Default::default()
    };
    let mut damaged = chunks.clone();
    let last = damaged.len() - 1;
    let mut tail = damaged[last].to_vec();
    tail[0] ^= 1;
    damaged[last] = Bytes::from(tail);
    let answer = |chunks: Vec<Bytes>| {
        let msgs = std::iter::once(get_response::Msg::Info(info.clone()))
            .chain(chunks.into_iter().map(get_response::Msg::Chunk))
            .map(|m| Ok(GetResponse { msg: Some(m) }))
            .collect::<Vec<_>>();
        futures::stream::iter(msgs)
    };
    let expected = Expected {
        sha256: info.sha256.clone(),
        size: info.size_bytes,
    };
    for expect in [None, Some(expected.clone())] {
        let read: Vec<_> =
            cairn_store_client::streamed::checked(answer(damaged.clone()), expect, "f".into())
                .collect()
                .await;
        let (last, passed) = read.split_last().unwrap();
        let passed: Vec<u8> = passed
            .iter()
            .flat_map(|c| c.as_ref().unwrap().to_vec())
            .collect();
        assert_eq!(passed.len(), all.len() - chunks[chunks.len() - 1].len());
        assert!(all.starts_with(&passed));
        let err = last.as_ref().unwrap_err().to_string();
        assert!(err.contains("read back"), "{err}");
    }
    // The same answer undamaged passes whole; one cut short ends with the error.
    let whole: Vec<_> =
        cairn_store_client::streamed::checked(answer(chunks.clone()), Some(expected), "f".into())
            .collect()
            .await;
    let got: Vec<u8> = whole
        .iter()
        .flat_map(|c| c.as_ref().unwrap().to_vec())
        .collect();
    assert!(got == all);
    let cut: Vec<_> = cairn_store_client::streamed::checked(
        answer(chunks[..chunks.len() - 1].to_vec()),
        None,
        "f".into(),
    )
    .collect()
    .await;
    assert!(
        cut.last().unwrap().is_err(),
        "a short answer ends with an error"
    );
}
