//! SHA-256, the one implementation every cairn component hashes bytes with (store Put and
//! Get, ingest, packs, sandbox outputs, tokens). It is aws-lc's, the assembly OpenSSL also
//! uses (SHA-NI where the CPU has it), already linked for TLS; the `sha2` crate ran at 56-80 %
//! of it on the same core. Only HMAC (the store's ingest claims) stays with `hmac` + `sha2`.

use aws_lc_rs::digest::{self, Context, SHA256};

/// The length of a digest in bytes.
pub const LEN: usize = 32;

/// A streaming SHA-256: feed it with [`Sha256::update`] (or as an [`std::io::Write`]), then
/// take the digest with [`Sha256::finish`] or [`Sha256::finish_hex`].
#[derive(Clone)]
pub struct Sha256(Context);

impl Default for Sha256 {
    fn default() -> Self {
        Sha256(Context::new(&SHA256))
    }
}

impl std::fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sha256")
    }
}

impl Sha256 {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// `update` that returns the hasher, for chains.
    pub fn chain(mut self, bytes: &[u8]) -> Self {
        self.update(bytes);
        self
    }

    pub fn finish(self) -> [u8; LEN] {
        to_array(self.0.finish())
    }

    /// The digest as 64 lowercase hex characters.
    pub fn finish_hex(self) -> String {
        hex::encode(self.finish())
    }
}

impl std::io::Write for Sha256 {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A writer that hashes and counts what passes through it (bytes whose digest is known only
/// at their end: a body streamed into a file, an archive written into a stream).
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    size: u64,
}

impl<W: std::io::Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            size: 0,
        }
    }

    /// Hands `bytes` to `pass` (which writes them to the writer its own way, e.g. without
    /// copying them) and counts them as written.
    pub fn pass<T: AsRef<[u8]>>(
        &mut self,
        bytes: T,
        pass: impl FnOnce(&mut W, T) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        self.hasher.update(bytes.as_ref());
        self.size += bytes.as_ref().len() as u64;
        pass(&mut self.inner, bytes)
    }

    /// The writer (flushed), the sha256 of everything written (64 lowercase hex characters)
    /// and its size in bytes.
    pub fn finish(mut self) -> std::io::Result<(W, String, u64)> {
        self.inner.flush()?;
        Ok((self.inner, self.hasher.finish_hex(), self.size))
    }
}

impl<W: std::io::Write> std::io::Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; LEN] {
    to_array(digest::digest(&SHA256, bytes))
}

/// The SHA-256 of `bytes` as 64 lowercase hex characters.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha256(bytes))
}

fn to_array(d: digest::Digest) -> [u8; LEN] {
    let mut out = [0u8; LEN];
    out.copy_from_slice(d.as_ref());
    out
}
