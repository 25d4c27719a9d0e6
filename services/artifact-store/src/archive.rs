//! Archived runs: a finished run's directory packed into one gzip tar, `run.tar.gz`, beside
//! its state.json (kept, so the run index still lists the run); the run's other files are
//! then removed. Get, Stat and ReadEvents of its records are answered from the archive, and
//! the run takes no more writes, events or claims (`events` refuses to reopen its log).
//!
//! May depend on: state, layout, read (entries), events (stored lines), run_index (final
//! states), files, stamp, error, cairn-contain.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use bytes::Bytes;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use rustix::io::Errno;

use cairn_contain as contain;

use crate::error::{refusal, Error, Result};
use crate::events::StoredEvent;
use crate::files;
use crate::layout::{check_id, ARCHIVE_FILE, EVENTS_FILE, EVENTS_INDEX_FILE, TEMP_PREFIX};
use crate::read::{Entry, Kind};
use crate::run_index::{fields_of, last_event_seq, FINAL_STATES, STATE_FILE};
use crate::stamp::mtime_of;
use crate::state::State;

/// What ArchiveRun made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archived {
    pub path: String,
    pub size_bytes: u64,
    pub files: u64,
}

fn run_dir(run: &str) -> String {
    format!(".cairn/runs/{run}")
}

/// The run and the file within its directory of a project path under `.cairn/runs/`.
pub fn run_file(path: &str) -> Option<(&str, &str)> {
    let (run, file) = path.strip_prefix(".cairn/runs/")?.split_once('/')?;
    (check_id("run", run).is_ok() && !file.is_empty()).then_some((run, file))
}

/// The run's directory; None when it has none.
fn open_run(state: &State, project: &str, run: &str) -> Result<Option<(OwnedFd, OwnedFd)>> {
    check_id("run", run)?;
    let root = state.layout.project_root(project)?;
    match contain::open_dir(root.as_fd(), &run_dir(run)) {
        Ok(dir) => Ok(Some((root, dir))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(refusal(e, project, &run_dir(run), "opening")),
    }
}

/// Whether the run is archived (blocking).
pub fn is_archived(state: &State, project: &str, run: &str) -> Result<bool> {
    Ok(match open_run(state, project, run)? {
        Some((_, dir)) => contain::stat(dir.as_fd(), ARCHIVE_FILE).is_ok(),
        None => false,
    })
}

/// Refuses a run that may still have work: its state.json must be final and have folded in
/// the last event of its log.
fn check_finished(runs: BorrowedFd<'_>, run: &str) -> Result<()> {
    let unfinished = |state: &str| Error::Unfinished {
        run: run.to_owned(),
        state: state.to_owned(),
    };
    let path = format!("{run}/{STATE_FILE}");
    let fd = contain::open(runs, &path, rustix::fs::OFlags::RDONLY, 0)
        .map_err(|_| unfinished("without a state.json"))?;
    let mut bytes = Vec::new();
    File::from(fd)
        .take(16 << 20)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading {path:?}"), e))?;
    let fields = fields_of(&bytes).ok_or_else(|| unfinished("without a readable state.json"))?;
    if !FINAL_STATES.contains(&fields.state.as_str()) {
        return Err(unfinished(&fields.state));
    }
    match (last_event_seq(&runs, run), fields.events_seq) {
        (Err(_), _) => Err(unfinished("still recording events")),
        (Ok(Some(last)), Some(folded)) if last > folded => {
            Err(unfinished("still recording events"))
        }
        _ => Ok(()),
    }
}

/// Packs a finished run (blocking; the caller keeps its events from being committed):
/// writes the archive whole, then removes the files it holds but state.json.
pub fn pack(state: &State, project: &str, run: &str) -> Result<Archived> {
    let Some((root, dir)) = open_run(state, project, run)? else {
        return Err(Error::NotFound {
            project: project.to_owned(),
            path: run_dir(run),
        });
    };
    if contain::stat(dir.as_fd(), ARCHIVE_FILE).is_ok() {
        return Err(Error::Archived {
            run: run.to_owned(),
        });
    }
    let runs = contain::open_dir(root.as_fd(), ".cairn/runs")
        .map_err(|e| refusal(e, project, ".cairn/runs", "opening"))?;
    check_finished(runs.as_fd(), run)?;
    let mut tar = tar::Builder::new(GzEncoder::new(Vec::new(), flate2::Compression::default()));
    let (mut packed, mut dirs, mut failed) = (Vec::new(), Vec::new(), None);
    contain::walk(dir.as_fd(), &mut |e| {
        let Some(rel) = e.rel_str() else {
            return contain::Visit::Continue;
        };
        let name = rel.rsplit('/').next().unwrap_or(rel);
        if name.starts_with(TEMP_PREFIX) || rel == ARCHIVE_FILE {
            return contain::Visit::Continue;
        }
        match e.kind {
            contain::Kind::Dir => dirs.push(rel.to_owned()),
            contain::Kind::File if rel == EVENTS_INDEX_FILE => packed.push(rel.to_owned()),
            contain::Kind::File => {
                let added = e.open_file().and_then(|(file, st)| {
                    let mut header = tar::Header::new_gnu();
                    header.set_size(u64::try_from(st.st_size).unwrap_or(0));
                    header.set_mode(contain::FILE_MODE);
                    header.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
                    tar.append_data(&mut header, rel, file)
                });
                match added {
                    Ok(()) => packed.push(rel.to_owned()),
                    Err(err) => {
                        failed = Some(Error::io(format!("packing {rel:?} of run {run:?}"), err));
                        return contain::Visit::Stop;
                    }
                }
            }
            _ => {}
        }
        contain::Visit::Continue
    })
    .map_err(|e| Error::io(format!("walking run {run:?}"), e))?;
    if let Some(e) = failed {
        return Err(e);
    }
    let bytes = tar
        .into_inner()
        .and_then(|gz| gz.finish())
        .map_err(|e| Error::io(format!("packing run {run:?}"), e))?;
    let size_bytes = bytes.len() as u64;
    let path = format!("{}/{ARCHIVE_FILE}", run_dir(run));
    files::write_bytes(
        state,
        root.as_fd(),
        project,
        &path,
        &[Bytes::from(bytes)],
        false,
    )?;
    // The archive is durable: what it holds goes (a failure here leaves copies that read the same).
    let mut files = 0;
    for rel in &packed {
        if rel != EVENTS_INDEX_FILE {
            files += 1;
        }
        if rel != STATE_FILE {
            let _ = rustix::fs::unlinkat(dir.as_fd(), rel.as_str(), rustix::fs::AtFlags::empty());
        }
    }
    for rel in dirs.iter().rev() {
        let _ = rustix::fs::unlinkat(dir.as_fd(), rel.as_str(), rustix::fs::AtFlags::REMOVEDIR);
    }
    let _ = contain::sync_dir(dir.as_fd());
    tracing::info!(project, run, size_bytes, files, "run archived");
    Ok(Archived {
        path,
        size_bytes,
        files,
    })
}

/// Deletes an archived run's directory (blocking); a run that is not archived is kept.
pub fn remove(state: &State, project: &str, run: &str) -> Result<()> {
    if !is_archived(state, project, run)? {
        return Err(Error::Unfinished {
            run: run.to_owned(),
            state: "not archived".to_owned(),
        });
    }
    let dir = state
        .config
        .data_root
        .join("projects")
        .join(project)
        .join(run_dir(run));
    std::fs::remove_dir_all(&dir)
        .map_err(|e| Error::io(format!("deleting {}", dir.display()), e))?;
    tracing::info!(project, run, "archived run deleted");
    Ok(())
}

/// One file of an archived run, with the archive's modification time; None when the run is
/// not archived or its archive has no such file (blocking).
fn member(
    state: &State,
    project: &str,
    run: &str,
    file: &str,
) -> Result<Option<(Vec<u8>, String)>> {
    let Some((_, dir)) = open_run(state, project, run)? else {
        return Ok(None);
    };
    let fd = match contain::open(dir.as_fd(), ARCHIVE_FILE, rustix::fs::OFlags::RDONLY, 0) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(refusal(e, project, &run_dir(run), "opening the archive of")),
    };
    let bad = |e: std::io::Error| Error::io(format!("reading the archive of run {run:?}"), e);
    let st = rustix::fs::fstat(&fd).map_err(|e| bad(e.into()))?;
    let mut archive = tar::Archive::new(GzDecoder::new(std::io::BufReader::new(File::from(fd))));
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        if entry.path_bytes().as_ref() == file.as_bytes() {
            let mut bytes = Vec::with_capacity(entry.size() as usize);
            entry.read_to_end(&mut bytes).map_err(bad)?;
            return Ok(Some((bytes, mtime_of(&st))));
        }
    }
    Ok(None)
}

/// A file of an archived run read whole, described as Stat and Get describe files; None
/// when it is not there (blocking).
pub fn read_file(state: &State, project: &str, path: &str) -> Result<Option<(Entry, Vec<u8>)>> {
    let Some((run, file)) = run_file(path) else {
        return Ok(None);
    };
    let Some((bytes, modified_at)) = member(state, project, run, file)? else {
        return Ok(None);
    };
    let entry = Entry {
        path: path.to_owned(),
        kind: Kind::File,
        size_bytes: bytes.len() as u64,
        sha256: cairn_sha256::sha256_hex(&bytes),
        modified_at,
    };
    Ok(Some((entry, bytes)))
}

/// The events of an archived run from `from` (at most `limit`, 0 = all); None when the run
/// is not archived (blocking).
pub fn events(
    state: &State,
    project: &str,
    run: &str,
    from: u64,
    limit: u64,
) -> Result<Option<Vec<StoredEvent>>> {
    if !is_archived(state, project, run)? {
        return Ok(None);
    }
    let bytes = member(state, project, run, EVENTS_FILE)?
        .map(|(b, _)| b)
        .unwrap_or_default();
    let limit = if limit == 0 {
        usize::MAX
    } else {
        limit as usize
    };
    let events = String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(StoredEvent::parse)
        .filter(|e| e.seq >= from)
        .take(limit)
        .collect();
    Ok(Some(events))
}

/// The requested range of an archived file in Get's chunks.
pub fn chunks(bytes: &[u8], offset: u64, length: u64, chunk: usize) -> Result<Vec<Bytes>> {
    let size = bytes.len() as u64;
    if offset > size {
        return Err(Error::BadRequest(format!(
            "offset {offset} is past the end of the file ({size} bytes); use an offset up to the size"
        )));
    }
    let end = match length {
        0 => size,
        n => offset.saturating_add(n).min(size),
    };
    let mut out = Vec::new();
    let mut range = &bytes[offset as usize..end as usize];
    while !range.is_empty() {
        let (head, rest) = range.split_at(chunk.min(range.len()));
        out.push(Bytes::copy_from_slice(head));
        range = rest;
    }
    Ok(out)
}
