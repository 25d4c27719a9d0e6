//! The digests are those of the implementation used before (the `sha2` crate), whole and
//! streamed in any chunking.

use proptest::prelude::*;
use sha2::Digest as _;

fn reference(bytes: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(bytes).into()
}

/// Bytes of `len` from a cheap generator (proptest shrinks the length and the seed).
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn whole_and_streamed_digests_match_the_reference(
        len in prop_oneof![0usize..300, 0usize..(3 << 20)],
        seed in any::<u64>(),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let data = bytes(len, seed);
        let want = reference(&data);
        prop_assert_eq!(cairn_sha256::sha256(&data), want);
        prop_assert_eq!(cairn_sha256::sha256_hex(&data), hex::encode(want));

        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(len + 1)).collect();
        at.sort_unstable();
        let mut h = cairn_sha256::Sha256::new();
        let mut from = 0;
        for to in at.into_iter().chain([len]) {
            h.update(&data[from..to]);
            from = to;
        }
        prop_assert_eq!(h.finish(), want);
    }
}

#[test]
fn known_answers() {
    // FIPS 180-2 examples.
    assert_eq!(
        cairn_sha256::sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        cairn_sha256::Sha256::new()
            .chain(b"a")
            .chain(b"bc")
            .finish_hex(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn a_writer_hashes_what_is_copied_into_it() {
    let data = bytes(1 << 20, 7);
    let mut h = cairn_sha256::Sha256::new();
    std::io::copy(&mut &data[..], &mut h).expect("copy into a hasher");
    assert_eq!(h.finish(), reference(&data));
}
