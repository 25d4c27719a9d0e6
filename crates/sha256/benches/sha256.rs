//! In-process SHA-256 throughput of the candidate implementations on 1 MiB blocks, the block
//! size of `openssl speed -evp sha256 -bytes 1048576`, which bench/sha256.sh runs beside it:
//! `sha2` (used before), aws-lc (cairn-sha256, used now) and `ring`. It lives here, not in
//! bench/, so its release build needs only the hashes.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sha2::Digest as _;

const SIZES: [usize; 2] = [64 << 10, 1 << 20];

fn hashes(c: &mut Criterion) {
    let mut group = c.benchmark_group("sha256");
    for size in SIZES {
        let data = vec![0x5au8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("sha2", size), &data, |b, d| {
            b.iter(|| sha2::Sha256::digest(d))
        });
        group.bench_with_input(BenchmarkId::new("aws-lc", size), &data, |b, d| {
            b.iter(|| cairn_sha256::sha256(d))
        });
        group.bench_with_input(BenchmarkId::new("ring", size), &data, |b, d| {
            b.iter(|| ring::digest::digest(&ring::digest::SHA256, d))
        });
    }
    group.finish();
}

criterion_group!(benches, hashes);
criterion_main!(benches);
