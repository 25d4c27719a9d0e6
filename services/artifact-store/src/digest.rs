//! sha256 of stored files, and a small cache of digests keyed by inode.
//!
//! The store publishes by rename, so a published inode's bytes never change through the store;
//! the cache key includes size, mtime and ctime so a file edited in place by someone else is
//! re-hashed. It saves Get (which sends the whole file's digest first) a second full read.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::sync::Mutex;

use cairn_sha256::Sha256;
use rustix::fs::Stat;

/// Size and sha256 of a byte sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    /// Lower-case hex sha256.
    pub sha256: String,
    pub size_bytes: u64,
}

const CACHE_ENTRIES: usize = 65_536;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Key {
    // Field types differ between targets, hence the casts.
    #[allow(clippy::unnecessary_cast)]
    fn of(st: &Stat) -> Key {
        Key {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            size: st.st_size as i64,
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as i64),
        }
    }
}

/// Digests of recently written or read files.
#[derive(Debug, Default)]
pub struct DigestCache {
    entries: Mutex<HashMap<Key, String>>,
}

impl DigestCache {
    /// Remembers the digest of the file described by `st`.
    pub fn remember(&self, st: &Stat, sha256: &str) {
        if let Ok(mut map) = self.entries.lock() {
            if map.len() >= CACHE_ENTRIES {
                map.clear();
            }
            map.insert(Key::of(st), sha256.to_owned());
        }
    }

    /// Digest of an open regular file (read from the cache, or by reading the file).
    pub fn of_file(&self, file: &File) -> std::io::Result<Digest> {
        let st = rustix::fs::fstat(file)?;
        let size_bytes = u64::try_from(st.st_size).unwrap_or(0);
        if let Some(sha) = self
            .entries
            .lock()
            .ok()
            .and_then(|m| m.get(&Key::of(&st)).cloned())
        {
            return Ok(Digest {
                sha256: sha,
                size_bytes,
            });
        }
        let digest = hash_reader(file)?;
        // Only cache when the file did not change while it was read.
        if rustix::fs::fstat(file)
            .map(|after| Key::of(&after) == Key::of(&st))
            .unwrap_or(false)
        {
            self.remember(&st, &digest.sha256);
        }
        Ok(digest)
    }
}

/// sha256 of everything `reader` yields.
pub fn hash_reader(mut reader: impl Read) -> std::io::Result<Digest> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size_bytes = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        size_bytes += n as u64;
    }
    Ok(Digest {
        sha256: hasher.finish_hex(),
        size_bytes,
    })
}

/// The digest a [`HashingWriter`] took, and its writer.
pub fn finished<W>(hashed: (W, String, u64)) -> (Digest, W) {
    let (inner, sha256, size_bytes) = hashed;
    (Digest { sha256, size_bytes }, inner)
}

/// An expected digest from a client: 64 hex digits, any case (stored lower-case).
pub fn parse_expected(sha256: &str) -> Option<String> {
    (sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| sha256.to_ascii_lowercase())
}
