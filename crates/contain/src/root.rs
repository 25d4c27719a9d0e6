//! [`Root`]: a directory held open, with `io::Result` opens of what is below it.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags, Stat};

use crate::at::{self, DIR_NOFOLLOW};

/// A directory held open; all paths below are relative to it.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
}

impl Root {
    /// Opens `path` (a directory the caller made; the last component must not be a symlink).
    pub fn open(path: &Path) -> io::Result<Root> {
        let fd = rustix::fs::open(path, DIR_NOFOLLOW, Mode::empty())?;
        Ok(Root { fd })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens `rel` ("" = the root itself) with `flags`, confined and symlink-free.
    pub fn open_at(&self, rel: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        if rel.is_empty() {
            return Ok(rustix::fs::openat(&self.fd, ".", flags, mode)?);
        }
        Ok(at::open(self.fd(), rel, flags, mode.bits())?)
    }

    /// Opens directory `rel` ("" = the root).
    pub fn open_dir(&self, rel: &str) -> io::Result<OwnedFd> {
        self.open_at(rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
    }

    /// Opens regular file `rel` for reading; anything else is refused.
    pub fn open_file(&self, rel: &str) -> io::Result<(File, Stat)> {
        let fd = self.open_at(rel, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())?;
        regular(fd)
    }
}

/// Checks that `fd` is a regular file and returns it as a `File` with its metadata
/// (`InvalidInput` when it is something else).
pub fn regular(fd: OwnedFd) -> io::Result<(File, Stat)> {
    let stat = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok((File::from(fd), stat))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rustix::io::Errno;
    use std::io::Read;
    use std::os::unix::fs::symlink;

    #[test]
    fn opens_files_and_directories_below_and_refuses_links_and_non_files() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("d/f"), b"hi").unwrap();
        std::fs::write(outside.path().join("secret"), b"no").unwrap();
        symlink(outside.path(), tmp.path().join("out")).unwrap();
        symlink(tmp.path().join("d/f"), tmp.path().join("d/flink")).unwrap();
        let root = Root::open(tmp.path()).unwrap();

        let (mut file, stat) = root.open_file("d/f").unwrap();
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        assert_eq!((text.as_str(), stat.st_size), ("hi", 2));
        assert!(root.open_dir("").is_ok());
        assert!(root.open_dir("d").is_ok());

        let errno = |e: io::Error| Errno::from_io_error(&e);
        assert_eq!(
            errno(root.open_file("out/secret").unwrap_err()),
            Some(Errno::LOOP)
        );
        assert_eq!(
            errno(root.open_file("d/flink").unwrap_err()),
            Some(Errno::LOOP)
        );
        // O_NOFOLLOW|O_DIRECTORY on a link: openat2 says ENOTDIR, the component walk ELOOP.
        let dir_link = errno(root.open_dir("out").unwrap_err());
        assert!(
            matches!(dir_link, Some(Errno::NOTDIR | Errno::LOOP)),
            "{dir_link:?}"
        );
        assert_eq!(
            errno(root.open_file("d/none").unwrap_err()),
            Some(Errno::NOENT)
        );
        // A directory is no regular file: InvalidInput, which callers tell apart from errnos.
        assert_eq!(
            root.open_file("d").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // The root itself may not be a link.
        assert!(Root::open(&tmp.path().join("out")).is_err());
    }

    #[test]
    fn every_descriptor_is_close_on_exec_and_no_follow_with_the_callers_flags_kept() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("d/f"), b"x").unwrap();
        let root = Root::open(tmp.path()).unwrap();
        let fd_flags = |fd: BorrowedFd<'_>| {
            let cloexec = rustix::io::fcntl_getfd(fd).unwrap();
            (
                cloexec.contains(rustix::io::FdFlags::CLOEXEC),
                rustix::fs::fcntl_getfl(fd).unwrap(),
            )
        };
        let dir = OFlags::RDONLY | OFlags::DIRECTORY;
        let file = OFlags::RDONLY | OFlags::NONBLOCK;
        // (what, the descriptor, flags it must have been opened with)
        let opened: Vec<(&str, OwnedFd, OFlags)> = vec![
            ("root", root.open_dir("").unwrap(), dir),
            ("dir", root.open_dir("d").unwrap(), dir),
            (
                "file",
                OwnedFd::from(root.open_file("d/f").unwrap().0),
                file,
            ),
            // Callers' flags with O_CLOEXEC or O_NOFOLLOW of their own keep them.
            (
                "root, cloexec given",
                root.open_at("", dir | OFlags::CLOEXEC, Mode::empty())
                    .unwrap(),
                dir,
            ),
            (
                "file, cloexec given",
                root.open_at("d/f", file | OFlags::CLOEXEC, Mode::empty())
                    .unwrap(),
                file,
            ),
            (
                "root, nofollow given",
                root.open_at("", dir | OFlags::NOFOLLOW, Mode::empty())
                    .unwrap(),
                dir,
            ),
            (
                "file, nofollow given",
                root.open_at("d/f", file | OFlags::NOFOLLOW, Mode::empty())
                    .unwrap(),
                file,
            ),
        ];
        for (what, fd, want) in &opened {
            let (cloexec, flags) = fd_flags(fd.as_fd());
            assert!(cloexec, "{what}: would reach an exec'd program");
            assert!(flags.contains(OFlags::NOFOLLOW), "{what}: {flags:?}");
            assert!(flags.contains(*want), "{what}: {flags:?}, not {want:?}");
        }
        // A directory open is refused on a file.
        let errno = |e: io::Error| Errno::from_io_error(&e);
        assert_eq!(
            errno(root.open_dir("d/f").unwrap_err()),
            Some(Errno::NOTDIR)
        );
    }
}
