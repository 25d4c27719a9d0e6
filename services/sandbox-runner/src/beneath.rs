//! Confined file access beneath a held directory handle: every open resolves with
//! RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS (openat2), and walks open each entry with O_NOFOLLOW
//! relative to its parent's descriptor. Sandboxed code may plant symlinks or swap files while we
//! look (sessions keep running); this module must never follow a link nor leave the root.

use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};

/// How deep a walk descends before it stops (deeper trees are reported as truncated).
const MAX_DEPTH: usize = 64;

fn resolve() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

/// A directory held open; all paths below are relative to it.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
}

impl Root {
    /// Opens `path` (a directory the runner made; the last component must not be a symlink).
    pub fn open(path: &Path) -> io::Result<Root> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Root { fd })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens `rel` ("" = the root itself) with `flags`, confined and symlink-free.
    pub fn open_at(&self, rel: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let rel = if rel.is_empty() { "." } else { rel };
        Ok(rustix::fs::openat2(
            &self.fd,
            rel,
            flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            mode,
            resolve(),
        )?)
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

/// Checks that `fd` is a regular file and returns it as a `File` with its metadata.
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

/// What a walk found at one name (from lstat: links are reported, never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// Fifo, socket, device.
    Special,
}

/// One entry met by [`walk`].
pub struct Entry<'a> {
    /// Path relative to the walk's start, '/'-joined raw bytes (may be non-UTF-8).
    pub rel: &'a [u8],
    pub kind: Kind,
    pub stat: &'a Stat,
    parent: BorrowedFd<'a>,
    name: &'a CStr,
}

impl Entry<'_> {
    /// The path as UTF-8, if it is.
    pub fn rel_str(&self) -> Option<&str> {
        std::str::from_utf8(self.rel).ok()
    }

    /// Opens this entry as a regular file, without following a link swapped in since the walk
    /// looked at it.
    pub fn open_file(&self) -> io::Result<(File, Stat)> {
        let fd = rustix::fs::openat(
            self.parent,
            self.name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        regular(fd)
    }
}

/// What the visitor wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    Continue,
    /// Do not descend into this directory.
    SkipDir,
    Stop,
}

/// Walks the directory `dir` depth-first in name order, calling `visit` for every entry
/// (directories before their contents). Returns false when stopped early (by the visitor or
/// the depth cap).
pub fn walk(dir: BorrowedFd<'_>, visit: &mut dyn FnMut(&Entry<'_>) -> Visit) -> io::Result<bool> {
    walk_to(dir, MAX_DEPTH, visit)
}

/// [`walk`] with its own depth cap (one descriptor is held per level).
pub fn walk_to(
    dir: BorrowedFd<'_>,
    max_depth: usize,
    visit: &mut dyn FnMut(&Entry<'_>) -> Visit,
) -> io::Result<bool> {
    let mut prefix = Vec::new();
    walk_dir(dir, &mut prefix, 0, max_depth, visit)
}

fn walk_dir(
    dir: BorrowedFd<'_>,
    prefix: &mut Vec<u8>,
    depth: usize,
    max_depth: usize,
    visit: &mut dyn FnMut(&Entry<'_>) -> Visit,
) -> io::Result<bool> {
    if depth > max_depth {
        return Ok(false);
    }
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        names.push(name.to_owned());
    }
    names.sort();
    for name in names {
        let stat = match rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            // Removed while we looked (the sandbox may still run): nothing to report.
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        let kind = match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            _ => Kind::Special,
        };
        let mark = prefix.len();
        if !prefix.is_empty() {
            prefix.push(b'/');
        }
        prefix.extend_from_slice(name.to_bytes());
        let step = visit(&Entry {
            rel: prefix,
            kind,
            stat: &stat,
            parent: dir,
            name: &name,
        });
        let keep_going = match step {
            Visit::Stop => false,
            Visit::SkipDir => true,
            Visit::Continue if kind == Kind::Dir => {
                match rustix::fs::openat(
                    dir,
                    name.as_c_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(sub) => walk_dir(sub.as_fd(), prefix, depth + 1, max_depth, visit)?,
                    // Swapped for a link or removed since lstat: skip it.
                    Err(
                        rustix::io::Errno::NOENT
                        | rustix::io::Errno::LOOP
                        | rustix::io::Errno::NOTDIR,
                    ) => true,
                    Err(e) => return Err(e.into()),
                }
            }
            Visit::Continue => true,
        };
        prefix.truncate(mark);
        if !keep_going {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Lossy display of raw path bytes (for reports).
pub fn lossy(bytes: &[u8]) -> String {
    OsStr::from_bytes(bytes).to_string_lossy().into_owned()
}
