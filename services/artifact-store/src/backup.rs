//! Online backups and restores of whole projects.
//!
//! A backup is a gzip tar of `projects/<project>/...` whose last entry, `cairn-backup.json`,
//! lists every file with its sha256 and size. It is taken while the store serves:
//! - every run's `events.jsonl` is cut at the length it had when the project's backup began
//!   (and at the last whole line before it): logs only grow, so that prefix never changes,
//!   and it is read before the run's other files, so every event's files are there too;
//! - every other file is published by rename, so the file opened is one whole version, and
//!   its digest is taken from the very bytes written into the backup;
//! - caches the store rebuilds (`events.idx`, the run index) and temp files are left out.
//!
//! A restore unpacks into a staging directory beside `projects/`, checks every file against
//! the list (and the gzip checksum), and only then renames each project into place: a project
//! appears whole or not at all, and a damaged backup restores nothing.
//!
//! May depend on: state, layout, project (its layout), run_index (project ids), error,
//! cairn-contain.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use cairn_sha256::Sha256;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use serde::{Deserialize, Serialize};

use cairn_contain as contain;

use crate::error::{Error, Result};
use crate::layout::{check_id, EVENTS_FILE, EVENTS_INDEX_FILE, TEMP_PREFIX};
use crate::project::LAYOUT;
use crate::run_index::RunIndex;
use crate::stamp::timestamp_now;
use crate::state::State;

/// The backup's list of its files, its last entry.
pub const MANIFEST: &str = "cairn-backup.json";
const FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    created_at: String,
    projects: BTreeMap<String, Vec<FileDigest>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FileDigest {
    path: String,
    sha256: String,
    size_bytes: u64,
}

/// What a restore wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    pub projects: Vec<String>,
    pub files: u64,
    pub bytes: u64,
}

/// Reads exactly `want` bytes of `inner` (fewer is an error: a tar entry must be as long as
/// its header says), hashing them.
struct Hashing<R> {
    inner: R,
    want: u64,
    read: u64,
    hasher: Sha256,
}

impl<R: Read> Hashing<R> {
    fn new(inner: R, want: u64) -> Self {
        Hashing {
            inner,
            want,
            read: 0,
            hasher: Sha256::new(),
        }
    }

    fn digest(self, path: String) -> FileDigest {
        FileDigest {
            path,
            sha256: self.hasher.finish_hex(),
            size_bytes: self.read,
        }
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.want - self.read;
        if left == 0 {
            return Ok(0);
        }
        let max = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..max])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank while it was read",
            ));
        }
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

/// The projects the store has.
pub fn existing_projects(state: &State) -> Vec<String> {
    RunIndex::project_ids(state)
}

/// Length of the whole lines among the first `len` bytes of a log.
fn whole_lines(file: &File, len: u64) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut end = len;
    let mut buf = vec![0u8; 64 << 10];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let part = &mut buf[..(end - start) as usize];
        file.read_exact_at(part, start)?;
        if let Some(i) = memchr::memrchr(b'\n', part) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

fn is_log(rel: &str) -> bool {
    rel.starts_with(".cairn/runs/") && rel.ends_with(&format!("/{EVENTS_FILE}"))
}

/// Writes a backup of `projects` to `out` (blocking).
pub fn write(state: &State, projects: &[String], out: impl Write) -> Result<()> {
    let io_err = |what: &str| {
        let what = what.to_owned();
        move |e: io::Error| Error::io(what, e)
    };
    let mut tar = tar::Builder::new(GzEncoder::new(out, flate2::Compression::fast()));
    let mut manifest = Manifest {
        format: FORMAT,
        created_at: timestamp_now(),
        projects: BTreeMap::new(),
    };
    for project in projects {
        let root = state.layout.project_root(project)?;
        // Every log's length first: the events kept are all older than any file read below.
        let mut logs = BTreeMap::new();
        contain::walk(root.as_fd(), &mut |e| {
            if let (Some(rel), contain::Kind::File) = (e.rel_str(), e.kind) {
                if is_log(rel) {
                    logs.insert(rel.to_owned(), u64::try_from(e.stat.st_size).unwrap_or(0));
                }
            }
            contain::Visit::Continue
        })
        .map_err(io_err("walking the project"))?;
        let (mut files, mut failed) = (Vec::new(), None);
        contain::walk(root.as_fd(), &mut |e| {
            let Some(rel) = e.rel_str() else {
                return contain::Visit::Continue;
            };
            let name = rel.rsplit('/').next().unwrap_or(rel);
            if e.kind != contain::Kind::File
                || name.starts_with(TEMP_PREFIX)
                || name == EVENTS_INDEX_FILE
            {
                return contain::Visit::Continue;
            }
            let opened = match e.open_file() {
                // Deleted (or archived away) since the walk saw it: not in this backup.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    return contain::Visit::Continue
                }
                opened => opened,
            };
            let added = opened.and_then(|(file, st)| {
                let size = u64::try_from(st.st_size).unwrap_or(0);
                let size = match logs.get(rel) {
                    Some(len) => whole_lines(&file, (*len).min(size))?,
                    None if is_log(rel) => whole_lines(&file, size)?,
                    None => size,
                };
                let mut header = tar::Header::new_gnu();
                header.set_size(size);
                header.set_mode(contain::FILE_MODE);
                header.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
                let mut reader = Hashing::new(file, size);
                tar.append_data(
                    &mut header,
                    format!("projects/{project}/{rel}"),
                    &mut reader,
                )?;
                Ok(reader.digest(rel.to_owned()))
            });
            match added {
                Ok(digest) => {
                    files.push(digest);
                    contain::Visit::Continue
                }
                Err(e) => {
                    failed = Some(Error::io(format!("backing up {rel:?} of {project:?}"), e));
                    contain::Visit::Stop
                }
            }
        })
        .map_err(io_err("walking the project"))?;
        if let Some(e) = failed {
            return Err(e);
        }
        manifest.projects.insert(project.clone(), files);
    }
    let json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| Error::io("writing the backup's list", io::Error::other(e)))?;
    let mut header = tar::Header::new_gnu();
    header.set_size(json.len() as u64);
    header.set_mode(0o644);
    tar.append_data(&mut header, MANIFEST, json.as_slice())
        .and_then(|()| tar.into_inner())
        .and_then(|gz| gz.finish())
        .and_then(|mut out| out.flush())
        .map_err(io_err("writing the backup"))
}

/// Refuses a restore that would meet a project the store has.
fn check_target(state: &State, wanted: &[String]) -> Result<()> {
    let existing = existing_projects(state);
    let clash: Vec<&String> = wanted.iter().filter(|p| existing.contains(p)).collect();
    match clash.as_slice() {
        [] => Ok(()),
        [one] => Err(Error::NotEmpty {
            what: format!("project {one:?}"),
        }),
        many => Err(Error::NotEmpty {
            what: format!(
                "projects {}",
                many.iter()
                    .map(|p| format!("{p:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// Restores the backup in `backup` (blocking): every project of it, or `only`.
pub fn restore(state: &State, backup: File, only: &str) -> Result<Restored> {
    if !only.is_empty() {
        check_id("project", only)?;
        check_target(state, &[only.to_owned()])?;
    } else if let Some(first) = existing_projects(state).first() {
        return Err(Error::NotEmpty {
            what: format!("project {first:?} (a restore of every project needs an empty store)"),
        });
    }
    let staging = state
        .config
        .data_root
        .join(format!("{TEMP_PREFIX}restore-{}", uuid::Uuid::new_v4()));
    let restored = unpack(state, backup, only, &staging).and_then(|manifest| {
        let projects: Vec<String> = manifest.keys().cloned().collect();
        if only.is_empty() {
            if let Some(first) = existing_projects(state).first() {
                return Err(Error::NotEmpty {
                    what: format!("project {first:?} (made while the restore ran)"),
                });
            }
        } else {
            check_target(state, &projects)?;
        }
        let mut restored = Restored::default();
        for (project, files) in &manifest {
            publish(state, &staging, project)?;
            restored.files += files.len() as u64;
            restored.bytes += files.iter().map(|f| f.size_bytes).sum::<u64>();
        }
        restored.projects = projects;
        Ok(restored)
    });
    if let Err(e) = std::fs::remove_dir_all(&staging) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(staging = %staging.display(), error = %e, "a restore's staging directory was left; the store removes it at its next start");
        }
    }
    restored
}

/// Renames a staged project into `projects/`, never over one that exists.
fn publish(state: &State, staging: &Path, project: &str) -> Result<()> {
    // The restored project replaces the old one whole: no journaled write may be redone in it.
    state.settle_journal(project, "")?;
    let from = rustix::fs::open(
        staging,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| Error::io("opening the restore's staging directory", e))?;
    rustix::fs::renameat_with(
        from.as_fd(),
        project,
        state.layout.projects.as_fd(),
        project,
        rustix::fs::RenameFlags::NOREPLACE,
    )
    .map_err(|e| match e {
        rustix::io::Errno::EXIST => Error::NotEmpty {
            what: format!("project {project:?} (made while the restore ran)"),
        },
        e => Error::io(format!("moving restored project {project:?} into place"), e),
    })?;
    contain::sync_dir(state.layout.projects.as_fd())
        .map_err(|e| Error::io("fsync of the projects directory", e))?;
    tracing::info!(project, "project restored");
    Ok(())
}

/// Unpacks the backup beneath `staging` and checks it whole; returns its projects' lists.
fn unpack(
    state: &State,
    backup: File,
    only: &str,
    staging: &Path,
) -> Result<BTreeMap<String, Vec<FileDigest>>> {
    let bad = |what: String| Error::BadBackup(what);
    let broken = |e: io::Error| Error::BadBackup(format!("it cannot be read to its end ({e})"));
    let mut dirs = std::fs::DirBuilder::new();
    dirs.recursive(true).mode(contain::DIR_MODE);
    dirs.create(staging)
        .map_err(|e| Error::io(format!("creating {}", staging.display()), e))?;
    let mut archive = tar::Archive::new(GzDecoder::new(io::BufReader::new(backup)));
    let mut manifest: Option<Manifest> = None;
    let mut written: BTreeMap<String, Vec<FileDigest>> = BTreeMap::new();
    for entry in archive.entries().map_err(broken)? {
        let mut entry = entry.map_err(broken)?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        if name == MANIFEST {
            let mut json = Vec::new();
            entry.read_to_end(&mut json).map_err(broken)?;
            manifest = Some(serde_json::from_slice(&json).map_err(|e| {
                bad(format!(
                    "its list of files ({MANIFEST}) does not parse: {e}"
                ))
            })?);
            continue;
        }
        let (project, rel) = name
            .strip_prefix("projects/")
            .and_then(|p| p.split_once('/'))
            .ok_or_else(|| bad(format!("it holds {name:?}, outside projects/<project>/")))?;
        check_id("project", project)?;
        let safe = state
            .layout
            .read_path(rel)
            .map_err(|e| bad(format!("it holds {name:?}, which the store refuses ({e})")))?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(bad(format!("{name:?} is not a regular file")));
        }
        if !only.is_empty() && project != only {
            continue;
        }
        let target: PathBuf = staging.join(project).join(safe.to_string());
        if let Some(parent) = target.parent() {
            dirs.create(parent)
                .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(contain::FILE_MODE)
            .open(&target)
            .map_err(|e| bad(format!("{name:?} twice or not writable ({e})")))?;
        let size = entry.size();
        let mut reader = Hashing::new(&mut entry, size);
        io::copy(&mut reader, &mut file).map_err(broken)?;
        file.sync_all()
            .map_err(|e| Error::io(format!("fsync of {}", target.display()), e))?;
        written
            .entry(project.to_owned())
            .or_default()
            .push(reader.digest(safe.to_string()));
    }
    // The rest of the gzip stream, up to its checksum.
    io::copy(&mut archive.into_inner(), &mut io::sink()).map_err(broken)?;
    let manifest = manifest.ok_or_else(|| {
        bad(format!(
            "it has no list of its files ({MANIFEST}): it was cut short"
        ))
    })?;
    if manifest.format != FORMAT {
        return Err(bad(format!(
            "its format {} is not one this store reads ({FORMAT})",
            manifest.format
        )));
    }
    let mut listed = manifest.projects;
    if let Some(odd) = listed.keys().find(|p| check_id("project", p).is_err()) {
        return Err(bad(format!(
            "its list names {odd:?}, which is no project id"
        )));
    }
    if !only.is_empty() {
        let held: Vec<String> = listed.keys().cloned().collect();
        listed.retain(|p, _| p == only);
        if listed.is_empty() {
            return Err(Error::BadRequest(format!(
                "the backup has no project {only:?}; it holds {}: name one of them with --project",
                held.join(", ")
            )));
        }
    }
    for (project, files) in &listed {
        let mut got = written.remove(project).unwrap_or_default();
        let mut want = files.clone();
        got.sort_by(|a, b| a.path.cmp(&b.path));
        want.sort_by(|a, b| a.path.cmp(&b.path));
        if got != want {
            let differs = want
                .iter()
                .find(|w| !got.contains(w))
                .map(|w| w.path.clone())
                .or_else(|| {
                    got.iter()
                        .find(|g| !want.contains(g))
                        .map(|g| g.path.clone())
                })
                .unwrap_or_default();
            return Err(bad(format!(
                "file {differs:?} of project {project:?} does not match the backup's list"
            )));
        }
        for dir in LAYOUT {
            dirs.create(staging.join(project).join(dir))
                .map_err(|e| Error::io(format!("creating {dir} of {project:?}"), e))?;
        }
    }
    if let Some(project) = written.keys().next() {
        return Err(bad(format!(
            "project {project:?} is in it but not in its list"
        )));
    }
    Ok(listed)
}
