//! Where a command's logs go. `cairn up` and `cairn serve` log to stderr (they are services).
//! Every other command that starts services itself keeps their log lines in
//! `<data-root>/logs/cairn.log`, so the terminal shows only the command's output and its one
//! error; `-v` / `--verbose` prints that path and copies the lines to stderr too.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::cli::{Cli, Command};

/// The log file of `cli`'s command, or None when it logs to stderr (services, or commands
/// that talk to an address and embed nothing).
pub fn file_of(cli: &Cli) -> Option<PathBuf> {
    let g = &cli.global;
    match &cli.command {
        Command::Up(_) | Command::Serve(_) => return None,
        Command::Health(_) | Command::Certs(_) | Command::Tokens(_) | Command::Config(_) => {
            return None
        }
        _ => {}
    }
    let remote = [&g.addr, &g.store_addr, &g.ingest_addr, &g.sandbox_addr]
        .iter()
        .any(|a| a.is_some());
    (!remote).then(|| g.data_root.join("logs").join("cairn.log"))
}

/// A log file opened on the first line written (a command that logs nothing creates none),
/// with the lines also on stderr when `tee`.
pub struct LogFile {
    path: PathBuf,
    file: OnceLock<Option<File>>,
    tee: bool,
}

impl LogFile {
    pub fn new(path: PathBuf, tee: bool) -> LogFile {
        LogFile {
            path,
            file: OnceLock::new(),
            tee,
        }
    }

    fn file(&self) -> Option<&File> {
        self.file
            .get_or_init(|| {
                if let Some(dir) = self.path.parent() {
                    std::fs::create_dir_all(dir).ok()?;
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.path)
                    .ok()
            })
            .as_ref()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogFile {
    type Writer = Lines<'a>;

    fn make_writer(&'a self) -> Lines<'a> {
        Lines {
            file: self.file(),
            tee: self.tee,
        }
    }
}

/// One log line's writer: the file, and stderr with -v. A line that cannot be written is
/// dropped; logging never fails a command.
pub struct Lines<'a> {
    file: Option<&'a File>,
    tee: bool,
}

impl Write for Lines<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(mut f) = self.file {
            let _ = f.write_all(buf);
        }
        if self.tee {
            let _ = std::io::stderr().write_all(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
