//! A file read at start and read again when it changes (size or modification time), checked
//! at most once per [`RELOAD_CHECK`]. A change that does not parse keeps what was read before:
//! a half-edited or removed file must not open the doors.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How often the file is looked at for changes (an edit takes effect within this, without a
/// restart).
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);

pub struct Watched<T> {
    path: PathBuf,
    what: &'static str,
    read: fn(&Path) -> Result<T, String>,
    state: Mutex<Loaded<T>>,
}

struct Loaded<T> {
    value: Arc<T>,
    stamp: Option<(SystemTime, u64)>,
    checked: Instant,
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl<T> Watched<T> {
    /// Reads `path` with `read`; `what` names the file in logs.
    pub fn open(
        path: &Path,
        what: &'static str,
        read: fn(&Path) -> Result<T, String>,
    ) -> Result<Watched<T>, String> {
        let value = read(path)?;
        Ok(Watched {
            path: path.to_owned(),
            what,
            read,
            state: Mutex::new(Loaded {
                value: Arc::new(value),
                stamp: stamp(path),
                checked: Instant::now(),
            }),
        })
    }

    pub fn current(&self) -> Arc<T> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.checked.elapsed() >= RELOAD_CHECK {
            s.checked = Instant::now();
            let now = stamp(&self.path);
            if now != s.stamp {
                s.stamp = now;
                match (self.read)(&self.path) {
                    Ok(v) => {
                        tracing::info!(path = %self.path.display(), "{} reloaded", self.what);
                        s.value = Arc::new(v);
                    }
                    Err(e) => {
                        tracing::warn!(path = %self.path.display(), error = %e, "keeping the previous {}", self.what)
                    }
                }
            }
        }
        s.value.clone()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn number(path: &Path) -> Result<u32, String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        text.trim().parse().map_err(|e| format!("{e}"))
    }

    /// Waits out the reload check (the stamp compares whole modification times and sizes).
    fn past_the_check() {
        std::thread::sleep(RELOAD_CHECK + Duration::from_millis(100));
    }

    #[test]
    fn a_change_is_read_after_the_check_and_a_broken_or_removed_file_keeps_the_last_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        std::fs::write(&path, "1").unwrap();
        let w = Watched::open(&path, "number", number).unwrap();
        assert_eq!(*w.current(), 1);

        // Within the check interval a change is not looked at.
        std::fs::write(&path, "22").unwrap();
        assert_eq!(*w.current(), 1, "read again before the check interval");
        past_the_check();
        assert_eq!(*w.current(), 22);

        // A change that does not parse keeps the value before it.
        std::fs::write(&path, "not a number").unwrap();
        past_the_check();
        assert_eq!(*w.current(), 22);
        // And a good edit after it is taken.
        std::fs::write(&path, "333").unwrap();
        past_the_check();
        assert_eq!(*w.current(), 333);

        // A removed file does not open the doors either.
        std::fs::remove_file(&path).unwrap();
        past_the_check();
        assert_eq!(*w.current(), 333);
        assert!(Watched::open(&path, "number", number).is_err());
    }
}
