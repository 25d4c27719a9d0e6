//! Direct I/O for large bodies: the bytes go from aligned buffers straight to the device
//! (O_DIRECT), skipping the page-cache copy and its bookkeeping (together a third of the
//! store's CPU on a large Put, bench/RESULTS.md), with up to [`IN_FLIGHT`] writes under way
//! so the stream never waits for one device write. Where the filesystem refuses O_DIRECT
//! (tmpfs, some FUSE and network filesystems) the caller writes through the page cache.
//!
//! Durability is unchanged: O_DIRECT alone promises nothing about the device's cache or the
//! inode, so the file is still fsync'd before it is published.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use rustix::fs::OFlags;

/// Alignment of buffers, offsets and lengths (covers 512-byte and 4 KiB logical blocks).
const ALIGN: usize = 4096;
/// Size of one device write.
pub const BUFFER: usize = 4 << 20;
/// Device writes under way at once (one thread each).
const IN_FLIGHT: usize = 2;

/// A heap buffer whose usable window starts on an [`ALIGN`] boundary.
struct Aligned {
    mem: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new() -> Aligned {
        let mem = vec![0u8; BUFFER + ALIGN];
        let start = (ALIGN - mem.as_ptr().addr() % ALIGN) % ALIGN;
        Aligned { mem, start, len: 0 }
    }

    fn window(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + BUFFER]
    }

    /// The filled part, padded with zeros to a whole number of blocks.
    fn padded(&mut self) -> &[u8] {
        let padded = self.len.div_ceil(ALIGN) * ALIGN;
        let len = self.len;
        self.window()[len..padded].fill(0);
        &self.mem[self.start..self.start + padded]
    }
}

/// Writes a file sequentially with O_DIRECT; see the module header. `write` copies into the
/// current buffer and hands full ones to the writer threads.
pub struct DirectWriter {
    /// Shared with the device threads; taken out by `finish` once they are gone (or by
    /// `start` when direct I/O is refused).
    file: Option<Arc<File>>,
    current: Aligned,
    /// File offset of `current`'s first byte.
    offset: u64,
    to_disk: Option<SyncSender<(Aligned, u64)>>,
    free: Receiver<std::io::Result<Aligned>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl DirectWriter {
    /// Switches `file` (empty, opened for writing) to O_DIRECT; gives it back, unchanged,
    /// when the filesystem refuses or no thread can be had.
    pub fn start(file: File) -> std::result::Result<DirectWriter, File> {
        let Ok(flags) = rustix::fs::fcntl_getfl(&file) else {
            return Err(file);
        };
        if rustix::fs::fcntl_setfl(&file, flags | OFlags::DIRECT).is_err() {
            return Err(file);
        }
        let file = Arc::new(file);
        let (to_disk, jobs) = sync_channel::<(Aligned, u64)>(0);
        let jobs = Arc::new(Mutex::new(jobs));
        // Every buffer but the one being filled starts free.
        let (give_back, free) = sync_channel(IN_FLIGHT + 1);
        let mut threads = Vec::with_capacity(IN_FLIGHT);
        for i in 0..IN_FLIGHT {
            let (own, jobs, back) = (file.clone(), jobs.clone(), give_back.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("store-direct-{i}"))
                .spawn(move || loop {
                    let job = jobs.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok((mut buf, at)) = job else { return };
                    let result = write_block(&own, buf.padded(), at).map(|()| {
                        buf.len = 0;
                        buf
                    });
                    if back.send(result).is_err() {
                        return;
                    }
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(_) => break,
            }
            let _ = give_back.send(Ok(Aligned::new()));
        }
        let started = threads.len() == IN_FLIGHT;
        let mut writer = DirectWriter {
            file: Some(file),
            current: Aligned::new(),
            offset: 0,
            to_disk: Some(to_disk),
            free,
            threads,
        };
        if started {
            return Ok(writer);
        }
        match writer.take_file() {
            Ok(file) => {
                let _ = rustix::fs::fcntl_setfl(&file, flags);
                Err(file)
            }
            // Unreachable (the threads are gone); the write then fails cleanly.
            Err(_) => Ok(writer),
        }
    }

    /// Appends `bytes` to the file.
    pub fn write(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let at = self.current.len;
            let n = bytes.len().min(BUFFER - at);
            self.current.window()[at..at + n].copy_from_slice(&bytes[..n]);
            self.current.len += n;
            bytes = &bytes[n..];
            if self.current.len == BUFFER {
                self.hand_off()?;
            }
        }
        Ok(())
    }

    /// Sends the current buffer to a writer thread and takes a free one.
    fn hand_off(&mut self) -> std::io::Result<()> {
        let next = self.free.recv().map_err(|_| gone())??;
        let full = std::mem::replace(&mut self.current, next);
        let len = full.len as u64;
        self.to_disk
            .as_ref()
            .ok_or_else(gone)?
            .send((full, self.offset))
            .map_err(|_| gone())?;
        self.offset += len;
        Ok(())
    }

    /// Ends the threads once their writes are done.
    fn stop(&mut self) {
        self.to_disk = None;
        for t in std::mem::take(&mut self.threads) {
            let _ = t.join();
        }
    }

    /// Stops the threads and takes the file back from them.
    fn take_file(&mut self) -> std::io::Result<File> {
        self.stop();
        let shared = self.file.take().ok_or_else(gone)?;
        Arc::try_unwrap(shared).map_err(|_| gone())
    }

    /// Writes what is left, waits for every write, trims the padding; returns the file
    /// (still O_DIRECT; fsync it before publishing).
    pub fn finish(mut self) -> std::io::Result<File> {
        let size = self.offset + self.current.len as u64;
        if self.current.len > 0 {
            self.hand_off()?;
        }
        let file = self.take_file()?;
        // Every buffer has come back; an error among them is the write's error.
        while let Ok(back) = self.free.try_recv() {
            back?;
        }
        file.set_len(size)?;
        Ok(file)
    }
}

impl Drop for DirectWriter {
    fn drop(&mut self) {
        // An abandoned write leaves only its temp file, which its guard removes.
        self.stop();
    }
}

/// One device write. A filesystem that took the O_DIRECT flag but refuses this alignment
/// (EINVAL: larger logical blocks than [`ALIGN`]) gets the rest of the file through the page
/// cache instead: the flag goes, and the block is written again at the same offset.
fn write_block(file: &File, bytes: &[u8], at: u64) -> std::io::Result<()> {
    match file.write_all_at(bytes, at) {
        Err(e) if rustix::io::Errno::from_io_error(&e) == Some(rustix::io::Errno::INVAL) => {
            let flags = rustix::fs::fcntl_getfl(file)?;
            rustix::fs::fcntl_setfl(file, flags.difference(OFlags::DIRECT))?;
            tracing::warn!("O_DIRECT refused at 4 KiB alignment; writing through the page cache");
            file.write_all_at(bytes, at)
        }
        other => other,
    }
}

fn gone() -> std::io::Error {
    std::io::Error::other("a direct-I/O writer thread ended early")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Deterministic bytes that differ at every offset of a block.
    fn body(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + i / 4096) as u8).collect()
    }

    #[test]
    fn every_size_and_split_lands_byte_exact() {
        let tmp = tempfile::tempdir().unwrap();
        let sizes = [
            0,
            1,
            ALIGN - 1,
            ALIGN,
            BUFFER - 1,
            BUFFER,
            BUFFER + 1,
            3 * BUFFER + 17,
        ];
        for (n, size) in sizes.into_iter().enumerate() {
            for split in [1000, 65_536, 1 << 20, 3 * BUFFER] {
                let path = tmp.path().join(format!("{n}-{split}"));
                let file = File::create(&path).unwrap();
                let Ok(mut w) = DirectWriter::start(file) else {
                    panic!("this test's filesystem takes O_DIRECT");
                };
                let flags = rustix::fs::fcntl_getfl(w.file.as_ref().unwrap()).unwrap();
                assert!(flags.contains(OFlags::DIRECT));
                let want = body(size);
                for part in want.chunks(split) {
                    w.write(part).unwrap();
                }
                let file = w.finish().unwrap();
                file.sync_all().unwrap();
                assert_eq!(file.metadata().unwrap().len(), size as u64);
                assert!(
                    std::fs::read(&path).unwrap() == want,
                    "size {size}, split {split}"
                );
            }
        }
    }

    #[test]
    fn an_alignment_the_device_refuses_falls_back_to_the_page_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        let file = File::create(&path).unwrap();
        let flags = rustix::fs::fcntl_getfl(&file).unwrap();
        rustix::fs::fcntl_setfl(&file, flags | OFlags::DIRECT).unwrap();
        // A buffer one byte off any alignment: O_DIRECT refuses it with EINVAL.
        let mem = body(ALIGN + 1);
        let start = if mem.as_ptr().align_offset(2) == 0 {
            1
        } else {
            0
        };
        let odd = &mem[start..start + ALIGN];
        assert_eq!(
            file.write_all_at(odd, 0).map_err(|e| e.raw_os_error()),
            Err(Some(rustix::io::Errno::INVAL.raw_os_error()))
        );
        write_block(&file, odd, 0).unwrap();
        assert!(!rustix::fs::fcntl_getfl(&file)
            .unwrap()
            .contains(OFlags::DIRECT));
        assert_eq!(std::fs::read(&path).unwrap(), odd);
    }

    #[test]
    fn a_failing_device_write_is_an_error_not_a_hang() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("ro");
        std::fs::write(&path, b"").unwrap();
        // Read-only: every write fails with EBADF.
        let Ok(mut w) = DirectWriter::start(File::open(&path).unwrap()) else {
            panic!("this test's filesystem takes O_DIRECT");
        };
        let mut failed = false;
        for _ in 0..8 {
            if w.write(&body(BUFFER)).is_err() {
                failed = true;
                break;
            }
        }
        assert!(failed || w.finish().is_err());
        // An abandoned writer ends its threads.
        let Ok(mut w) = DirectWriter::start(File::create(tmp.path().join("x")).unwrap()) else {
            panic!("O_DIRECT");
        };
        w.write(&body(BUFFER + 5)).unwrap();
        drop(w);
    }
}
