//! The session tools on the workspace: ReadFile, WriteFile, Glob, Grep. All of
//! them work on the host-side task directory through a held descriptor (cairn-contain), so a
//! symlink or `..` the code planted cannot lead them outside /workspace; results are capped.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use globset::GlobBuilder;
use pathguard::SafePath;
use regex::bytes::RegexBuilder;
use rustix::fs::{Mode, OFlags};

use crate::error::{Error, Result};
use cairn_contain::{self as contain, Kind, Root, Visit};

/// Characters kept of one matching line.
const MAX_LINE_CHARS: usize = 500;
/// Files larger than this are not searched.
const MAX_GREP_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Turns an error of a confined open into the runner's error for `path`.
pub fn refusal(path: &str, e: std::io::Error) -> Error {
    match rustix::io::Errno::from_io_error(&e) {
        Some(rustix::io::Errno::LOOP) | Some(rustix::io::Errno::XDEV) => Error::Refused {
            path: path.to_owned(),
            message: "a symbolic link is in the way: workspace tools never follow links; remove the link or use the real path".into(),
            reason: "symlink_in_path",
        },
        Some(rustix::io::Errno::NOENT) => Error::NotFound { what: "workspace path", name: path.to_owned() },
        Some(rustix::io::Errno::NOTDIR) | Some(rustix::io::Errno::ISDIR) => Error::Refused {
            path: path.to_owned(),
            message: "not a regular file (or a file where a directory was expected)".into(),
            reason: "not_a_file",
        },
        _ if e.kind() == std::io::ErrorKind::InvalidInput => Error::Refused {
            path: path.to_owned(),
            message: "not a regular file".into(),
            reason: "not_a_file",
        },
        _ => Error::Io { context: format!("workspace path {path:?}"), source: e },
    }
}

/// Checks a workspace-relative path ("" allowed where `allow_root`).
pub fn path(p: &str, what: &'static str, allow_root: bool) -> Result<Option<SafePath>> {
    let p = p.trim_start_matches("/workspace/");
    if allow_root && (p.is_empty() || p == "/workspace" || p == ".") {
        return Ok(None);
    }
    pathguard::validate(p)
        .map(Some)
        .map_err(|rejection| Error::Path { what, rejection })
}

/// Reads up to `max` bytes; returns (content, truncated, size).
pub fn read(root: &Root, path: &SafePath, max: u64) -> Result<(Vec<u8>, bool, u64)> {
    let (file, stat) = root
        .open_file(path.as_str())
        .map_err(|e| refusal(path.as_str(), e))?;
    let size = stat.st_size.max(0) as u64;
    let mut content = Vec::with_capacity(size.min(max) as usize);
    file.take(max)
        .read_to_end(&mut content)
        .map_err(Error::io(format!("reading {path}")))?;
    Ok((content, size > max, size))
}

/// Writes (overwrite: a new file renamed into place, never truncating an existing one;
/// append: only to a regular file with one link). Parent directories are created. New files
/// and directories are given to the sandbox user so the code can change them too.
pub fn write(
    root: &Root,
    path: &SafePath,
    content: &[u8],
    append: bool,
    owner: Option<(u32, u32)>,
) -> Result<(u64, u64)> {
    let comps: Vec<&str> = path.components().collect();
    let (name, parents) = comps
        .split_last()
        .ok_or_else(|| Error::invalid("empty path"))?;
    let mut dir: OwnedFd = root.open_dir("").map_err(|e| refusal("", e))?;
    let mut walked = String::new();
    for comp in parents {
        if !walked.is_empty() {
            walked.push('/');
        }
        walked.push_str(comp);
        match rustix::fs::mkdirat(&dir, *comp, Mode::from_raw_mode(0o755)) {
            Ok(()) => {
                if let Some((uid, gid)) = owner {
                    chown_at(&dir, comp, uid, gid).map_err(Error::io(format!("chown {walked}")))?;
                }
            }
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(refusal(&walked, e.into())),
        }
        dir = root.open_dir(&walked).map_err(|e| refusal(&walked, e))?;
    }
    if append {
        let fd = rustix::fs::openat2(
            &dir,
            *name,
            OFlags::WRONLY
                | OFlags::APPEND
                | OFlags::CREATE
                | OFlags::NOFOLLOW
                | OFlags::CLOEXEC
                | OFlags::NONBLOCK,
            Mode::from_raw_mode(0o644),
            rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_SYMLINKS,
        )
        .map_err(|e| refusal(path.as_str(), e.into()))?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| refusal(path.as_str(), e.into()))?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(refusal(
                path.as_str(),
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            ));
        }
        if stat.st_nlink > 1 {
            return Err(Error::Refused {
                path: path.to_string(),
                message:
                    "the file has several hard links: appending would change the other names too"
                        .into(),
                reason: "not_a_file",
            });
        }
        if let (Some((uid, gid)), 0) = (owner, stat.st_size) {
            fchown(&fd, uid, gid).map_err(Error::io(format!("chown {path}")))?;
        }
        let mut file = std::fs::File::from(fd);
        file.write_all(content)
            .map_err(Error::io(format!("appending to {path}")))?;
        let size = file
            .metadata()
            .map_err(Error::io(format!("stat {path}")))?
            .len();
        return Ok((content.len() as u64, size));
    }
    let temp = format!(".cairn-write-{}", uuid::Uuid::new_v4().simple());
    let fd = rustix::fs::openat(
        &dir,
        temp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| Error::Io {
        context: format!("creating a file beside {path}"),
        source: e.into(),
    })?;
    let written = (|| -> std::io::Result<()> {
        if let Some((uid, gid)) = owner {
            fchown(&fd, uid, gid)?;
        }
        let mut file = std::fs::File::from(fd);
        file.write_all(content)?;
        file.sync_data()?;
        rustix::fs::renameat(&dir, temp.as_str(), &dir, *name)?;
        Ok(())
    })();
    if let Err(e) = written {
        let _ = rustix::fs::unlinkat(&dir, temp.as_str(), rustix::fs::AtFlags::empty());
        return Err(refusal(path.as_str(), e));
    }
    Ok((content.len() as u64, content.len() as u64))
}

fn chown_at(dir: &OwnedFd, name: &str, uid: u32, gid: u32) -> std::io::Result<()> {
    Ok(rustix::fs::chownat(
        dir,
        name,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?)
}

fn fchown(fd: &OwnedFd, uid: u32, gid: u32) -> std::io::Result<()> {
    Ok(rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    )?)
}

/// Regular files under `base` matching `pattern` (`*` stays within a directory, `**` crosses
/// them), as workspace-relative paths, sorted; at most `max`.
pub fn glob(
    root: &Root,
    base: Option<&SafePath>,
    pattern: &str,
    max: u32,
    max_walk: u64,
) -> Result<(Vec<String>, bool)> {
    let matcher = GlobBuilder::new(pattern.trim_start_matches("./"))
        .literal_separator(true)
        .build()
        .map_err(|e| Error::invalid(format!("glob pattern {pattern:?}: {e}")))?
        .compile_matcher();
    let base_str = base.map(|b| b.as_str()).unwrap_or("");
    let dir = root.open_dir(base_str).map_err(|e| refusal(base_str, e))?;
    let mut found = Vec::new();
    let mut truncated = false;
    let mut visited = 0u64;
    let complete = contain::walk(dir.as_fd(), &mut |e| {
        visited += 1;
        if visited > max_walk {
            truncated = true;
            return Visit::Stop;
        }
        if e.kind == Kind::File {
            if let Some(rel) = e.rel_str() {
                if matcher.is_match(rel) {
                    if found.len() >= max as usize {
                        truncated = true;
                        return Visit::Stop;
                    }
                    found.push(if base_str.is_empty() {
                        rel.to_owned()
                    } else {
                        format!("{base_str}/{rel}")
                    });
                }
            }
        }
        Visit::Continue
    })
    .map_err(Error::io("walking the workspace"))?;
    found.sort();
    Ok((found, truncated || !complete))
}

/// One grep hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    pub path: String,
    pub line: u32,
    pub text: String,
}

/// Lines matching `pattern` (literal unless `is_regex`) under `path` (file or directory);
/// binary files, files over 16 MiB and `.git` directories are skipped.
pub fn grep(
    root: &Root,
    path: Option<&SafePath>,
    pattern: &str,
    is_regex: bool,
    case_sensitive: bool,
    max: u32,
    max_walk: u64,
) -> Result<(Vec<Match>, bool)> {
    let source = if is_regex {
        pattern.to_owned()
    } else {
        regex::escape(pattern)
    };
    let re = RegexBuilder::new(&source)
        .case_insensitive(!case_sensitive)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| Error::invalid(format!("grep pattern {pattern:?}: {e}")))?;
    let start = path.map(|p| p.as_str()).unwrap_or("");
    let mut matches = Vec::new();
    let mut truncated = false;
    // A single file?
    if !start.is_empty() {
        match root.open_file(start) {
            Ok((file, _)) => {
                truncated = grep_file(file, start, &re, max, &mut matches);
                return Ok((matches, truncated));
            }
            Err(e) if e.kind() != std::io::ErrorKind::InvalidInput => {
                return Err(refusal(start, e))
            }
            Err(_) => {}
        }
    }
    let dir = root.open_dir(start).map_err(|e| refusal(start, e))?;
    let mut visited = 0u64;
    let mut failure = None;
    let complete = contain::walk(dir.as_fd(), &mut |e| {
        visited += 1;
        if visited > max_walk {
            truncated = true;
            return Visit::Stop;
        }
        let Some(rel) = e.rel_str() else {
            return Visit::Continue;
        };
        match e.kind {
            Kind::Dir if e.rel.rsplit(|b| *b == b'/').next() == Some(b".git") => Visit::SkipDir,
            Kind::File if (e.stat.st_size as u64) <= MAX_GREP_FILE_BYTES => {
                let shown = if start.is_empty() {
                    rel.to_owned()
                } else {
                    format!("{start}/{rel}")
                };
                match e.open_file() {
                    Ok((file, _)) => {
                        if grep_file(file, &shown, &re, max, &mut matches) {
                            truncated = true;
                            return Visit::Stop;
                        }
                    }
                    Err(err) if err.kind() == std::io::ErrorKind::InvalidInput => {}
                    Err(err) => {
                        failure = Some(err);
                        return Visit::Stop;
                    }
                }
                Visit::Continue
            }
            _ => Visit::Continue,
        }
    })
    .map_err(Error::io("walking the workspace"))?;
    if let Some(e) = failure {
        return Err(Error::io("searching the workspace")(e));
    }
    Ok((matches, truncated || !complete))
}

/// Greps one file; returns true when `max` matches were reached with more to come.
fn grep_file(
    file: std::fs::File,
    shown: &str,
    re: &regex::bytes::Regex,
    max: u32,
    out: &mut Vec<Match>,
) -> bool {
    let mut reader = BufReader::new(file.take(MAX_GREP_FILE_BYTES));
    let mut line = Vec::new();
    let mut number = 0u32;
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        number += 1;
        if number == 1 && line.iter().take(8192).any(|b| *b == 0) {
            return false; // binary
        }
        let content = line.strip_suffix(b"\n").unwrap_or(&line);
        let content = content.strip_suffix(b"\r").unwrap_or(content);
        if re.is_match(content) {
            if out.len() >= max as usize {
                return true;
            }
            let text: String = String::from_utf8_lossy(content)
                .chars()
                .take(MAX_LINE_CHARS)
                .collect();
            out.push(Match {
                path: shown.to_owned(),
                line: number,
                text,
            });
        }
    }
}
