//! Pack: the workspace as a zip or tar.gz, leaving out what the exclude
//! globs match (`.git/**`, `**/__pycache__/**`; `**` crosses directories). Entries are the
//! workspace's regular files under pathguard-valid names; links are refused and reported, never
//! followed; the archive stops with ResourceExhausted at its size cap.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsFd;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::error::{Error, Result};
use crate::outputs::Rejected;
use cairn_contain::{self as contain, Kind, Root, Visit};

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

/// Compiles exclude patterns; a pattern also excludes everything under a directory it names.
pub fn excludes(patterns: &[String]) -> Result<GlobSet> {
    let mut set = GlobSetBuilder::new();
    for p in patterns {
        let glob = GlobBuilder::new(p.trim_start_matches("./"))
            .literal_separator(true)
            .build()
            .map_err(|e| Error::invalid(format!("exclude pattern {p:?}: {e}")))?;
        set.add(glob);
    }
    set.build()
        .map_err(|e| Error::invalid(format!("exclude patterns: {e}")))
}

/// Writes the archive of the workspace into `out` (a fresh file), at most `max_bytes`.
pub fn pack(
    root: &Root,
    format: Format,
    excludes: &GlobSet,
    out: File,
    max_bytes: u64,
    max_walk: u64,
) -> Result<PackReport> {
    let mut report = PackReport::default();
    let mut files = Vec::new();
    let mut visited = 0u64;
    let dir = root
        .open_dir("")
        .map_err(Error::io("opening the workspace"))?;
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
    .map_err(Error::io("walking the workspace"))?;
    if !complete {
        return Err(Error::ResourceExhausted {
            message: format!("the workspace has more than {max_walk} entries (or nests too deep) to pack: exclude more"),
            reason: "too_many_files",
        });
    }
    let sink = Capped {
        file: out,
        pos: 0,
        max: max_bytes,
    };
    let over = |e: std::io::Error| -> Error {
        if e.kind() == std::io::ErrorKind::FileTooLarge {
            Error::ResourceExhausted {
                message: format!("the archive would exceed {max_bytes} bytes: exclude more or raise max_archive_bytes"),
                reason: "too_large",
            }
        } else {
            Error::io("writing the archive")(e)
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
                let opts = zip::write::SimpleFileOptions::default()
                    .compression_method(zip::CompressionMethod::Deflated)
                    .unix_permissions(mode(*perm))
                    .large_file(true);
                zip.start_file(path.as_str(), opts)
                    .map_err(|e| over(zip_io(e)))?;
                std::io::copy(&mut file, &mut zip).map_err(over)?;
                report.entries += 1;
            }
            zip.finish().map_err(|e| over(zip_io(e)))?;
        }
        Format::TarGz => {
            let gz = flate2::write::GzEncoder::new(sink, flate2::Compression::default());
            let mut tar = tar::Builder::new(gz);
            for (path, perm, mtime) in &files {
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
                h.set_mtime((*mtime).max(0) as u64);
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
}
