//! A session's workspace as a zip or tar.gz (the sandbox-runner's Pack), leaving out what the
//! exclude globs match (`.git/**`, `**/__pycache__/**`; `**` crosses directories). Entries are
//! the workspace's regular files under pathguard-valid names, read beneath a held directory
//! (cairn-contain); links are refused and reported, never followed; the archive stops at its
//! size cap. Entries go in byte order of their paths; with one entry time (`entry_mtime`) the
//! same files pack to the same bytes whenever they were written. The way back in is
//! [`graft`]: archive entries placed into a session's areas by descriptor.

pub mod graft;

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsFd;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use cairn_contain::{self as contain, Kind, Root, Visit};

/// Why a pack was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request's field is not acceptable (an exclude pattern, an entry time).
    #[error("{0}")]
    Invalid(String),
    #[error(
        "the workspace has more than {max_walk} entries (or nests too deep) to pack: exclude more"
    )]
    TooManyFiles { max_walk: u64 },
    #[error("the archive would exceed {max_bytes} bytes: exclude more or raise max_archive_bytes")]
    TooLarge { max_bytes: u64 },
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { context, source }
}

/// An entry left out of the archive, with its reason word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub path: String,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Zip,
    TarGz,
}

impl Format {
    pub fn extension(self) -> &'static str {
        match self {
            Format::Zip => "zip",
            Format::TarGz => "tar.gz",
        }
    }
}

/// What went into the archive.
#[derive(Debug, Default)]
pub struct PackReport {
    pub entries: u32,
    pub excluded: u32,
    pub refused: Vec<Rejected>,
}

/// One modification time for every entry of an archive (`PackRequest.entry_mtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryTime {
    /// Seconds since the Unix epoch (tar).
    unix: u64,
    /// The same time as a zip holds it (even seconds).
    zip: zip::DateTime,
}

/// Parses `PackRequest.entry_mtime`: empty is None (each file's own time); otherwise an RFC
/// 3339 time from 1980-01-01 to 2107-12-31, the range a zip can hold.
pub fn entry_time(text: &str) -> Result<Option<EntryTime>> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let bad = |why: &str| {
        Error::Invalid(format!(
            "entry_mtime {text:?} {why}: give an RFC 3339 time from 1980-01-01T00:00:00Z to 2107-12-31T23:59:59Z, or leave it empty"
        ))
    };
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|_| bad("is not an RFC 3339 time"))?
        .to_offset(time::UtcOffset::UTC);
    let zip = u16::try_from(t.year())
        .ok()
        .and_then(|year| {
            zip::DateTime::from_date_and_time(
                year,
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second(),
            )
            .ok()
        })
        .ok_or_else(|| bad("is outside the range a zip can hold"))?;
    Ok(Some(EntryTime {
        unix: u64::try_from(t.unix_timestamp()).map_err(|_| bad("is before 1970"))?,
        zip,
    }))
}

/// Compiles exclude patterns; a pattern also excludes everything under a directory it names.
pub fn excludes(patterns: &[String]) -> Result<GlobSet> {
    let mut set = GlobSetBuilder::new();
    for p in patterns {
        let glob = GlobBuilder::new(p.trim_start_matches("./"))
            .literal_separator(true)
            .build()
            .map_err(|e| Error::Invalid(format!("exclude pattern {p:?}: {e}")))?;
        set.add(glob);
    }
    set.build()
        .map_err(|e| Error::Invalid(format!("exclude patterns: {e}")))
}

/// Writes the archive of the workspace into `out` (a fresh file), at most `max_bytes`; every
/// entry gets `mtime` when given.
pub fn pack(
    root: &Root,
    format: Format,
    excludes: &GlobSet,
    mtime: Option<EntryTime>,
    out: File,
    max_bytes: u64,
    max_walk: u64,
) -> Result<PackReport> {
    let mut report = PackReport::default();
    let mut files = Vec::new();
    let mut visited = 0u64;
    let dir = root.open_dir("").map_err(io("opening the workspace"))?;
    let complete = contain::walk(dir.as_fd(), &mut |e| {
        visited += 1;
        if visited > max_walk {
            return Visit::Stop;
        }
        let Some(rel) = e.rel_str() else {
            report.refused.push(Rejected {
                path: contain::lossy(e.rel),
                reason: "invalid_char".into(),
            });
            return if e.kind == Kind::Dir {
                Visit::SkipDir
            } else {
                Visit::Continue
            };
        };
        if excludes.is_match(rel) {
            if e.kind == Kind::Dir {
                return Visit::SkipDir;
            }
            report.excluded += 1;
            return Visit::Continue;
        }
        match e.kind {
            Kind::Dir => Visit::Continue,
            Kind::Symlink => {
                report.refused.push(Rejected {
                    path: rel.to_owned(),
                    reason: "symlink".into(),
                });
                Visit::Continue
            }
            Kind::Special => {
                report.refused.push(Rejected {
                    path: rel.to_owned(),
                    reason: "not_a_file".into(),
                });
                Visit::Continue
            }
            Kind::File => {
                match pathguard::validate(rel) {
                    Ok(p) => files.push((p, e.stat.st_mode & 0o777, e.stat.st_mtime)),
                    Err(r) => report.refused.push(Rejected {
                        path: rel.to_owned(),
                        reason: r.reason.as_str().into(),
                    }),
                }
                Visit::Continue
            }
        }
    })
    .map_err(io("walking the workspace"))?;
    if !complete {
        return Err(Error::TooManyFiles { max_walk });
    }
    // Byte order of the paths, whatever order the directories listed them in.
    files.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    let sink = Capped {
        file: out,
        pos: 0,
        max: max_bytes,
    };
    let over = |e: std::io::Error| -> Error {
        if e.kind() == std::io::ErrorKind::FileTooLarge {
            Error::TooLarge { max_bytes }
        } else {
            io("writing the archive")(e)
        }
    };
    let mode = |m: u32| if m & 0o111 != 0 { 0o755 } else { 0o644 };
    match format {
        Format::Zip => {
            let mut zip = zip::ZipWriter::new(sink);
            for (path, perm, _) in &files {
                let Ok((mut file, _)) = root.open_file(path.as_str()) else {
                    report.refused.push(Rejected {
                        path: path.to_string(),
                        reason: "not_a_file".into(),
                    });
                    continue;
                };
                let mut opts = zip::write::SimpleFileOptions::default()
                    .compression_method(zip::CompressionMethod::Deflated)
                    .unix_permissions(mode(*perm))
                    .large_file(true);
                if let Some(t) = mtime {
                    opts = opts.last_modified_time(t.zip);
                }
                zip.start_file(path.as_str(), opts)
                    .map_err(|e| over(zip_io(e)))?;
                std::io::copy(&mut file, &mut zip).map_err(over)?;
                report.entries += 1;
            }
            zip.finish().map_err(|e| over(zip_io(e)))?;
        }
        Format::TarGz => {
            // Header time 0, no file name: the header says nothing of when or where.
            let gz = flate2::GzBuilder::new()
                .mtime(0)
                .write(sink, flate2::Compression::default());
            let mut tar = tar::Builder::new(gz);
            for (path, perm, file_mtime) in &files {
                let Ok((file, stat)) = root.open_file(path.as_str()) else {
                    report.refused.push(Rejected {
                        path: path.to_string(),
                        reason: "not_a_file".into(),
                    });
                    continue;
                };
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(stat.st_size.max(0) as u64);
                h.set_mode(mode(*perm));
                h.set_mtime(match mtime {
                    Some(t) => t.unix,
                    None => (*file_mtime).max(0) as u64,
                });
                h.set_uid(0);
                h.set_gid(0);
                // Exactly the size we announced, even if the file changes meanwhile.
                let reader = std::io::Read::take(file, stat.st_size.max(0) as u64);
                tar.append_data(&mut h, path.as_str(), reader)
                    .map_err(over)?;
                report.entries += 1;
            }
            let gz = tar.into_inner().map_err(over)?;
            let mut sink = gz.finish().map_err(over)?;
            sink.flush().map_err(over)?;
        }
    }
    Ok(report)
}

fn zip_io(e: zip::result::ZipError) -> std::io::Error {
    match e {
        zip::result::ZipError::Io(io) => io,
        other => std::io::Error::other(other),
    }
}

/// A file that refuses to grow past `max` bytes (the archive cap).
struct Capped {
    file: File,
    pos: u64,
    max: u64,
}

impl Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.pos + buf.len() as u64 > self.max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "archive size cap",
            ));
        }
        let n = self.file.write(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl Seek for Capped {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        self.pos = self.file.seek(to)?;
        Ok(self.pos)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn double_star_patterns_exclude_at_any_depth() {
        let set = excludes(&[
            ".git/**".into(),
            "node_modules/**".into(),
            "**/__pycache__/**".into(),
        ])
        .unwrap();
        assert!(set.is_match(".git/config"));
        assert!(set.is_match("node_modules/a/b.js"));
        assert!(set.is_match("__pycache__/x.pyc"));
        assert!(set.is_match("src/pkg/__pycache__/x.pyc"));
        assert!(!set.is_match("src/main.py"));
        assert!(!set.is_match("a.git/x"));
    }

    #[test]
    fn entry_times_are_checked_against_what_a_zip_holds() {
        assert_eq!(entry_time("").unwrap(), None);
        let t = entry_time("1980-01-01T00:00:00Z").unwrap().unwrap();
        assert_eq!(t.unix, 315_532_800);
        assert_eq!((t.zip.year(), t.zip.month(), t.zip.day()), (1980, 1, 1));
        let t = entry_time("2026-11-29T15:00:02+01:00").unwrap().unwrap();
        assert_eq!(t.unix, 1_795_960_802);
        assert_eq!((t.zip.hour(), t.zip.second()), (14, 2));
        for bad in [
            "1979-12-31T23:59:59Z",
            "2108-01-01T00:00:00Z",
            "yesterday",
            "1980-01-01",
        ] {
            let e = entry_time(bad).unwrap_err().to_string();
            assert!(e.contains("entry_mtime") && e.contains(bad), "{e}");
        }
    }
}
