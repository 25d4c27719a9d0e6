//! The digests the store computes are those of an independent implementation (the `sha2`
//! crate): streamed Puts of random sizes, either side of the small/streamed boundary (1 MiB),
//! cut into random chunks, over gRPC; the Get of each returns the same bytes.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::Bytes;
use cairn_proto::v1::{put_request, PutRequest};
use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config as Cases, TestRunner};

const MIB: usize = 1 << 20;

#[test]
fn streamed_puts_of_random_sizes_and_chunkings_have_the_reference_digest() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let served = rt.block_on(serve());
    let client = served.client.clone();
    let sizes = prop_oneof![0usize..4096, (MIB - 64)..(MIB + 64), 0usize..(3 * MIB)];
    let cuts = proptest::collection::vec(any::<prop::sample::Index>(), 0..24);
    let mut runner = TestRunner::new(Cases::with_cases(40));
    let count = std::cell::Cell::new(0u32);
    runner
        .run(&(sizes, any::<u64>(), cuts), |(size, seed, cuts)| {
            count.set(count.get() + 1);
            let n = count.get();
            let mut client = client.clone();
            let mut body = vec![0u8; size];
            Bytegen::new(seed).fill(&mut body);
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(size + 1)).collect();
            at.sort_unstable();
            at.dedup();
            let mut msgs = vec![PutRequest {
                msg: Some(put_request::Msg::Header(header(
                    "p",
                    &format!("workspace/f{n}"),
                ))),
            }];
            let mut from = 0;
            for to in at.into_iter().chain([size]) {
                // Chunks of at most 1 MiB (what a client may send); empty ones are allowed.
                for piece in body[from..to]
                    .chunks(MIB)
                    .chain((from == to).then_some(&[][..]))
                {
                    msgs.push(PutRequest {
                        msg: Some(put_request::Msg::Chunk(Bytes::copy_from_slice(piece))),
                    });
                }
                from = to;
            }
            let want = sha256_hex(&body);
            let (put, got) = rt.block_on(async {
                let put = client
                    .put(tokio_stream::iter(msgs))
                    .await
                    .unwrap()
                    .into_inner();
                let got = get(&mut client, "p", &format!("workspace/f{n}"))
                    .await
                    .unwrap();
                (put, got)
            });
            let digest = put.digest.unwrap();
            prop_assert_eq!(&digest.sha256, &want, "size {}", size);
            prop_assert_eq!(digest.size_bytes, size as u64);
            prop_assert_eq!(sha256_hex(&got), want);
            Ok(())
        })
        .unwrap();
}
