//! Places tar entries into a sandbox session's areas (its `workspace` and `tmpfs`
//! directories) by descriptor, never by path: each entry is
//! made with `*at` calls relative to its parent directory held open beneath the area's root,
//! no link followed (a link is made as a link, never written through). Areas the engine
//! mounted are reached through the session container's root in /proc, which path-based
//! unpacking (it canonicalizes) would resolve against the runner's own root instead.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use cairn_contain::Root;
use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps};

/// Why an entry could not be placed.
#[derive(Debug, thiserror::Error)]
pub enum GraftError {
    /// The entry itself is not acceptable (a name, a kind).
    #[error("{0}")]
    Refused(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> GraftError {
    let context = context.into();
    move |source| GraftError::Io { context, source }
}

/// The areas of one session: its `workspace` and `tmpfs` roots.
pub struct AreaRoots {
    workspace: Root,
    tmpfs: Root,
    owner: Option<(u32, u32)>,
}

impl AreaRoots {
    /// Opens `<dir>/workspace` and `<dir>/tmpfs`; what is placed is given to `owner`.
    pub fn open(dir: &Path, owner: Option<(u32, u32)>) -> std::io::Result<AreaRoots> {
        Ok(AreaRoots {
            workspace: Root::open(&dir.join("workspace"))?,
            tmpfs: Root::open(&dir.join("tmpfs"))?,
            owner,
        })
    }

    /// The root an entry named `workspace/...` or `tmpfs/...` goes beneath.
    pub fn takes(&self, top: &str) -> Option<&Root> {
        match top {
            "workspace" => Some(&self.workspace),
            "tmpfs" => Some(&self.tmpfs),
            _ => None,
        }
    }

    /// Places `entry` (named `<area>/<rest>`) beneath its area.
    pub fn place<R: Read>(&self, entry: &mut tar::Entry<'_, R>) -> Result<(), GraftError> {
        let name = entry
            .path()
            .map_err(|e| GraftError::Refused(format!("an entry name is unreadable: {e}")))?
            .into_owned();
        let shown = name.display().to_string();
        let text = name
            .to_str()
            .ok_or_else(|| GraftError::Refused(format!("{shown:?} is not UTF-8")))?;
        let parts: Vec<&str> = text.split('/').filter(|p| !p.is_empty()).collect();
        if text.starts_with('/') || parts.iter().any(|p| *p == "." || *p == "..") {
            return Err(GraftError::Refused(format!(
                "{shown} is absolute or holds . or .."
            )));
        }
        let Some((top, rest)) = parts.split_first() else {
            return Err(GraftError::Refused("an entry has an empty name".into()));
        };
        let root = self.takes(top).ok_or_else(|| {
            GraftError::Refused(format!("{shown} is outside workspace/ and tmpfs/"))
        })?;
        let Some((leaf, parents)) = rest.split_last() else {
            // The area itself: it exists already.
            return Ok(());
        };
        let parent = self.parent(root, parents, &shown)?;
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode().unwrap_or(0o644) & 0o777;
        let mtime = header.mtime().ok();
        if kind.is_dir() {
            match rustix::fs::mkdirat(&parent, *leaf, Mode::from_raw_mode(mode)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(io(format!("making {shown}"))(e.into())),
            }
            let dir = cairn_contain::open_dir(parent.as_fd(), leaf)
                .map_err(|e| io(format!("opening {shown}"))(e.into()))?;
            rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode))
                .map_err(|e| io(format!("setting the mode of {shown}"))(e.into()))?;
            self.give(&dir, &shown)
        } else if kind.is_file() {
            let file = rustix::fs::openat(
                &parent,
                *leaf,
                OFlags::WRONLY
                    | OFlags::CREATE
                    | OFlags::TRUNC
                    | OFlags::NOFOLLOW
                    | OFlags::CLOEXEC,
                Mode::from_raw_mode(mode),
            )
            .map_err(|e| io(format!("creating {shown}"))(e.into()))?;
            let mut out = std::fs::File::from(file);
            std::io::copy(entry, &mut out).map_err(io(format!("writing {shown}")))?;
            let fd: OwnedFd = out.into();
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
                .map_err(|e| io(format!("setting the mode of {shown}"))(e.into()))?;
            if let Some(secs) = mtime {
                let at = Timespec {
                    tv_sec: secs as i64,
                    tv_nsec: 0,
                };
                let _ = rustix::fs::futimens(
                    &fd,
                    &Timestamps {
                        last_access: at,
                        last_modification: at,
                    },
                );
            }
            self.give(&fd, &shown)
        } else if kind.is_symlink() {
            let target = entry
                .link_name()
                .map_err(|e| GraftError::Refused(format!("the link {shown} is unreadable: {e}")))?
                .ok_or_else(|| GraftError::Refused(format!("the link {shown} has no target")))?
                .into_owned();
            match rustix::fs::symlinkat(&target, &parent, *leaf) {
                Ok(()) => {}
                Err(rustix::io::Errno::EXIST) => {
                    rustix::fs::unlinkat(&parent, *leaf, AtFlags::empty())
                        .map_err(|e| io(format!("replacing {shown}"))(e.into()))?;
                    rustix::fs::symlinkat(&target, &parent, *leaf)
                        .map_err(|e| io(format!("making the link {shown}"))(e.into()))?;
                }
                Err(e) => return Err(io(format!("making the link {shown}"))(e.into())),
            }
            if let Some((uid, gid)) = self.owner {
                rustix::fs::chownat(
                    &parent,
                    *leaf,
                    Some(rustix::fs::Uid::from_raw(uid)),
                    Some(rustix::fs::Gid::from_raw(gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(|e| io(format!("giving {shown} to the sandbox user"))(e.into()))?;
            }
            Ok(())
        } else {
            Err(GraftError::Refused(format!(
                "{shown} is of a kind sessions do not keep (only files, directories and links)"
            )))
        }
    }

    /// The directory `parents` beneath `root`, made (0755, the owner's) where missing.
    fn parent(&self, root: &Root, parents: &[&str], shown: &str) -> Result<OwnedFd, GraftError> {
        let mut dir = root
            .open_dir("")
            .map_err(io(format!("opening the area of {shown}")))?;
        for part in parents {
            let next = match cairn_contain::open_dir(dir.as_fd(), part) {
                Err(rustix::io::Errno::NOENT) => {
                    match rustix::fs::mkdirat(&dir, *part, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => {
                            return Err(io(format!("making a directory of {shown}"))(e.into()))
                        }
                    }
                    let made = cairn_contain::open_dir(dir.as_fd(), part)
                        .map_err(|e| io(format!("opening a directory of {shown}"))(e.into()))?;
                    self.give(&made, shown)?;
                    made
                }
                other => {
                    other.map_err(|e| io(format!("opening a directory of {shown}"))(e.into()))?
                }
            };
            dir = next;
        }
        Ok(dir)
    }

    fn give(&self, fd: &OwnedFd, shown: &str) -> Result<(), GraftError> {
        if let Some((uid, gid)) = self.owner {
            rustix::fs::fchown(
                fd,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            )
            .map_err(|e| io(format!("giving {shown} to the sandbox user"))(e.into()))?;
        }
        Ok(())
    }
}

/// Copies the tree at `src` (a directory on this host) into the area `top` ("workspace")
/// of `areas`, through a tar stream between two threads: links kept as links.
pub fn copy_tree(src: &Path, top: &'static str, areas: &AreaRoots) -> Result<(), GraftError> {
    let (reader, writer) = std::io::pipe().map_err(io("making a pipe"))?;
    let source = src.to_path_buf();
    let producer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut tar = tar::Builder::new(writer);
        tar.follow_symlinks(false);
        tar.append_dir_all(top, &source)?;
        tar.into_inner().map(drop)
    });
    let mut archive = tar::Archive::new(reader);
    let placed = (|| {
        for entry in archive.entries().map_err(io("reading the copied tree"))? {
            let mut entry = entry.map_err(io("reading the copied tree"))?;
            areas.place(&mut entry)?;
        }
        Ok(())
    })();
    // Ends the producer if placing stopped early (it then meets a closed pipe).
    drop(archive);
    let produced = producer
        .join()
        .map_err(|_| GraftError::Refused("the copying thread panicked".into()))?;
    placed?;
    produced.map_err(io(format!("reading {}", src.display())))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn areas(dir: &Path) -> AreaRoots {
        for sub in ["workspace", "tmpfs"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        AreaRoots::open(dir, None).unwrap()
    }

    fn archive(entries: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data, link) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o640);
            h.set_size(data.len() as u64);
            if !link.is_empty() {
                h.set_link_name(link).unwrap();
            }
            // Raw names: the builder's own checks would refuse the bad ones we test.
            let raw = &mut h.as_old_mut().name;
            raw[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn place_all(a: &AreaRoots, bytes: &[u8]) -> Result<(), GraftError> {
        let mut ar = tar::Archive::new(bytes);
        for e in ar.entries().unwrap() {
            a.place(&mut e.unwrap())?;
        }
        Ok(())
    }

    #[test]
    fn files_dirs_and_links_land_beneath_their_area_with_their_modes() {
        let dir = tempfile::tempdir().unwrap();
        let a = areas(dir.path());
        let bytes = archive(&[
            ("workspace/src/", tar::EntryType::Directory, b"", ""),
            ("workspace/src/a.txt", tar::EntryType::Regular, b"hello", ""),
            ("workspace/deep/er/b.txt", tar::EntryType::Regular, b"b", ""),
            ("workspace/ln", tar::EntryType::Symlink, b"", "/etc/passwd"),
            ("tmpfs/.bashrc", tar::EntryType::Regular, b"rc", ""),
        ]);
        place_all(&a, &bytes).unwrap();
        let ws = dir.path().join("workspace");
        assert_eq!(std::fs::read(ws.join("src/a.txt")).unwrap(), b"hello");
        assert_eq!(std::fs::read(ws.join("deep/er/b.txt")).unwrap(), b"b");
        assert_eq!(
            std::fs::read(dir.path().join("tmpfs/.bashrc")).unwrap(),
            b"rc"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(ws.join("src/a.txt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        // A link is made as a link, never followed.
        assert_eq!(
            std::fs::read_link(ws.join("ln")).unwrap(),
            Path::new("/etc/passwd")
        );
    }

    #[test]
    fn a_planted_link_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let a = areas(dir.path());
        let ws = dir.path().join("workspace");
        std::os::unix::fs::symlink(outside.path(), ws.join("dir")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("f"), ws.join("file")).unwrap();
        for name in ["workspace/dir/x", "workspace/file"] {
            let bytes = archive(&[(name, tar::EntryType::Regular, b"evil", "")]);
            let e = place_all(&a, &bytes).unwrap_err();
            assert!(matches!(e, GraftError::Io { .. }), "{name}: {e}");
        }
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn names_outside_the_areas_and_odd_kinds_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = areas(dir.path());
        for (name, kind) in [
            ("other/x", tar::EntryType::Regular),
            ("workspace/../x", tar::EntryType::Regular),
            ("/workspace/x", tar::EntryType::Regular),
            ("workspace/fifo", tar::EntryType::Fifo),
        ] {
            let bytes = archive(&[(name, kind, b"", "")]);
            let e = place_all(&a, &bytes).unwrap_err();
            assert!(matches!(e, GraftError::Refused(_)), "{name}: {e}");
        }
        assert!(!dir.path().join("x").exists() && !dir.path().join("other").exists());
    }

    #[test]
    fn a_tree_is_copied_into_an_area_links_kept() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join(".git/objects")).unwrap();
        std::fs::write(src.path().join(".git/HEAD"), "ref").unwrap();
        std::fs::write(src.path().join("main.py"), "print(1)").unwrap();
        std::os::unix::fs::symlink("main.py", src.path().join("link.py")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let a = areas(dir.path());
        copy_tree(src.path(), "workspace", &a).unwrap();
        let ws = dir.path().join("workspace");
        assert_eq!(std::fs::read(ws.join(".git/HEAD")).unwrap(), b"ref");
        assert!(ws.join(".git/objects").is_dir());
        assert_eq!(
            std::fs::read_link(ws.join("link.py")).unwrap(),
            Path::new("main.py")
        );
        assert_eq!(std::fs::read(ws.join("main.py")).unwrap(), b"print(1)");
    }
}
