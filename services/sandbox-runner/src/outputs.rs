//! Collection of a run's /output: regular files only, names checked by pathguard, count and
//! byte limits enforced while reading, nothing read through a link. Two sources: the
//! container's tar stream (docker) and a task directory walked with O_NOFOLLOW (local
//! backend). Both are hostile: the program chose every name and type.
//!
//! All or nothing: the files are published only when /output could be collected whole. When
//! a limit is reached, a file was cut at the size limit (it has `max_bytes + 1` bytes, the
//! per-file cap the sandbox enforces), or an entry could not be read, no file is published
//! and every output is listed instead: the cause with its reason, the rest `unpublished`.
//! Entries that can never be outputs (links, special files, bad names) are refused one by one
//! and do not hold the others back. The listing itself is bounded (entries, name bytes, and
//! for a tar stream the bytes skipped to reach later names); `listing_truncated` says so.

use std::collections::HashSet;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;

use cairn_contain::{self as contain, Kind, Visit};

/// Entries `rejected` lists at most, and bytes of their names: the reply stays bounded
/// whatever /output holds.
const LIST_MAX_ENTRIES: usize = 20_000;
const LIST_MAX_NAME_BYTES: usize = 1 << 20;
/// File data a tar collection skips (not read into memory) to reach later names.
const SCAN_SKIP_MAX: u64 = 256 << 20;
/// A directory with a longer path holds no valid output: its entries' paths would exceed
/// pathguard's limit (a '/' and at least one byte more).
const MAX_DIR_PATH: usize = pathguard::MAX_PATH_BYTES - 2;
/// How deep the local walk may descend: deeper than any directory of MAX_DIR_PATH bytes.
const MAX_DEPTH: usize = pathguard::MAX_PATH_BYTES / 2 + 1;

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

impl OutputLimits {
    /// The largest file the sandbox lets a program write (RLIMIT_FSIZE): one byte over the
    /// byte limit, so a file cut there is known to be cut (reason `truncated`).
    pub fn file_size_cap(max_bytes: u64) -> u64 {
        max_bytes.saturating_add(1)
    }
}

/// What /output held: all of it in `files`, or (`truncated`) none and every output listed.
#[derive(Debug, Default)]
pub struct Outputs {
    pub files: Vec<OutputFile>,
    pub rejected: Vec<Rejected>,
    /// Not published: a limit was reached, a file was cut at the size limit, or an entry could
    /// not be read. `files` is empty and `rejected` lists each output.
    pub truncated: bool,
    /// `rejected` stops short of listing every entry (its cap was reached).
    pub listing_truncated: bool,
    pub bytes: u64,
    /// Regular files with valid names met so far, and their bytes (read or not).
    counted: u64,
    counted_bytes: u64,
    name_bytes: usize,
}

/// The decision for one entry.
enum Admit {
    /// Collect `path`.
    Take(String),
    /// Listed (or nothing to do); go on.
    Skip,
    /// The listing is full; stop reading.
    Stop,
}

impl Outputs {
    /// Lists `name` with `reason`; Stop once the listing is full (then nothing is published:
    /// what follows was not looked at).
    fn list(&mut self, name: &[u8], reason: &str) -> Admit {
        // Collected files count too (withheld, each of them is listed; at most max_files, so
        // under the cap). Their names are bounded by the byte limit's reply, not counted here.
        if self.rejected.len() + self.files.len() >= LIST_MAX_ENTRIES
            || self.name_bytes + name.len() > LIST_MAX_NAME_BYTES
        {
            self.listing_truncated = true;
            self.truncated = true;
            return Admit::Stop;
        }
        self.name_bytes += name.len();
        self.rejected.push(Rejected {
            path: contain::lossy(name),
            reason: reason.to_owned(),
        });
        Admit::Skip
    }

    /// Lists `name` and withholds the whole set.
    fn withhold(&mut self, name: &[u8], reason: &str) -> Admit {
        self.truncated = true;
        self.list(name, reason)
    }

    /// Decides for a regular file of `size` bytes named `name` (relative to /output).
    fn admit(&mut self, name: &[u8], size: u64, limits: &OutputLimits) -> Admit {
        let path = match std::str::from_utf8(name) {
            Ok(s) => match pathguard::validate(s) {
                Ok(p) => p.as_str().to_owned(),
                Err(r) => return self.list(name, r.reason.as_str()),
            },
            Err(_) => return self.list(name, "invalid_char"),
        };
        self.counted += 1;
        if size >= OutputLimits::file_size_cap(limits.max_bytes) {
            // Its size says where it was cut, not what it holds: the others are not "too large".
            return self.withhold(name, "truncated");
        }
        self.counted_bytes = self.counted_bytes.saturating_add(size);
        if self.counted > limits.max_files {
            return self.withhold(name, "too_many_files");
        }
        if self.counted_bytes > limits.max_bytes {
            return self.withhold(name, "too_large");
        }
        if self.truncated {
            // Not read: it will not be published anyway.
            return self.list(name, "unpublished");
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
        let sha256 = cairn_sha256::sha256_hex(&content);
        self.files.push(OutputFile {
            path,
            sha256,
            content,
        });
        Ok(())
    }

    /// Entries the sandbox could not read (the docker agent's report): nothing is published.
    pub fn unreadable(mut self, paths: impl IntoIterator<Item = String>) -> Outputs {
        for p in paths {
            if let Admit::Stop = self.withhold(p.as_bytes(), "io_error") {
                break;
            }
        }
        self.finish()
    }

    /// The writable area filled up (the program got ENOSPC), so any file may be cut short:
    /// nothing is published and every output of the set is listed `no_space`, the cause to act
    /// on, also where a limit was reached after it (`too_large`, `too_many_files`) or the
    /// file was only held back (`unpublished`). Entries refused on their own (names, links,
    /// special files, a file cut at the size limit, unreadable ones) keep their reason.
    pub fn out_of_space(mut self) -> Outputs {
        self.truncated = true;
        for f in std::mem::take(&mut self.files) {
            self.rejected.push(Rejected {
                path: f.path,
                reason: "no_space".to_owned(),
            });
        }
        for r in &mut self.rejected {
            if matches!(
                r.reason.as_str(),
                "unpublished" | "too_large" | "too_many_files"
            ) {
                r.reason = "no_space".to_owned();
            }
        }
        self.bytes = 0;
        self.rejected.sort_by(|a, b| a.path.cmp(&b.path));
        self
    }

    /// All or nothing: when the set is withheld its files are listed `unpublished`. The
    /// listing is sorted by path (the same on every backend).
    fn finish(mut self) -> Outputs {
        if self.truncated {
            // Room for these was kept in the listing (see `list`).
            for f in std::mem::take(&mut self.files) {
                self.rejected.push(Rejected {
                    path: f.path,
                    reason: "unpublished".to_owned(),
                });
            }
            self.bytes = 0;
        }
        self.rejected.sort_by(|a, b| a.path.cmp(&b.path));
        self
    }
}

/// Collects from a tar stream of the directory `root` (docker's archive of `/output` names
/// its entries `output/...`). File data is read only while the set may still be published.
pub fn from_tar(reader: impl Read, root: &str, limits: OutputLimits) -> std::io::Result<Outputs> {
    let mut out = Outputs::default();
    let mut archive = tar::Archive::new(reader);
    let prefix = format!("{root}/");
    let mut skipped = 0u64;
    for entry in archive.entries()? {
        let entry = entry?;
        let raw = entry.path_bytes().into_owned();
        let trimmed = raw.strip_suffix(b"/").unwrap_or(&raw);
        if trimmed == root.as_bytes() {
            continue;
        }
        let name = raw.strip_prefix(prefix.as_bytes()).unwrap_or(&raw).to_vec();
        let size = entry.header().size()?;
        let step = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                match out.admit(&name, size, &limits) {
                    Admit::Take(path) => {
                        out.take(path, size, entry)?;
                        Admit::Skip
                    }
                    other => {
                        skipped = skipped.saturating_add(size);
                        other
                    }
                }
            }
            tar::EntryType::Directory => Admit::Skip,
            tar::EntryType::Symlink => out.list(&name, "symlink"),
            tar::EntryType::Link => out.list(&name, "hardlink"),
            // PAX/GNU extension headers are consumed by the tar crate; anything else is special.
            _ => out.list(&name, "not_a_file"),
        };
        if let Admit::Stop = step {
            break;
        }
        if skipped > SCAN_SKIP_MAX {
            // Reading on only to list names costs too much: what follows is not listed.
            out.listing_truncated = true;
            out.truncated = true;
            break;
        }
    }
    Ok(out.finish())
}

/// Collects from a task directory on this host (local backend): walked beneath a held
/// descriptor, links reported and never followed, each file opened with O_NOFOLLOW.
pub fn from_dir(dir: &Path, limits: OutputLimits) -> std::io::Result<Outputs> {
    let root = contain::Root::open(dir)?;
    let mut out = Outputs::default();
    let mut seen_inodes = HashSet::new();
    let mut failure = None;
    let complete = contain::walk_to(root.fd().as_fd(), MAX_DEPTH, &mut |e| {
        let step = match e.kind {
            // Nothing below can be valid: one refusal for the directory, as a name check would.
            Kind::Dir if e.rel.len() > MAX_DIR_PATH => match out.list(e.rel, "path_too_long") {
                Admit::Stop => return Visit::Stop,
                _ => return Visit::SkipDir,
            },
            Kind::Dir => return Visit::Continue,
            Kind::Symlink => out.list(e.rel, "symlink"),
            Kind::Special => out.list(e.rel, "not_a_file"),
            // A second name of an inode already collected is a hard link (as in docker's tar).
            Kind::File if !seen_inodes.insert((e.stat.st_dev, e.stat.st_ino)) => {
                out.list(e.rel, "hardlink")
            }
            Kind::File => match out.admit(e.rel, e.stat.st_size.max(0) as u64, &limits) {
                Admit::Take(path) => match e.open_file() {
                    // Changed since the walk looked (the set is not what was counted).
                    Ok((_, stat)) if stat.st_size != e.stat.st_size => {
                        out.withhold(e.rel, "io_error")
                    }
                    Ok((file, stat)) => match out.take(path, stat.st_size.max(0) as u64, file) {
                        Ok(()) => Admit::Skip,
                        Err(err) => {
                            failure = Some(err);
                            Admit::Stop
                        }
                    },
                    // Swapped for a link or removed since the walk saw it.
                    Err(_) => out.list(e.rel, "not_a_file"),
                },
                other => other,
            },
        };
        match step {
            Admit::Stop => Visit::Stop,
            _ => Visit::Continue,
        }
    })?;
    if let Some(err) = failure {
        return Err(err);
    }
    if !complete && !out.truncated {
        // Stopped by the depth cap (unreachable through MAX_DIR_PATH, but never silent).
        out.truncated = true;
        out.listing_truncated = true;
    }
    Ok(out.finish())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// (path, reason) of each listed entry.
    fn listing(out: &Outputs) -> Vec<(&str, &str)> {
        out.rejected
            .iter()
            .map(|r| (r.path.as_str(), r.reason.as_str()))
            .collect()
    }

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
        assert_eq!(reasons, [("h", "hardlink"), ("l", "symlink")]);
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
        // All or nothing: the first file fits but is not published; all three are listed.
        assert!(out.files.is_empty());
        assert!(out.truncated && !out.listing_truncated);
        let listed = listing(&out);
        assert_eq!(
            listed,
            [("a", "unpublished"), ("b", "too_large"), ("c", "too_large")]
        );
    }

    #[test]
    fn a_full_area_lists_every_output_no_space() {
        let big = vec![7u8; 80];
        let t = tar_of(&[
            ("a", tar::EntryType::Regular, &big, ""),
            ("b", tar::EntryType::Regular, &big, ""),
            ("c", tar::EntryType::Regular, b"x", ""),
            ("l", tar::EntryType::Symlink, b"", "a"),
        ]);
        // Past the byte limit (b, c) and held back (a): the full area is the cause of each.
        let out = from_tar(&t[..], "output", LIMITS).unwrap().out_of_space();
        assert!(out.files.is_empty() && out.truncated && out.bytes == 0);
        let listed = listing(&out);
        assert_eq!(
            listed,
            [
                ("a", "no_space"),
                ("b", "no_space"),
                ("c", "no_space"),
                ("l", "symlink")
            ]
        );
        // Collected whole before the area filled: listed, not published.
        let t = tar_of(&[("ok", tar::EntryType::Regular, b"fine", "")]);
        let out = from_tar(&t[..], "output", LIMITS).unwrap().out_of_space();
        assert!(out.files.is_empty());
        assert_eq!(out.rejected[0].reason, "no_space");
    }

    #[test]
    fn a_file_at_the_size_cap_is_truncated() {
        let at_cap = vec![1u8; 101];
        let t = tar_of(&[
            ("cut", tar::EntryType::Regular, &at_cap, ""),
            ("ok", tar::EntryType::Regular, b"fine", ""),
        ]);
        let out = from_tar(&t[..], "output", LIMITS).unwrap();
        assert!(out.files.is_empty() && out.truncated);
        let listed = listing(&out);
        assert_eq!(listed, [("cut", "truncated"), ("ok", "unpublished")]);
    }

    #[test]
    fn the_listing_is_bounded() {
        let entries: Vec<(String, tar::EntryType, &[u8], &str)> = (0..LIST_MAX_ENTRIES + 5)
            .map(|i| (format!("l{i:06}"), tar::EntryType::Symlink, &b""[..], "x"))
            .collect();
        let refs: Vec<_> = entries
            .iter()
            .map(|(n, k, d, t)| (n.as_str(), *k, *d, *t))
            .collect();
        let out = from_tar(&tar_of(&refs)[..], "output", LIMITS).unwrap();
        assert_eq!(out.rejected.len(), LIST_MAX_ENTRIES);
        assert!(out.truncated && out.listing_truncated);
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
        // Listed by path: "../evil", "./dot", "/abs".
        assert_eq!(reasons, ["traversal", "dot_component", "absolute_path"]);
    }
}
