//! Archived runs: a finished run's directory packed into one gzip tar, `run.tar.gz`, beside
//! its state.json (kept, so the run index still lists the run); the run's other files are
//! then removed. Get, Stat and ReadEvents of its records are answered from the archive, and
//! the run takes no more writes, events or claims (`events` refuses to reopen its log) until
//! it is unpacked again. Packing, unpacking and reading stream: memory stays bounded by a few
//! buffers whatever the size of the run's files.
//!
//! May depend on: state, layout, read (entries), events (stored lines), run_index (final
//! states), files, digest, stamp, error, cairn-contain.

use std::fs::File;
use std::io::{BufRead, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use bytes::Bytes;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use rustix::io::Errno;
use tokio::sync::mpsc;

use cairn_contain as contain;

use crate::digest::{finished, hash_reader};
use crate::error::{refusal, Error, Result};
use crate::events::StoredEvent;
use crate::files::{self, Replace};
use crate::layout::{
    check_id, ARCHIVE_FILE, EVENTS_FILE, EVENTS_INDEX_FILE, SNAPSHOTS_DIR, TEMP_PREFIX,
};
use crate::read::{Entry, Kind};
use crate::run_index::{fields_of, last_event_seq, FINAL_STATES, STATE_FILE};
use crate::stamp::mtime_of;
use crate::state::State;
use cairn_sha256::HashingWriter;

/// What ArchiveRun made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archived {
    pub path: String,
    pub size_bytes: u64,
    pub files: u64,
}

/// What UnarchiveRun put back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unarchived {
    /// Files written back into the run's directory.
    pub files: u64,
    /// Their bytes.
    pub size_bytes: u64,
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
/// writes the archive whole, then removes the files it holds but state.json, and the run's
/// session snapshots (not packed: nothing resumes a finished run's sessions).
pub fn pack(state: &State, project: &str, run: &str) -> Result<Archived> {
    // Journaled files of the run must not be redone once their copies are removed.
    state.settle_journal(project, "")?;
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
    // Written straight into the archive's temp file beside it: nothing of the run is held in
    // memory but the compressor's and the copy's buffers.
    let path = format!("{}/{ARCHIVE_FILE}", run_dir(run));
    let (staged, file) = files::stage(state, root.as_fd(), project, &path)?;
    let out = HashingWriter::new(std::io::BufWriter::with_capacity(1 << 16, &file));
    let mut tar = tar::Builder::new(GzEncoder::new(out, flate2::Compression::default()));
    let (mut packed, mut dropped, mut dirs, mut failed) =
        (Vec::new(), Vec::new(), Vec::new(), None);
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
            contain::Kind::File if rel.starts_with(SNAPSHOTS_DIR) => dropped.push(rel.to_owned()),
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
    let (digest, _) = tar
        .into_inner()
        .and_then(|gz| gz.finish())
        .and_then(HashingWriter::finish)
        .map(finished)
        .map_err(|e| Error::io(format!("packing run {run:?}"), e))?;
    let size_bytes = digest.size_bytes;
    files::publish_sync(
        state,
        staged,
        file,
        &digest,
        &Replace::Never,
        |_| Ok(()),
        None,
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
    for rel in &dropped {
        let _ = rustix::fs::unlinkat(dir.as_fd(), rel.as_str(), rustix::fs::AtFlags::empty());
    }
    for rel in dirs.iter().rev() {
        let _ = rustix::fs::unlinkat(dir.as_fd(), rel.as_str(), rustix::fs::AtFlags::REMOVEDIR);
    }
    let _ = contain::sync_dir(dir.as_fd());
    tracing::info!(
        project,
        run,
        size_bytes,
        files,
        snapshots_removed = dropped.len(),
        "run archived"
    );
    Ok(Archived {
        path,
        size_bytes,
        files,
    })
}

/// Deletes an archived run's directory (blocking); a run that is not archived is kept.
pub fn remove(state: &State, project: &str, run: &str) -> Result<()> {
    state.settle_journal(project, "")?;
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

/// Opens the run's archive at its file `file` and hands `read` that file's bytes, its size and
/// the archive's modification time; None when the run is not archived or its archive has no
/// such file (blocking). The archive is decompressed up to the file and through it, never
/// held whole.
fn with_member<T>(
    state: &State,
    project: &str,
    run: &str,
    file: &str,
    read: impl FnOnce(&mut dyn Read, u64, String) -> Result<T>,
) -> Result<Option<T>> {
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
            let size = entry.size();
            return read(&mut entry, size, mtime_of(&st)).map(Some);
        }
    }
    Ok(None)
}

/// A file of an archived run described as Stat and Get describe files (the sha256 only with
/// `include_sha256`: it costs a read of the file); None when it is not there (blocking).
pub fn describe(
    state: &State,
    project: &str,
    path: &str,
    include_sha256: bool,
) -> Result<Option<Entry>> {
    let Some((run, file)) = run_file(path) else {
        return Ok(None);
    };
    with_member(state, project, run, file, |bytes, size, modified_at| {
        let sha256 = match include_sha256 {
            true => {
                hash_reader(bytes)
                    .map_err(|e| Error::io(format!("reading {path:?} from its run's archive"), e))?
                    .sha256
            }
            false => String::new(),
        };
        Ok(Entry {
            path: path.to_owned(),
            kind: Kind::File,
            size_bytes: size,
            sha256,
            modified_at,
        })
    })
}

/// Sends bytes `offset..offset+length` (0 = to the end) of an archived file down `tx` in
/// chunks of `chunk` bytes, as Get does (blocking; a closed channel ends it).
pub fn send_range(
    state: &State,
    project: &str,
    path: &str,
    (offset, length): (u64, u64),
    chunk: usize,
    tx: &mpsc::Sender<Result<Bytes>>,
) -> Result<()> {
    let not_found = || Error::NotFound {
        project: project.to_owned(),
        path: path.to_owned(),
    };
    let (run, file) = run_file(path).ok_or_else(not_found)?;
    let sent = with_member(state, project, run, file, |bytes, size, _| {
        check_range(offset, size)?;
        let bad =
            |e: std::io::Error| Error::io(format!("reading {path:?} from its run's archive"), e);
        std::io::copy(&mut bytes.take(offset), &mut std::io::sink()).map_err(bad)?;
        let mut left = match length {
            0 => size - offset,
            n => n.min(size - offset),
        };
        let mut buf = vec![0u8; chunk.max(1)];
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            bytes.read_exact(&mut buf[..want]).map_err(bad)?;
            if tx
                .blocking_send(Ok(Bytes::copy_from_slice(&buf[..want])))
                .is_err()
            {
                break;
            }
            left -= want as u64;
        }
        Ok(())
    })?;
    sent.ok_or_else(not_found)
}

/// Refuses a Get offset past the end of a file of `size` bytes.
pub fn check_range(offset: u64, size: u64) -> Result<()> {
    if offset > size {
        return Err(Error::BadRequest(format!(
            "offset {offset} is past the end of the file ({size} bytes); use an offset up to the size"
        )));
    }
    Ok(())
}

/// Sends the events of an archived run from `from` (at most `limit`, 0 = all) down `tx`, a
/// line at a time (blocking; a closed channel ends it). False when the run is not archived.
pub fn send_events(
    state: &State,
    project: &str,
    run: &str,
    (from, limit): (u64, u64),
    tx: &mpsc::Sender<Result<StoredEvent>>,
) -> Result<bool> {
    if !is_archived(state, project, run)? {
        return Ok(false);
    }
    let mut left = if limit == 0 { u64::MAX } else { limit };
    with_member(state, project, run, EVENTS_FILE, |bytes, _, _| {
        let bad = |e: std::io::Error| Error::io(format!("reading the events of run {run:?}"), e);
        let mut lines = std::io::BufReader::new(bytes);
        let mut line = Vec::new();
        while left > 0 {
            line.clear();
            if lines.read_until(b'\n', &mut line).map_err(bad)? == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&line);
            let Some(event) = StoredEvent::parse(text.trim_end_matches(['\n', '\r'])) else {
                continue;
            };
            if event.seq < from {
                continue;
            }
            if tx.blocking_send(Ok(event)).is_err() {
                break;
            }
            left -= 1;
        }
        Ok(())
    })?;
    Ok(true)
}

/// Unpacks an archived run (blocking; the caller keeps its events from being committed):
/// writes every file of the archive back into the run's directory, each through its own temp
/// file, fsync'd and renamed into place, then removes the archive. Until that removal the run
/// is still archived (read from the archive, no writes), so an unpacking cut short by a crash
/// is simply done again.
pub fn unpack(state: &State, project: &str, run: &str) -> Result<Unarchived> {
    let Some((root, dir)) = open_run(state, project, run)? else {
        return Err(Error::NotFound {
            project: project.to_owned(),
            path: run_dir(run),
        });
    };
    let fd = match contain::open(dir.as_fd(), ARCHIVE_FILE, rustix::fs::OFlags::RDONLY, 0) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => {
            return Err(Error::NotArchived {
                run: run.to_owned(),
            })
        }
        Err(e) => return Err(refusal(e, project, &run_dir(run), "opening the archive of")),
    };
    let bad = |e: std::io::Error| Error::io(format!("unpacking the archive of run {run:?}"), e);
    let mut archive = tar::Archive::new(GzDecoder::new(std::io::BufReader::new(File::from(fd))));
    let mut done = Unarchived {
        files: 0,
        size_bytes: 0,
    };
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let rel = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let safe = rel
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
        if entry.header().entry_type() != tar::EntryType::Regular
            || !safe
            || rel == ARCHIVE_FILE
            || rel.starts_with(TEMP_PREFIX)
        {
            return Err(Error::io(
                format!("unpacking the archive of run {run:?}"),
                std::io::Error::other(format!("it holds {rel:?}, which is no file of a run")),
            ));
        }
        let path = format!("{}/{rel}", run_dir(run));
        let (staged, file) = files::stage(state, root.as_fd(), project, &path)?;
        let mut out = HashingWriter::new(std::io::BufWriter::with_capacity(1 << 16, &file));
        std::io::copy(&mut entry, &mut out).map_err(bad)?;
        let (digest, _) = out.finish().map(finished).map_err(bad)?;
        files::publish_sync(
            state,
            staged,
            file,
            &digest,
            &Replace::Always,
            |_| Ok(()),
            None,
        )?;
        done.files += 1;
        done.size_bytes += digest.size_bytes;
    }
    rustix::fs::unlinkat(dir.as_fd(), ARCHIVE_FILE, rustix::fs::AtFlags::empty())
        .map_err(|e| Error::io(format!("removing the archive of run {run:?}"), e))?;
    contain::sync_dir(dir.as_fd())
        .map_err(|e| Error::io(format!("fsync of run {run:?}'s directory"), e))?;
    tracing::info!(project, run, files = done.files, "run unarchived");
    Ok(done)
}
