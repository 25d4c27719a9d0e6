//! The disk model behind the power-cut layer: every inode has a *volatile* state (what the
//! programs above see at once) and a *durable* one (what survives a power cut).
//!
//! The rules are the least Linux promises for a local filesystem (fsync(2), and the
//! "fsync the directory too" note of its manual), nothing a particular filesystem adds:
//!
//! - a write, a truncate, a create, a mkdir, a link, an unlink, a rename change only the
//!   volatile state;
//! - fsync (or fdatasync) of a file makes its current bytes durable, and only them: not its
//!   name in any directory;
//! - fsync of a directory makes its current entries (name → inode) durable, and only them: not
//!   the data of the files they name, nor the directory's own name in its parent;
//! - a power cut keeps exactly the durable state: from the durable root, the durable entries
//!   of each directory lead to inodes, each file with its durable bytes (empty when never
//!   fsync'd). A file whose data was fsync'd but whose name never was is unreachable, so lost;
//!   a rename is undone unless the directories were fsync'd after it; a name fsync'd before an
//!   unlink comes back.
//!
//! A real disk may keep more than this (a journal commit makes other changes durable on the
//! way), never less, so a program that is right here is right there; torn writes of data that
//! was never fsync'd are not modelled (such data is dropped whole). A rename across two
//! directories is two entry changes, each durable with its own directory's fsync. Modes are
//! kept as set, without a durable state of their own; owners and times are not modelled.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::SystemTime;

use rustix::io::Errno;

/// The root directory's inode number (FUSE's).
pub const ROOT: u64 = 1;

/// What an inode holds, volatile and durable.
#[derive(Debug, Clone)]
pub enum Body {
    File {
        data: Vec<u8>,
        durable: Vec<u8>,
    },
    Dir {
        entries: BTreeMap<OsString, u64>,
        durable: BTreeMap<OsString, u64>,
    },
}

#[derive(Debug, Clone)]
pub struct Inode {
    pub body: Body,
    /// Permission bits.
    pub mode: u16,
    /// Volatile names of this inode.
    nlink: u32,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

impl Inode {
    fn new(body: Body, mode: u16) -> Inode {
        let now = SystemTime::now();
        Inode {
            body,
            mode,
            nlink: 0,
            mtime: now,
            ctime: now,
        }
    }

    pub fn is_dir(&self) -> bool {
        matches!(self.body, Body::Dir { .. })
    }

    /// Volatile size in bytes.
    pub fn size(&self) -> u64 {
        match &self.body {
            Body::File { data, .. } => data.len() as u64,
            Body::Dir { entries, .. } => entries.len() as u64,
        }
    }

    fn touch(&mut self) {
        let now = SystemTime::now();
        self.mtime = now;
        self.ctime = now;
    }
}

/// Every inode ever made (none is freed: an unlinked one may come back at a cut).
#[derive(Debug)]
pub struct Model {
    inodes: HashMap<u64, Inode>,
    next: u64,
}

impl Model {
    /// An empty filesystem whose root directory is durable.
    pub fn empty() -> Model {
        let root = Inode::new(
            Body::Dir {
                entries: BTreeMap::new(),
                durable: BTreeMap::new(),
            },
            0o755,
        );
        Model {
            inodes: HashMap::from([(ROOT, root)]),
            next: ROOT + 1,
        }
    }

    /// A model of what is in `dir` (directories and regular files; anything else is refused),
    /// all of it durable, as a directory on a real disk that was synced before.
    pub fn load(dir: &Path) -> std::io::Result<Model> {
        let mut model = Model::empty();
        model.load_into(ROOT, dir)?;
        Ok(model)
    }

    fn load_into(&mut self, parent: u64, dir: &Path) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            let mode = (meta.permissions().mode() & 0o7777) as u16;
            let name = entry.file_name();
            let ino = if meta.is_dir() {
                let ino = self
                    .mkdir(parent, &name, mode)
                    .map_err(std::io::Error::from)?;
                self.load_into(ino, &entry.path())?;
                ino
            } else if meta.is_file() {
                let ino = self
                    .create(parent, &name, mode, true)
                    .map_err(std::io::Error::from)?;
                self.write(ino, 0, &std::fs::read(entry.path())?)
                    .map_err(std::io::Error::from)?;
                ino
            } else {
                return Err(std::io::Error::other(format!(
                    "{:?} is neither a file nor a directory; the model holds only those",
                    entry.path()
                )));
            };
            self.fsync(ino).map_err(std::io::Error::from)?;
        }
        self.fsync(parent).map_err(std::io::Error::from)
    }

    pub fn get(&self, ino: u64) -> Result<&Inode, Errno> {
        self.inodes.get(&ino).ok_or(Errno::NOENT)
    }

    fn get_mut(&mut self, ino: u64) -> Result<&mut Inode, Errno> {
        self.inodes.get_mut(&ino).ok_or(Errno::NOENT)
    }

    fn entries(&self, dir: u64) -> Result<&BTreeMap<OsString, u64>, Errno> {
        match &self.get(dir)?.body {
            Body::Dir { entries, .. } => Ok(entries),
            Body::File { .. } => Err(Errno::NOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        let inode = self.get_mut(dir)?;
        inode.touch();
        match &mut inode.body {
            Body::Dir { entries, .. } => Ok(entries),
            Body::File { .. } => Err(Errno::NOTDIR),
        }
    }

    /// stat's link count: a file's names; 2 + subdirectories for a directory.
    pub fn nlink(&self, ino: u64) -> Result<u32, Errno> {
        let inode = self.get(ino)?;
        if !inode.is_dir() {
            return Ok(inode.nlink);
        }
        let subdirs = self.list(ino)?.iter().filter(|(_, _, dir)| *dir).count();
        Ok(2 + u32::try_from(subdirs).unwrap_or(u32::MAX - 2))
    }

    pub fn lookup(&self, dir: u64, name: &OsStr) -> Result<u64, Errno> {
        self.entries(dir)?.get(name).copied().ok_or(Errno::NOENT)
    }

    /// (name, inode, is a directory) of each volatile entry.
    pub fn list(&self, dir: u64) -> Result<Vec<(OsString, u64, bool)>, Errno> {
        self.entries(dir)?
            .iter()
            .map(|(name, ino)| Ok((name.clone(), *ino, self.get(*ino)?.is_dir())))
            .collect()
    }

    fn add(&mut self, inode: Inode) -> u64 {
        let ino = self.next;
        self.next += 1;
        self.inodes.insert(ino, inode);
        ino
    }

    /// A name for `ino` in `dir`; EEXIST when taken.
    fn name(&mut self, dir: u64, name: &OsStr, ino: u64) -> Result<(), Errno> {
        if self.entries(dir)?.contains_key(name) {
            return Err(Errno::EXIST);
        }
        self.entries_mut(dir)?.insert(name.to_owned(), ino);
        let child = self.get_mut(ino)?;
        child.nlink += 1;
        child.ctime = SystemTime::now();
        Ok(())
    }

    /// Drops the name `name` in `dir` (the inode stays, for the durable state).
    fn unname(&mut self, dir: u64, name: &OsStr) -> Result<u64, Errno> {
        let ino = self.entries_mut(dir)?.remove(name).ok_or(Errno::NOENT)?;
        let child = self.get_mut(ino)?;
        child.nlink = child.nlink.saturating_sub(1);
        child.ctime = SystemTime::now();
        Ok(ino)
    }

    pub fn mkdir(&mut self, dir: u64, name: &OsStr, mode: u16) -> Result<u64, Errno> {
        if self.entries(dir)?.contains_key(name) {
            return Err(Errno::EXIST);
        }
        let body = Body::Dir {
            entries: BTreeMap::new(),
            durable: BTreeMap::new(),
        };
        let ino = self.add(Inode::new(body, mode));
        self.name(dir, name, ino)?;
        Ok(ino)
    }

    /// Creates a regular file; an existing name is EEXIST when `exclusive`, else opened.
    pub fn create(
        &mut self,
        dir: u64,
        name: &OsStr,
        mode: u16,
        exclusive: bool,
    ) -> Result<u64, Errno> {
        if let Some(ino) = self.entries(dir)?.get(name).copied() {
            return match (exclusive, self.get(ino)?.is_dir()) {
                (true, _) => Err(Errno::EXIST),
                (false, true) => Err(Errno::ISDIR),
                (false, false) => Ok(ino),
            };
        }
        let body = Body::File {
            data: Vec::new(),
            durable: Vec::new(),
        };
        let ino = self.add(Inode::new(body, mode));
        self.name(dir, name, ino)?;
        Ok(ino)
    }

    pub fn write(&mut self, ino: u64, offset: u64, bytes: &[u8]) -> Result<usize, Errno> {
        let inode = self.get_mut(ino)?;
        inode.touch();
        let Body::File { data, .. } = &mut inode.body else {
            return Err(Errno::ISDIR);
        };
        let start = usize::try_from(offset).map_err(|_| Errno::FBIG)?;
        let end = start.checked_add(bytes.len()).ok_or(Errno::FBIG)?;
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(bytes);
        Ok(bytes.len())
    }

    pub fn read(&self, ino: u64, offset: u64, size: usize) -> Result<&[u8], Errno> {
        let Body::File { data, .. } = &self.get(ino)?.body else {
            return Err(Errno::ISDIR);
        };
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(data.len());
        let end = start.saturating_add(size).min(data.len());
        Ok(&data[start..end])
    }

    pub fn truncate(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        let inode = self.get_mut(ino)?;
        inode.touch();
        let Body::File { data, .. } = &mut inode.body else {
            return Err(Errno::ISDIR);
        };
        data.resize(usize::try_from(size).map_err(|_| Errno::FBIG)?, 0);
        Ok(())
    }

    pub fn chmod(&mut self, ino: u64, mode: u16) -> Result<(), Errno> {
        let inode = self.get_mut(ino)?;
        inode.mode = mode;
        inode.ctime = SystemTime::now();
        Ok(())
    }

    pub fn unlink(&mut self, dir: u64, name: &OsStr) -> Result<(), Errno> {
        if self.get(self.lookup(dir, name)?)?.is_dir() {
            return Err(Errno::ISDIR);
        }
        self.unname(dir, name).map(drop)
    }

    pub fn rmdir(&mut self, dir: u64, name: &OsStr) -> Result<(), Errno> {
        let ino = self.lookup(dir, name)?;
        if !self.entries(ino)?.is_empty() {
            return Err(Errno::NOTEMPTY);
        }
        self.unname(dir, name).map(drop)
    }

    /// A new name for an inode (link(2)).
    pub fn link(&mut self, ino: u64, dir: u64, name: &OsStr) -> Result<(), Errno> {
        if self.get(ino)?.is_dir() {
            return Err(Errno::PERM);
        }
        self.name(dir, name, ino)
    }

    /// rename(2), with RENAME_NOREPLACE when `no_replace`. A directory may only replace an
    /// empty directory, a file only a file.
    pub fn rename(
        &mut self,
        dir: u64,
        name: &OsStr,
        new_dir: u64,
        new_name: &OsStr,
        no_replace: bool,
    ) -> Result<(), Errno> {
        let ino = self.lookup(dir, name)?;
        let moving_dir = self.get(ino)?.is_dir();
        if moving_dir && self.is_within(new_dir, ino)? {
            return Err(Errno::INVAL);
        }
        if let Ok(target) = self.lookup(new_dir, new_name) {
            if target == ino {
                return Ok(());
            }
            if no_replace {
                return Err(Errno::EXIST);
            }
            match (moving_dir, self.get(target)?.is_dir()) {
                (false, true) => return Err(Errno::ISDIR),
                (true, false) => return Err(Errno::NOTDIR),
                (true, true) if !self.entries(target)?.is_empty() => return Err(Errno::NOTEMPTY),
                _ => {}
            }
            self.unname(new_dir, new_name)?;
        }
        self.unname(dir, name)?;
        self.name(new_dir, new_name, ino)
    }

    /// Whether `dir` is `ancestor` or beneath it (volatile).
    fn is_within(&self, dir: u64, ancestor: u64) -> Result<bool, Errno> {
        if dir == ancestor {
            return Ok(true);
        }
        let mut stack = vec![ancestor];
        let mut seen = HashSet::new();
        while let Some(d) = stack.pop() {
            if !seen.insert(d) {
                continue;
            }
            for child in self.entries(d)?.values() {
                if *child == dir {
                    return Ok(true);
                }
                if self.get(*child)?.is_dir() {
                    stack.push(*child);
                }
            }
        }
        Ok(false)
    }

    /// fsync(2) or fdatasync(2): a file's bytes, or a directory's entries, become durable.
    pub fn fsync(&mut self, ino: u64) -> Result<(), Errno> {
        match &mut self.get_mut(ino)?.body {
            Body::File { data, durable } => durable.clone_from(data),
            Body::Dir { entries, durable } => durable.clone_from(entries),
        }
        Ok(())
    }

    /// Writes what a power cut leaves into `dst` (an empty directory): the durable entries
    /// from the root down, each file with its durable bytes; several durable names of one file
    /// become hard links. Returns how many files it wrote.
    pub fn materialise(&self, dst: &Path) -> std::io::Result<usize> {
        let mut written = HashMap::new();
        self.materialise_dir(ROOT, dst, &mut vec![ROOT], &mut written)?;
        Ok(written.len())
    }

    fn materialise_dir(
        &self,
        dir: u64,
        dst: &Path,
        ancestors: &mut Vec<u64>,
        written: &mut HashMap<u64, std::path::PathBuf>,
    ) -> std::io::Result<()> {
        let Ok(Inode {
            body: Body::Dir { durable, .. },
            ..
        }) = self.get(dir)
        else {
            return Err(std::io::Error::other(format!(
                "inode {dir} is no directory"
            )));
        };
        for (name, ino) in durable {
            // Durable names of other times may form a loop (a renamed directory): cut it.
            if ancestors.contains(ino) {
                continue;
            }
            let inode = self.get(*ino).map_err(std::io::Error::from)?;
            let path = dst.join(name);
            match &inode.body {
                Body::Dir { .. } => {
                    std::fs::create_dir(&path)?;
                    ancestors.push(*ino);
                    self.materialise_dir(*ino, &path, ancestors, written)?;
                    ancestors.pop();
                }
                Body::File { durable, .. } => match written.get(ino) {
                    Some(first) => std::fs::hard_link(first, &path)?,
                    None => {
                        std::fs::write(&path, durable)?;
                        written.insert(*ino, path.clone());
                    }
                },
            }
            std::fs::set_permissions(
                &path,
                std::fs::Permissions::from_mode(u32::from(inode.mode)),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    /// What a cut leaves, as (path, bytes) sorted.
    fn after_cut(model: &Model) -> Vec<(String, Vec<u8>)> {
        let tmp = tempfile::tempdir().unwrap();
        model.materialise(tmp.path()).unwrap();
        let mut out = Vec::new();
        for e in walkdir::WalkDir::new(tmp.path()).min_depth(1) {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(tmp.path()).unwrap();
            let rel = rel.to_string_lossy().into_owned();
            if e.file_type().is_dir() {
                out.push((format!("{rel}/"), Vec::new()));
            } else {
                out.push((rel, std::fs::read(e.path()).unwrap()));
            }
        }
        out.sort();
        out
    }

    fn file(path: &str, bytes: &[u8]) -> (String, Vec<u8>) {
        (path.to_owned(), bytes.to_vec())
    }

    #[test]
    fn a_file_needs_its_data_and_its_directory_fsynced() {
        let mut m = Model::empty();
        let a = m.create(ROOT, name("a"), 0o640, true).unwrap();
        m.write(a, 0, b"hello").unwrap();
        // Nothing fsync'd: nothing survives.
        assert_eq!(after_cut(&m), vec![]);
        // The data alone: the file has no durable name, so it is lost.
        m.fsync(a).unwrap();
        assert_eq!(after_cut(&m), vec![]);
        // The name alone (another file): it is there, empty.
        let b = m.create(ROOT, name("b"), 0o640, true).unwrap();
        m.write(b, 0, b"bytes").unwrap();
        m.fsync(ROOT).unwrap();
        assert_eq!(after_cut(&m), vec![file("a", b"hello"), file("b", b"")]);
        // Later writes need a later fsync.
        m.write(a, 5, b", world").unwrap();
        assert_eq!(after_cut(&m)[0], file("a", b"hello"));
        m.fsync(a).unwrap();
        assert_eq!(after_cut(&m)[0], file("a", b"hello, world"));
    }

    #[test]
    fn renames_unlinks_and_links_are_durable_only_with_their_directory() {
        let mut m = Model::empty();
        let d = m.mkdir(ROOT, name("d"), 0o750).unwrap();
        m.fsync(ROOT).unwrap();
        let t = m.create(d, name(".tmp"), 0o640, true).unwrap();
        m.write(t, 0, b"new").unwrap();
        m.fsync(t).unwrap();
        m.rename(d, name(".tmp"), d, name("f"), true).unwrap();
        assert_eq!(
            after_cut(&m),
            vec![file("d/", b"")],
            "rename not durable yet"
        );
        m.fsync(d).unwrap();
        assert_eq!(after_cut(&m), vec![file("d/", b""), file("d/f", b"new")]);
        // A new directory's entries are durable, but not its own name in its parent.
        let e = m.mkdir(d, name("e"), 0o750).unwrap();
        m.link(t, e, name("g")).unwrap();
        m.fsync(e).unwrap();
        assert_eq!(after_cut(&m).len(), 2, "e/ has no durable name in d");
        m.fsync(d).unwrap();
        assert_eq!(
            after_cut(&m),
            vec![
                file("d/", b""),
                file("d/e/", b""),
                file("d/e/g", b"new"),
                file("d/f", b"new"),
            ]
        );
        // An unlink not fsync'd is undone by the cut.
        m.unlink(e, name("g")).unwrap();
        assert!(m.lookup(e, name("g")).is_err());
        assert_eq!(after_cut(&m).len(), 4);
        m.fsync(e).unwrap();
        assert_eq!(after_cut(&m).len(), 3);
    }

    #[test]
    fn rename_refuses_what_linux_refuses() {
        let mut m = Model::empty();
        let d = m.mkdir(ROOT, name("d"), 0o750).unwrap();
        m.create(ROOT, name("f"), 0o640, true).unwrap();
        m.create(d, name("x"), 0o640, true).unwrap();
        let e = |r: Result<(), Errno>| r.unwrap_err();
        assert_eq!(
            e(m.rename(ROOT, name("f"), ROOT, name("d"), false)),
            Errno::ISDIR
        );
        assert_eq!(
            e(m.rename(ROOT, name("d"), d, name("z"), false)),
            Errno::INVAL
        );
        assert_eq!(
            e(m.rename(d, name("x"), ROOT, name("f"), true)),
            Errno::EXIST
        );
        m.rename(d, name("x"), ROOT, name("f"), false).unwrap();
        assert_eq!(m.list(d).unwrap(), vec![]);
        assert_eq!(e(m.rmdir(ROOT, name("f"))), Errno::NOTDIR);
        m.rmdir(ROOT, name("d")).unwrap();
        assert_eq!(m.list(ROOT).unwrap().len(), 1);
    }
}
