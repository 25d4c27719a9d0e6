//! The FUSE side of the power-cut layer: serves the model's volatile state to whatever runs
//! on the mount, turns each fsync and fsyncdir into the model's, and counts the operations so
//! that the power can go at a chosen one. Once the power is off, every operation fails with
//! EIO and the durable state is frozen.

use std::ffi::OsStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use super::model::Model;

/// How long the kernel may cache names and attributes. Every change goes through this mount,
/// so the kernel's caches never go stale; a second saves most lookups.
const TTL: Duration = Duration::from_secs(1);

/// The disk: its model, whether it has power, and the operation that cuts it.
#[derive(Debug)]
pub struct Power {
    pub model: Model,
    pub on: bool,
    /// Operations served so far (each FUSE request that reads or changes the model).
    pub ops: u64,
    /// The operation the power goes at (it fails, like every later one).
    pub cut_at: Option<u64>,
    /// fsyncs (of files, of directories) served.
    pub fsyncs: (u64, u64),
}

impl Power {
    pub fn new(model: Model) -> Power {
        Power {
            model,
            on: true,
            ops: 0,
            cut_at: None,
            fsyncs: (0, 0),
        }
    }
}

/// The filesystem served over FUSE.
#[derive(Debug, Clone)]
pub struct Layer {
    pub power: Arc<Mutex<Power>>,
}

impl Layer {
    /// The model, if the power is still on (counting this operation; it may be the one the
    /// power goes at).
    fn powered(&self) -> Result<MutexGuard<'_, Power>, Errno> {
        let mut power = self.power.lock().unwrap_or_else(|p| p.into_inner());
        if !power.on {
            return Err(Errno::EIO);
        }
        power.ops += 1;
        if power.cut_at.is_some_and(|at| power.ops >= at) {
            power.on = false;
            return Err(Errno::EIO);
        }
        Ok(power)
    }

    fn attr(model: &Model, ino: u64) -> Result<FileAttr, Errno> {
        let inode = model.get(ino).map_err(errno)?;
        let size = inode.size();
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: inode.mtime,
            mtime: inode.mtime,
            ctime: inode.ctime,
            crtime: inode.ctime,
            kind: if inode.is_dir() {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: inode.mode,
            nlink: model.nlink(ino).map_err(errno)?,
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    /// Runs `op` on the powered model and answers with the attributes of the inode it
    /// returns.
    fn entry(&self, reply: ReplyEntry, op: impl FnOnce(&mut Model) -> Result<u64, Errno>) {
        let answer = self.powered().and_then(|mut power| {
            let ino = op(&mut power.model)?;
            Self::attr(&power.model, ino)
        });
        match answer {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn empty(&self, reply: ReplyEmpty, op: impl FnOnce(&mut Power) -> Result<(), Errno>) {
        match self.powered().and_then(|mut power| op(&mut power)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

fn errno(e: rustix::io::Errno) -> Errno {
    Errno::from_i32(e.raw_os_error())
}

fn mode_bits(mode: u32, umask: u32) -> u16 {
    (mode & !umask & 0o7777) as u16
}

impl Filesystem for Layer {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(reply, |m| m.lookup(parent.0, name).map_err(errno));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self
            .powered()
            .and_then(|power| Self::attr(&power.model, ino.0))
        {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let answer = self.powered().and_then(|mut power| {
            let m = &mut power.model;
            if let Some(size) = size {
                m.truncate(ino.0, size).map_err(errno)?;
            }
            if let Some(mode) = mode {
                m.chmod(ino.0, mode_bits(mode, 0)).map_err(errno)?;
            }
            Self::attr(m, ino.0)
        });
        match answer {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.entry(reply, |m| {
            m.mkdir(parent.0, name, mode_bits(mode, umask))
                .map_err(errno)
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(reply, |p| p.model.unlink(parent.0, name).map_err(errno));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.empty(reply, |p| p.model.rmdir(parent.0, name).map_err(errno));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            // RENAME_EXCHANGE and RENAME_WHITEOUT are not modelled.
            return reply.error(Errno::EINVAL);
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        self.empty(reply, |p| {
            p.model
                .rename(parent.0, name, newparent.0, newname, no_replace)
                .map_err(errno)
        });
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.entry(reply, |m| {
            m.link(ino.0, newparent.0, newname).map_err(errno)?;
            Ok(ino.0)
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self
            .powered()
            .and_then(|p| p.model.get(ino.0).map(drop).map_err(errno))
        {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let exclusive = flags & libc_o_excl() != 0;
        let answer = self.powered().and_then(|mut power| {
            let m = &mut power.model;
            let ino = m
                .create(parent.0, name, mode_bits(mode, umask), exclusive)
                .map_err(errno)?;
            if flags & libc_o_trunc() != 0 {
                m.truncate(ino, 0).map_err(errno)?;
            }
            Self::attr(m, ino)
        });
        match answer {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let power = match self.powered() {
            Ok(power) => power,
            Err(e) => return reply.error(e),
        };
        match power.model.read(ino.0, offset, size as usize) {
            Ok(bytes) => reply.data(bytes),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let answer = self
            .powered()
            .and_then(|mut p| p.model.write(ino.0, offset, data).map_err(errno));
        match answer {
            Ok(n) => reply.written(u32::try_from(n).unwrap_or(u32::MAX)),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |p| {
            p.model.fsync(ino.0).map_err(errno)?;
            p.fsyncs.0 += 1;
            Ok(())
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self
            .powered()
            .and_then(|p| p.model.list(ino.0).map(drop).map_err(errno))
        {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listed = self
            .powered()
            .and_then(|p| p.model.list(ino.0).map_err(errno));
        let entries = match listed {
            Ok(entries) => entries,
            Err(e) => return reply.error(e),
        };
        let dots = [
            (OsStr::new(".").to_owned(), ino.0, true),
            (OsStr::new("..").to_owned(), ino.0, true),
        ];
        let all = dots.into_iter().chain(entries);
        for (i, (name, child, is_dir)) in all.enumerate().skip(offset as usize) {
            let kind = if is_dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            if reply.add(INodeNo(child), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.empty(reply, |p| {
            p.model.fsync(ino.0).map_err(errno)?;
            p.fsyncs.1 += 1;
            Ok(())
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: fuser::ReplyStatfs) {
        // A roomy disk: 1 TiB in 4 KiB blocks, a million inodes.
        reply.statfs(1 << 28, 1 << 28, 1 << 28, 1 << 20, 1 << 20, 4096, 255, 4096);
    }
}

fn libc_o_excl() -> i32 {
    nix::fcntl::OFlag::O_EXCL.bits()
}

fn libc_o_trunc() -> i32 {
    nix::fcntl::OFlag::O_TRUNC.bits()
}
