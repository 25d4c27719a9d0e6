//! Reading: Get (a file or a byte range of it, streamed), Stat and List. Reads walk beneath the
//! project root like writes and never follow a symlink; a symlink is listed as "other" and never
//! served. Paths a client could not address (denylisted, temp files, names pathguard refuses)
//! are not listed.
//!
//! May depend on: state, layout, page, stamp, error, cairn-contain.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use bytes::Bytes;
use rustix::fs::{FileType, OFlags, Stat};
use rustix::io::Errno;
use tokio::sync::mpsc;

use cairn_contain as contain;

use crate::error::{refusal, Error, Result};
use crate::layout::{check_id, TEMP_PREFIX};
use crate::page::Page;
use crate::stamp::mtime_of;
use crate::state::{blocking, State};

/// Kind of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Directory,
    /// Symlink, fifo, socket, device: never followed or served.
    Other,
}

/// Description of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub kind: Kind,
    pub size_bytes: u64,
    /// Hex sha256 ("" unless computed).
    pub sha256: String,
    pub modified_at: String,
}

impl Entry {
    fn of(path: String, st: &Stat) -> Entry {
        let kind = match contain::kind(st) {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Directory,
            _ => Kind::Other,
        };
        let size_bytes = if kind == Kind::File {
            u64::try_from(st.st_size).unwrap_or(0)
        } else {
            0
        };
        Entry {
            path,
            kind,
            size_bytes,
            sha256: String::new(),
            modified_at: mtime_of(st),
        }
    }
}

/// Opens a regular file beneath `root` for reading, refusing anything else.
fn open_file(root: BorrowedFd<'_>, project: &str, path: &str) -> Result<(File, Stat)> {
    let fd = contain::open(root, path, OFlags::RDONLY | OFlags::NONBLOCK, 0)
        .map_err(|e| refusal(e, project, path, "reading"))?;
    let file = File::from(fd);
    let st = rustix::fs::fstat(&file).map_err(|e| Error::io(format!("stat of {path:?}"), e))?;
    match contain::kind(&st) {
        FileType::RegularFile => Ok((file, st)),
        FileType::Directory => Err(Error::NotAFile {
            path: path.to_owned(),
            found: "a directory is there, not a file; use List to see what it holds",
        }),
        _ => Err(Error::NotAFile {
            path: path.to_owned(),
            found: "a special file is there; only regular files are served",
        }),
    }
}

/// Get: the file's description (whole-file size and sha256) and a stream of the requested
/// range in chunks of the configured size.
pub async fn get(
    state: &Arc<State>,
    project: &str,
    path: &str,
    offset: u64,
    length: u64,
) -> Result<(Entry, mpsc::Receiver<Result<Bytes>>)> {
    check_id("project", project)?;
    let path = state.layout.read_path(path)?.to_string();
    state.slots.settled(project, &path).await;
    let (state2, project2) = (state.clone(), project.to_owned());
    let (entry, file) = blocking(move || {
        let root = state2.layout.project_root(&project2)?;
        let (file, st) = open_file(root.as_fd(), &project2, &path)?;
        let digest = state2
            .digests
            .of_file(&file)
            .map_err(|e| Error::io(format!("reading {path:?}"), e))?;
        let mut entry = Entry::of(path, &st);
        entry.size_bytes = digest.size_bytes;
        entry.sha256 = digest.sha256;
        Ok((entry, file))
    })
    .await?;
    if offset > entry.size_bytes {
        return Err(Error::BadRequest(format!(
            "offset {offset} is past the end of {:?} ({} bytes); use an offset up to the size",
            entry.path, entry.size_bytes
        )));
    }
    let end = match length {
        0 => entry.size_bytes,
        n => offset.saturating_add(n).min(entry.size_bytes),
    };
    let chunk = state.config.chunk_bytes;
    let (tx, rx) = mpsc::channel(4);
    let name = entry.path.clone();
    tokio::task::spawn_blocking(move || {
        let mut pos = offset;
        while pos < end {
            let want = chunk.min((end - pos) as usize);
            // Read into spare capacity: no zero-filling of every chunk first.
            let mut buf = Vec::with_capacity(want);
            let got = match rustix::io::pread(&file, rustix::buffer::spare_capacity(&mut buf), pos)
                .map_err(std::io::Error::from)
            {
                Ok(0) => {
                    let _ = tx.blocking_send(Err(Error::io(
                        format!("reading {name:?}"),
                        std::io::Error::other("the file shrank while it was read"),
                    )));
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = tx.blocking_send(Err(Error::io(format!("reading {name:?}"), e)));
                    return;
                }
            };
            pos += got as u64;
            if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                return;
            }
        }
    });
    Ok((entry, rx))
}

/// Stat: one entry ("" = the project root), optionally with the file's sha256.
pub async fn stat(
    state: &Arc<State>,
    project: &str,
    path: &str,
    include_sha256: bool,
) -> Result<Entry> {
    check_id("project", project)?;
    let path = if path.is_empty() {
        String::new()
    } else {
        state.layout.read_path(path)?.to_string()
    };
    state.slots.settled(project, &path).await;
    let (state, project) = (state.clone(), project.to_owned());
    blocking(move || {
        let root = state.layout.project_root(&project)?;
        if path.is_empty() {
            let st =
                rustix::fs::fstat(&root).map_err(|e| Error::io("stat of the project root", e))?;
            return Ok(Entry::of(path, &st));
        }
        let (parent, name) = contain::split_parent(&path);
        let dir = contain::open_dir(root.as_fd(), parent)
            .map_err(|e| refusal(e, &project, &path, "looking at"))?;
        let st = contain::stat(dir.as_fd(), name)
            .map_err(|e| refusal(e, &project, &path, "looking at"))?;
        let mut entry = Entry::of(path.clone(), &st);
        if entry.kind == Kind::File && include_sha256 {
            let (file, _) = open_file(dir.as_fd(), &project, name).map_err(|e| match e {
                Error::NotAFile { found, .. } => Error::NotAFile {
                    path: entry.path.clone(),
                    found,
                },
                other => other,
            })?;
            let digest = state
                .digests
                .of_file(&file)
                .map_err(|e| Error::io(format!("reading {:?}", entry.path), e))?;
            entry.size_bytes = digest.size_bytes;
            entry.sha256 = digest.sha256;
        }
        Ok(entry)
    })
    .await
}

/// One List page's walk: each directory's names are read and sorted so that paths come out in
/// byte order (a directory's subtree sorts as its name followed by `/`); names at or before
/// the page token are passed over without a stat (whole subtrees of them unopened), and the
/// walk stops one entry past the page.
struct Walk<'a> {
    state: &'a State,
    project: &'a str,
    recursive: bool,
    after: Option<&'a str>,
    want: usize,
}

impl Walk<'_> {
    fn dir(&self, dir: &OwnedFd, rel: &str, out: &mut Vec<Entry>) -> Result<()> {
        let names = match contain::read_dir(dir.as_fd()) {
            Ok(names) => names,
            // A directory removed while listing holds nothing.
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(refusal(e, self.project, rel, "listing")),
        };
        let mut items: Vec<(String, String, FileType)> = names
            .into_iter()
            .filter(|(name, _)| !name.starts_with(TEMP_PREFIX))
            .map(|(name, mut kind)| {
                let path = if rel.is_empty() {
                    name.clone()
                } else {
                    format!("{rel}/{name}")
                };
                if self.recursive && kind == FileType::Unknown {
                    kind = contain::stat(dir.as_fd(), &name)
                        .map_or(FileType::Unknown, |st| contain::kind(&st));
                }
                (path, name, kind)
            })
            .collect();
        let key = |(path, _, kind): &(String, String, FileType)| {
            let mut key = path.clone().into_bytes();
            if self.recursive && *kind == FileType::Directory {
                key.push(b'/');
            }
            key
        };
        items.sort_by_cached_key(key);
        for (path, name, kind) in items {
            if out.len() >= self.want {
                return Ok(());
            }
            let descend = self.recursive && kind == FileType::Directory;
            let passed = match self.after {
                // Every path of the subtree sorts before `path` + "0" ('/' < '0').
                Some(after) if descend => after.as_bytes() >= format!("{path}0").as_bytes(),
                Some(after) => path.as_bytes() <= after.as_bytes(),
                None => false,
            };
            if passed || self.state.layout.read_policy.check(&path).is_err() {
                continue;
            }
            if descend {
                // Swapped for a symlink since it was listed: ELOOP, skipped.
                if let Ok(sub) = contain::open_dir(dir.as_fd(), &name) {
                    self.dir(&sub, &path, out)?;
                }
                continue;
            }
            let Ok(st) = contain::stat(dir.as_fd(), &name) else {
                continue;
            };
            let entry = Entry::of(path, &st);
            if !self.recursive || entry.kind == Kind::File {
                out.push(entry);
            }
        }
        Ok(())
    }
}

/// List: entries under `prefix` in byte order of their paths, one page.
pub async fn list(
    state: &Arc<State>,
    project: &str,
    prefix: &str,
    recursive: bool,
    page: Page,
) -> Result<(Vec<Entry>, String)> {
    check_id("project", project)?;
    let trimmed = prefix.strip_suffix('/').unwrap_or(prefix);
    let prefix = if trimmed.is_empty() {
        String::new()
    } else {
        state.layout.read_path(trimmed)?.to_string()
    };
    state.slots.settled_under(project, &prefix).await;
    let (state, project) = (state.clone(), project.to_owned());
    blocking(move || {
        let root = state.layout.project_root(&project)?;
        let dir = contain::open_dir(root.as_fd(), &prefix).map_err(|e| match e {
            Errno::NOTDIR => Error::NotAFile {
                path: prefix.clone(),
                found:
                    "a file is there; List takes a directory prefix (use Stat or Get for a file)",
            },
            e => refusal(e, &project, &prefix, "listing"),
        })?;
        // In byte order of paths, from the page token on, until one entry past the page.
        let mut entries = Vec::new();
        let walk = Walk {
            state: &state,
            project: &project,
            recursive,
            after: page.after.as_deref(),
            want: page.size.saturating_add(1),
        };
        walk.dir(&dir, &prefix, &mut entries)?;
        Ok(page.cut(entries, |e| e.path.as_str()))
    })
    .await
}
