"""Puts and gets SIZE bytes through cairn-client in a process of its own and prints, as JSON,
how much its peak resident memory grew meanwhile (run by test_bigfile.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import resource
import sys
from collections.abc import Iterator
from pathlib import Path

import cairn_client

MIB = 1024 * 1024


def blocks(total: int) -> Iterator[bytes]:
    """`total` bytes in 1 MiB blocks that differ from each other."""
    base = bytes(range(256)) * 4096
    for i in range(total // MIB):
        yield i.to_bytes(8, "big") + base[8:]


def peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def run_async(addr: str, size: int, target: Path) -> tuple[str, int]:
    async with cairn_client.AsyncClient(addr, project="big") as c:
        await c.store.put("docs/warm.bin", b"warm", overwrite=True)
        await c.store.get("docs/warm.bin")
        before = peak_kib()
        put = await c.store.put("docs/big.bin", blocks(size), overwrite=True)
        await c.store.get("docs/big.bin", to=target)
        return put.sha256, peak_kib() - before


def run_sync(addr: str, size: int, target: Path) -> tuple[str, int]:
    with cairn_client.Client(addr, project="big") as c:
        c.store.put("docs/warm.bin", b"warm", overwrite=True)
        c.store.get("docs/warm.bin")
        before = peak_kib()
        put = c.store.put("docs/big.bin", blocks(size), overwrite=True)
        c.store.get("docs/big.bin", to=target)
        return put.sha256, peak_kib() - before


def main() -> None:
    addr, flavour, size, target = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    if flavour == "async":
        sha, growth = asyncio.run(run_async(addr, size, target))
    else:
        sha, growth = run_sync(addr, size, target)
    expected = hashlib.sha256()
    for block in blocks(size):
        expected.update(block)
    with open(target, "rb") as f:
        got = hashlib.sha256()
        for block in iter(lambda: f.read(MIB), b""):
            got.update(block)
    print(
        json.dumps(
            {
                "growth_kib": growth,
                "put_sha256": sha,
                "expected": expected.hexdigest(),
                "file_sha256": got.hexdigest(),
                "file_size": target.stat().st_size,
            }
        )
    )


if __name__ == "__main__":
    main()
