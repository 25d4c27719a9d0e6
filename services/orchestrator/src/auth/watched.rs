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
