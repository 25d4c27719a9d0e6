//! In-process SHA-256 throughput of the candidate implementations on 1 MiB blocks, the block
//! size of `openssl speed -evp sha256 -bytes 1048576`, which bench/sha256.sh runs beside it:
//! `sha2` (used before), aws-lc (cairn-sha256, used now) and `ring`. It lives here, not in
//! bench/, so its release build needs only the hashes.
//!
//! Each sample is the thread's time on a CPU (/proc/thread-self/schedstat), not wall time, as
//! `openssl speed` divides by its user CPU time: on a shared machine both then count only the
//! time they actually ran.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sha2::Digest as _;

/// Nanoseconds this thread has run on a CPU.
fn on_cpu() -> std::time::Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns = text
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    std::time::Duration::from_nanos(ns)
}

/// Runs `f` `iters` times; returns the CPU time it took, or the wall time when the thread's
/// schedstat did not move (some kernels update it only at their ticks, so a short sample reads
/// 0, which criterion refuses).
fn cpu_timed<T>(iters: u64, mut f: impl FnMut() -> T) -> std::time::Duration {
    let (cpu0, wall0) = (on_cpu(), std::time::Instant::now());
    for _ in 0..iters {
        std::hint::black_box(f());
    }
    let cpu = on_cpu() - cpu0;
    if cpu.is_zero() {
        wall0.elapsed()
    } else {
        cpu
    }
}

const SIZES: [usize; 2] = [64 << 10, 1 << 20];

fn hashes(c: &mut Criterion) {
    let mut group = c.benchmark_group("sha256");
    for size in SIZES {
        let data = vec![0x5au8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("sha2", size), &data, |b, d| {
            b.iter_custom(|n| cpu_timed(n, || sha2::Sha256::digest(d)))
        });
        group.bench_with_input(BenchmarkId::new("aws-lc", size), &data, |b, d| {
            b.iter_custom(|n| cpu_timed(n, || cairn_sha256::sha256(d)))
        });
        group.bench_with_input(BenchmarkId::new("ring", size), &data, |b, d| {
            b.iter_custom(|n| cpu_timed(n, || ring::digest::digest(&ring::digest::SHA256, d)))
        });
    }
    group.finish();
}

criterion_group!(benches, hashes);
criterion_main!(benches);
