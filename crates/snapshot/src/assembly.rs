//! Checkpoint files put together again from the parts a payload carries them in
//! (`checkpoint/NAME@OFFSET`), each made new in `<dir>/checkpoint/` without following a link.

use std::os::fd::AsFd;
use std::path::Path;

use rustix::fd::OwnedFd;

use crate::Error;

type Result<T> = std::result::Result<T, Error>;

/// runsc's memory image in a payload: the bulk of a snapshot with memory.
pub const IMAGE: &str = "checkpoint/checkpoint.img";

/// The file name and offset of a checkpoint file's part: `checkpoint/NAME@OFFSET`, or
/// `checkpoint/checkpoint.img` (sent whole, offset 0) as an earlier version wrote it.
pub(crate) fn part_of(path: &Path) -> Option<(String, u64)> {
    if path == Path::new(IMAGE) {
        return Some(("checkpoint.img".into(), 0));
    }
    let rest = path.strip_prefix("checkpoint").ok()?.to_str()?;
    let (name, at) = rest.rsplit_once('@')?;
    let plain = !name.is_empty() && !name.contains(['/', '@']) && name != "." && name != "..";
    let digits = !at.is_empty() && at.bytes().all(|b| b.is_ascii_digit());
    match plain && digits {
        true => Some((name.to_owned(), at.parse().ok()?)),
        false => None,
    }
}

/// The checkpoint files of one restore directory, as their parts come.
pub(crate) struct Assembly {
    sub: OwnedFd,
    /// Each file's descriptor and bytes so far.
    files: std::collections::HashMap<String, (OwnedFd, u64)>,
}

fn failed(e: std::io::Error) -> Error {
    Error::Io {
        context: "putting the checkpoint together from the snapshot".into(),
        source: e,
    }
}

impl Assembly {
    /// Makes (or opens) `dir/checkpoint/`.
    pub(crate) fn new(dir: &Path) -> Result<Assembly> {
        let root = std::fs::File::open(dir).map_err(Error::io("opening the restore directory"))?;
        let sub = match cairn_contain::open_dir(root.as_fd(), "checkpoint") {
            Err(rustix::io::Errno::NOENT) => {
                rustix::fs::mkdirat(&root, "checkpoint", rustix::fs::Mode::from_raw_mode(0o700))
                    .map_err(|e| Error::io("making the checkpoint directory")(e.into()))?;
                cairn_contain::open_dir(root.as_fd(), "checkpoint")
            }
            other => other,
        }
        .map_err(|e| failed(e.into()))?;
        Ok(Assembly {
            sub,
            files: Default::default(),
        })
    }

    /// Starts the part of `name` at `offset`: a new file at 0, else where its earlier parts
    /// ended; anything else is refused.
    pub(crate) fn begin(&mut self, name: &str, offset: u64) -> Result<()> {
        if offset == 0 {
            let fd = rustix::fs::openat(
                &self.sub,
                name,
                rustix::fs::OFlags::WRONLY
                    | rustix::fs::OFlags::CREATE
                    | rustix::fs::OFlags::EXCL
                    | rustix::fs::OFlags::NOFOLLOW
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::from_raw_mode(0o600),
            )
            .map_err(|e| {
                Error::Corrupt(format!(
                    "the snapshot holds checkpoint/{name} twice or beside a link: {e}"
                ))
            })?;
            self.files.insert(name.to_owned(), (fd, 0));
        }
        match self.files.get(name) {
            Some((_, written)) if *written == offset => Ok(()),
            _ => Err(Error::Corrupt(format!(
                "the snapshot has a part of checkpoint/{name} at byte {offset}, which is not where its earlier parts end"
            ))),
        }
    }

    /// Appends `bytes` to `name` (begun).
    pub(crate) fn append(&mut self, name: &str, mut bytes: &[u8]) -> Result<()> {
        let Some((fd, written)) = self.files.get_mut(name) else {
            return Err(failed(std::io::Error::other(format!(
                "checkpoint/{name} was not begun"
            ))));
        };
        while !bytes.is_empty() {
            match rustix::io::write(&*fd, bytes) {
                Ok(0) => return Err(failed(std::io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    bytes = &bytes[n..];
                    *written += n as u64;
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(failed(e.into())),
            }
        }
        Ok(())
    }

    /// The part of `name` at `offset`: `len` bytes at `at` in `src`, copied by the kernel
    /// (copy_file_range: no pass through this process).
    pub(crate) fn copy(
        &mut self,
        src: &std::fs::File,
        name: &str,
        offset: u64,
        at: u64,
        len: u64,
    ) -> Result<()> {
        self.begin(name, offset)?;
        let Some((dst, written)) = self.files.get_mut(name) else {
            return Err(failed(std::io::Error::other("the part was not begun")));
        };
        let (mut off, mut left) = (at, len);
        while left > 0 {
            let n = rustix::fs::copy_file_range(
                src,
                Some(&mut off),
                &*dst,
                None,
                left.min(1 << 30) as usize,
            )
            .map_err(|e| failed(e.into()))?;
            if n == 0 {
                return Err(Error::Corrupt(format!(
                    "the snapshot ends inside checkpoint/{name}"
                )));
            }
            left -= n as u64;
        }
        *written += len;
        Ok(())
    }
}
