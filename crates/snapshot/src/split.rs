//! A payload with memory taken in as it arrives: each checkpoint part
//! (`checkpoint/NAME@OFFSET`) goes straight into the restore directory's `checkpoint/`, and
//! every other entry, byte for byte, into `rest`, a tar of what is left (the session's files
//! and anything `payload::unpack` is to judge). Nothing here is trusted until the whole
//! payload matched its sha256: the caller discards the directory and `rest` otherwise.
//! The memory image is written once, where runsc reads it, instead of into a payload file
//! first and out of it after.

use std::io::Write;
use std::path::Path;

use crate::assembly::{part_of, Assembly};
use crate::Error;

type Result<T> = std::result::Result<T, Error>;

const BLOCK: usize = 512;

fn wrote(e: std::io::Error) -> Error {
    Error::io("writing the received snapshot")(e)
}

enum State {
    /// Gathering the next header block.
    Header,
    /// An entry that goes on into `rest`: bytes left of its data and padding.
    Rest { left: u64 },
    /// A checkpoint part: bytes left of its data, then of its padding.
    Part { name: String, left: u64, pad: u64 },
}

/// The splitter; see the module's header.
pub struct Split<W: Write> {
    rest: W,
    assembly: Assembly,
    block: Vec<u8>,
    state: State,
    /// The last header was an extension (a long name, pax attributes): the entry it
    /// describes goes into `rest` whole, as the name its header shows is not its own.
    extended: bool,
}

impl<W: Write> Split<W> {
    /// Parts go into `dir/checkpoint/` (made here), the rest into `rest`.
    pub fn new(dir: &Path, rest: W) -> Result<Split<W>> {
        Ok(Split {
            rest,
            assembly: Assembly::new(dir)?,
            block: Vec::with_capacity(BLOCK),
            state: State::Header,
            extended: false,
        })
    }

    /// Takes the next bytes of the payload.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            match &mut self.state {
                State::Header => {
                    let n = (BLOCK - self.block.len()).min(bytes.len());
                    self.block.extend_from_slice(&bytes[..n]);
                    bytes = &bytes[n..];
                    if self.block.len() == BLOCK {
                        self.header()?;
                    }
                }
                State::Rest { left } => {
                    let n = (*left).min(bytes.len() as u64) as usize;
                    self.rest.write_all(&bytes[..n]).map_err(wrote)?;
                    bytes = &bytes[n..];
                    *left -= n as u64;
                    if *left == 0 {
                        self.state = State::Header;
                    }
                }
                State::Part { name, left, pad } => {
                    if *left > 0 {
                        let n = (*left).min(bytes.len() as u64) as usize;
                        self.assembly.append(name, &bytes[..n])?;
                        bytes = &bytes[n..];
                        *left -= n as u64;
                    } else {
                        let n = (*pad).min(bytes.len() as u64) as usize;
                        bytes = &bytes[n..];
                        *pad -= n as u64;
                    }
                    if *left == 0 && *pad == 0 {
                        self.state = State::Header;
                    }
                }
            }
        }
        Ok(())
    }

    /// The payload ended: it must end between entries. Gives `rest` back.
    pub fn finish(self) -> Result<W> {
        match (&self.state, self.block.is_empty()) {
            (State::Header, true) => Ok(self.rest),
            (State::Part { name, .. }, _) => Err(Error::Corrupt(format!(
                "the snapshot ends inside checkpoint/{name}"
            ))),
            _ => Err(Error::Corrupt(
                "the snapshot ends inside one of its entries".into(),
            )),
        }
    }

    /// A whole header block: a checkpoint part, or an entry for `rest`.
    fn header(&mut self) -> Result<()> {
        let mut block = [0u8; BLOCK];
        block.copy_from_slice(&self.block);
        self.block.clear();
        if block.iter().all(|&b| b == 0) {
            // The archive's end (or padding after it).
            return self.rest.write_all(&block).map_err(wrote);
        }
        let h = tar::Header::from_byte_slice(&block[..]);
        let damaged = |what: &str| Error::Corrupt(format!("the snapshot's tar is damaged: {what}"));
        let sum: u32 = block
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    b as u32
                }
            })
            .sum();
        if h.cksum().ok() != Some(sum) {
            return Err(damaged("a header's checksum does not match it"));
        }
        let size = h
            .entry_size()
            .map_err(|e| damaged(&format!("a header's size: {e}")))?;
        let kind = h.entry_type();
        let part = match (self.extended, kind.is_file()) {
            (false, true) => h.path().ok().and_then(|p| part_of(&p)),
            _ => None,
        };
        self.extended = matches!(
            kind,
            tar::EntryType::GNULongName
                | tar::EntryType::GNULongLink
                | tar::EntryType::XHeader
                | tar::EntryType::XGlobalHeader
        );
        let pad = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
        match part {
            Some((name, offset)) => {
                self.assembly.begin(&name, offset)?;
                let all = size
                    .checked_add(pad)
                    .ok_or_else(|| damaged("an entry's size is out of range"))?;
                self.state = match all {
                    0 => State::Header,
                    _ => State::Part {
                        name,
                        left: size,
                        pad,
                    },
                };
            }
            None => {
                self.rest.write_all(&block).map_err(wrote)?;
                let left = size
                    .checked_add(pad)
                    .ok_or_else(|| damaged("an entry's size is out of range"))?;
                self.state = match left {
                    0 => State::Header,
                    _ => State::Rest { left },
                };
            }
        }
        Ok(())
    }
}
