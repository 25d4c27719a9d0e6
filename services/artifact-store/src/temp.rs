//! Temp files of writes: an unnamed O_TMPFILE inode in the target's directory where the
//! filesystem has it (nothing to clean after a crash), else a `.cairn-tmp-*` name created with
//! O_CREAT|O_EXCL and unlinked on drop unless it was published.
//!
//! May depend on: layout (the temp prefix), cairn-contain.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use cairn_contain as contain;
use rustix::fs::{AtFlags, OFlags, RenameFlags};
use rustix::io::Errno;

use crate::layout::TEMP_PREFIX;

/// The temp file of one write: an unnamed inode in the target's directory (O_TMPFILE, where
/// the filesystem has it: nothing to clean after a crash) or a `.cairn-tmp-*` name, unlinked on
/// drop unless it was published.
#[derive(Debug)]
pub(crate) struct TempFile {
    dir: Arc<OwnedFd>,
    /// None while the inode has no name.
    name: Option<String>,
    armed: bool,
}

impl TempFile {
    pub(crate) fn create(
        dir: Arc<OwnedFd>,
        unnamed: bool,
    ) -> std::result::Result<(TempFile, File), Errno> {
        if unnamed {
            match rustix::fs::openat(
                dir.as_fd(),
                ".",
                OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC,
                rustix::fs::Mode::from_raw_mode(contain::FILE_MODE),
            ) {
                Ok(fd) => {
                    let temp = TempFile {
                        dir,
                        name: None,
                        armed: false,
                    };
                    return Ok((temp, File::from(fd)));
                }
                // This directory's filesystem has no O_TMPFILE: use a name.
                Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {}
                Err(e) => return Err(e),
            }
        }
        let name = temp_name();
        let fd = rustix::fs::openat(
            dir.as_fd(),
            name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            rustix::fs::Mode::from_raw_mode(contain::FILE_MODE),
        )?;
        Ok((
            TempFile {
                dir,
                name: Some(name),
                armed: true,
            },
            File::from(fd),
        ))
    }

    /// Links the file at `name` in its directory, failing with EEXIST when something is there
    /// (the atomic no-replace publish).
    pub(crate) fn link_as(&mut self, file: &File, name: &str) -> std::result::Result<(), Errno> {
        match &self.name {
            None => link_unnamed(file, self.dir.as_fd(), name),
            Some(tmp) => match rustix::fs::renameat_with(
                self.dir.as_fd(),
                tmp.as_str(),
                self.dir.as_fd(),
                name,
                RenameFlags::NOREPLACE,
            ) {
                Ok(()) => {
                    self.armed = false;
                    Ok(())
                }
                // Filesystems without RENAME_NOREPLACE: link(2) also refuses an existing
                // target atomically; the temp name is then unlinked by the guard.
                Err(Errno::INVAL) => rustix::fs::linkat(
                    self.dir.as_fd(),
                    tmp.as_str(),
                    self.dir.as_fd(),
                    name,
                    AtFlags::empty(),
                ),
                Err(e) => Err(e),
            },
        }
    }

    /// Moves the file over `name`, replacing what is there (an unnamed inode first gets a
    /// temp name, since only rename replaces atomically).
    pub(crate) fn replace(&mut self, file: &File, name: &str) -> std::result::Result<(), Errno> {
        let tmp = match &self.name {
            Some(tmp) => tmp.clone(),
            None => {
                let tmp = temp_name();
                link_unnamed(file, self.dir.as_fd(), &tmp)?;
                self.name = Some(tmp.clone());
                self.armed = true;
                tmp
            }
        };
        rustix::fs::renameat(self.dir.as_fd(), tmp.as_str(), self.dir.as_fd(), name)?;
        self.armed = false;
        Ok(())
    }
}

fn temp_name() -> String {
    format!("{TEMP_PREFIX}{}", uuid::Uuid::new_v4().simple())
}

/// Gives an O_TMPFILE inode the name `name` in `dir` (through its /proc/self/fd link; EEXIST
/// when the name is taken).
fn link_unnamed(file: &File, dir: BorrowedFd<'_>, name: &str) -> std::result::Result<(), Errno> {
    use std::os::fd::AsRawFd;
    rustix::fs::linkat(
        rustix::fs::CWD,
        format!("/proc/self/fd/{}", file.as_raw_fd()).as_str(),
        dir,
        name,
        AtFlags::SYMLINK_FOLLOW,
    )
}

/// Whether unnamed temp files work under `dir` (O_TMPFILE, and /proc to name them).
pub(crate) fn unnamed_temps_work(dir: BorrowedFd<'_>) -> bool {
    let Ok((mut temp, file)) = TempFile::create(
        Arc::new(match rustix::io::dup(dir) {
            Ok(fd) => fd,
            Err(_) => return false,
        }),
        true,
    ) else {
        return false;
    };
    if temp.name.is_some() {
        return false;
    }
    let probe = temp_name();
    let linked = temp.link_as(&file, &probe).is_ok();
    if linked {
        let _ = rustix::fs::unlinkat(dir, probe.as_str(), AtFlags::empty());
    }
    linked
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let (true, Some(name)) = (self.armed, &self.name) {
            let _ = rustix::fs::unlinkat(self.dir.as_fd(), name.as_str(), AtFlags::empty());
        }
    }
}
