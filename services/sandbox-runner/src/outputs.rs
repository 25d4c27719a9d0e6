//! Collection of a run's /output: regular files only, names checked by pathguard, count and
//! byte limits enforced while reading (reading stops at the limit), nothing read through a
//! link. Two sources: the container's tar stream (docker) and a task directory walked with
//! O_NOFOLLOW (local backend). Both are hostile: the program chose every name and type.

use std::collections::HashSet;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::beneath::{self, Kind, Visit};

/// One collected file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFile {
    pub path: String,
    pub sha256: String,
    pub content: Vec<u8>,
}

/// An entry not collected, with its reason word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    pub path: String,
    pub reason: String,
}

#[derive(Debug, Clone, Copy)]
pub struct OutputLimits {
    pub max_files: u64,
    pub max_bytes: u64,
}

/// What /output held, as far as the limits allowed.
#[derive(Debug, Default)]
pub struct Outputs {
    pub files: Vec<OutputFile>,
    pub rejected: Vec<Rejected>,
    /// A limit was reached; later entries were not looked at.
    pub truncated: bool,
    pub bytes: u64,
}

/// The decision for one entry.
enum Admit {
    /// Collect `path`.
    Take(String),
    /// Refused; go on.
    Skip,
    /// A limit was reached; stop reading.
    Stop,
}

impl Outputs {
    fn reject(&mut self, name: &[u8], reason: &str, limits: &OutputLimits) -> Admit {
        // Rejections are capped like files, so 100,000 planted links cannot bloat the reply.
        if self.rejected.len() as u64 >= limits.max_files {
            self.truncated = true;
            return Admit::Stop;
        }
        self.rejected.push(Rejected {
            path: beneath::lossy(name),
            reason: reason.to_owned(),
        });
        Admit::Skip
    }

    /// Decides for a regular file of `size` bytes named `name` (relative to /output).
    fn admit(&mut self, name: &[u8], size: u64, limits: &OutputLimits) -> Admit {
        let path = match std::str::from_utf8(name) {
            Ok(s) => match pathguard::validate(s) {
                Ok(p) => p.as_str().to_owned(),
                Err(r) => return self.reject(name, r.reason.as_str(), limits),
            },
            Err(_) => return self.reject(name, "invalid_char", limits),
        };
        if self.files.len() as u64 >= limits.max_files {
            self.reject(name, "too_many_files", limits);
            self.truncated = true;
            return Admit::Stop;
        }
        if self.bytes.saturating_add(size) > limits.max_bytes {
            self.reject(name, "too_large", limits);
            self.truncated = true;
            return Admit::Stop;
        }
        Admit::Take(path)
    }

    /// Reads exactly `size` bytes of a file and records it.
    fn take(&mut self, path: String, size: u64, reader: impl Read) -> std::io::Result<()> {
        let mut content = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        reader.take(size).read_to_end(&mut content)?;
        if content.len() as u64 != size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{path}: expected {size} bytes, read {}", content.len()),
            ));
        }
        self.bytes += size;
        let sha256 = hex::encode(Sha256::digest(&content));
        self.files.push(OutputFile {
            path,
            sha256,
            content,
        });
        Ok(())
    }
}

/// Collects from a tar stream of the directory `root` (docker's archive of `/output` names
/// its entries `output/...`). Stops reading as soon as a limit is reached.
pub fn from_tar(reader: impl Read, root: &str, limits: OutputLimits) -> std::io::Result<Outputs> {
    let mut out = Outputs::default();
    let mut archive = tar::Archive::new(reader);
    let prefix = format!("{root}/");
    for entry in archive.entries()? {
        let entry = entry?;
        let raw = entry.path_bytes().into_owned();
        let trimmed = raw.strip_suffix(b"/").unwrap_or(&raw);
        if trimmed == root.as_bytes() {
            continue;
        }
        let name = raw.strip_prefix(prefix.as_bytes()).unwrap_or(&raw).to_vec();
        let step = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = entry.header().size()?;
                match out.admit(&name, size, &limits) {
                    Admit::Take(path) => {
                        out.take(path, size, entry)?;
                        Admit::Skip
                    }
                    other => other,
                }
            }
            tar::EntryType::Directory => Admit::Skip,
            tar::EntryType::Symlink => out.reject(&name, "symlink", &limits),
            tar::EntryType::Link => out.reject(&name, "hardlink", &limits),
            // PAX/GNU extension headers are consumed by the tar crate; anything else is special.
            _ => out.reject(&name, "not_a_file", &limits),
        };
        if let Admit::Stop = step {
            break;
        }
    }
    Ok(out)
}

/// Collects from a task directory on this host (local backend): walked beneath a held
/// descriptor, links reported and never followed, each file opened with O_NOFOLLOW.
pub fn from_dir(dir: &Path, limits: OutputLimits) -> std::io::Result<Outputs> {
    let root = beneath::Root::open(dir)?;
    let mut out = Outputs::default();
    let mut seen_inodes = HashSet::new();
    let mut failure = None;
    beneath::walk(root.fd().as_fd(), &mut |e| {
        let step = match e.kind {
            Kind::Dir => return Visit::Continue,
            Kind::Symlink => out.reject(e.rel, "symlink", &limits),
            Kind::Special => out.reject(e.rel, "not_a_file", &limits),
            Kind::File => {
                // A second name of an inode already collected is a hard link (as in docker's tar).
                if !seen_inodes.insert((e.stat.st_dev, e.stat.st_ino)) {
                    out.reject(e.rel, "hardlink", &limits)
                } else {
                    match out.admit(e.rel, e.stat.st_size.max(0) as u64, &limits) {
                        Admit::Take(path) => match e.open_file() {
                            Ok((file, stat)) => {
                                // Size as of the open; a file still growing is cut at that size.
                                let size = stat.st_size.max(0) as u64;
                                if out.bytes.saturating_add(size) > limits.max_bytes {
                                    out.reject(e.rel, "too_large", &limits);
                                    out.truncated = true;
                                    Admit::Stop
                                } else if let Err(err) = out.take(path, size, file) {
                                    failure = Some(err);
                                    Admit::Stop
                                } else {
                                    Admit::Skip
                                }
                            }
                            // Swapped for a link or removed since the walk saw it.
                            Err(_) => out.reject(e.rel, "not_a_file", &limits),
                        },
                        other => other,
                    }
                }
            }
        };
        match step {
            Admit::Stop => Visit::Stop,
            _ => Visit::Continue,
        }
    })?;
    match failure {
        Some(err) => Err(err),
        None => Ok(out),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn tar_of(entries: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_mode(0o755);
        b.append_data(&mut h, "output", std::io::empty()).unwrap();
        for (name, kind, data, target) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            if !target.is_empty() {
                h.set_link_name(target).unwrap();
            }
            b.append_data(&mut h, format!("output/{name}"), *data)
                .unwrap();
        }
        b.into_inner().unwrap()
    }

    const LIMITS: OutputLimits = OutputLimits {
        max_files: 10,
        max_bytes: 100,
    };

    #[test]
    fn regular_files_are_collected_links_refused() {
        let t = tar_of(&[
            ("a.txt", tar::EntryType::Regular, b"hello", ""),
            ("sub/b.bin", tar::EntryType::Regular, &[0, 255, 1], ""),
            ("l", tar::EntryType::Symlink, b"", "/etc/passwd"),
            ("h", tar::EntryType::Link, b"", "output/a.txt"),
        ]);
        let out = from_tar(&t[..], "output", LIMITS).unwrap();
        let names: Vec<_> = out.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["a.txt", "sub/b.bin"]);
        assert_eq!(out.files[1].content, [0, 255, 1]);
        let reasons: Vec<_> = out
            .rejected
            .iter()
            .map(|r| (r.path.as_str(), r.reason.as_str()))
            .collect();
        assert_eq!(reasons, [("l", "symlink"), ("h", "hardlink")]);
        assert!(!out.truncated);
    }

    #[test]
    fn byte_limit_stops_reading() {
        let big = vec![7u8; 80];
        let t = tar_of(&[
            ("a", tar::EntryType::Regular, &big, ""),
            ("b", tar::EntryType::Regular, &big, ""),
            ("c", tar::EntryType::Regular, b"x", ""),
        ]);
        let out = from_tar(&t[..], "output", LIMITS).unwrap();
        assert_eq!(out.files.len(), 1);
        assert!(out.truncated);
        assert_eq!(out.rejected[0].reason, "too_large");
    }

    #[test]
    fn bad_names_are_refused() {
        let t = tar_of(&[
            ("a\u{1}b", tar::EntryType::Regular, b"x", ""),
            ("ok", tar::EntryType::Regular, b"y", ""),
        ]);
        let out = from_tar(&t[..], "output", LIMITS).unwrap();
        assert_eq!(out.files.len(), 1);
        assert_eq!(out.rejected[0].reason, "invalid_char");
    }

    #[test]
    fn traversal_and_absolute_names_in_the_stream_are_refused() {
        // A hostile stream (not docker's) could carry such names; none may pass.
        let mut raw = Vec::new();
        for name in ["output/../evil", "output//abs", "output/./dot", "output/ok"] {
            let mut h = tar::Header::new_old();
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(1);
            h.set_mode(0o644);
            h.set_cksum();
            raw.extend_from_slice(h.as_bytes());
            let mut block = [0u8; 512];
            block[0] = b'x';
            raw.extend_from_slice(&block);
        }
        raw.extend_from_slice(&[0u8; 1024]);
        let out = from_tar(&raw[..], "output", LIMITS).unwrap();
        let names: Vec<_> = out.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["ok"]);
        let reasons: Vec<_> = out.rejected.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(reasons, ["traversal", "absolute_path", "dot_component"]);
    }
}
