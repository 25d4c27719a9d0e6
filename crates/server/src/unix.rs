//! Unix socket listeners and channels: a host reachable only by the users the socket file's
//! mode lets in. [`Listener::bind`] makes the socket mode 0600 before anyone can reach it, so
//! only its owner (and root) can connect; clients dial an address `unix:PATH`
//! ([`crate::connect_named`]). Connections carry no TLS: the file's mode is what keeps other
//! users out, so a host refuses to serve TLS settings on a socket.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The scheme of Unix socket addresses: `unix:/run/user/1000/cairn.sock` (`unix://PATH` too).
pub const SCHEME: &str = "unix:";

/// The socket path of a `unix:` address, or None for another address.
pub fn path_of(addr: &str) -> Option<&Path> {
    let rest = addr.strip_prefix(SCHEME)?;
    // unix:///abs/path and unix:/abs/path and unix:relative both name a file.
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    (!rest.is_empty()).then(|| Path::new(rest))
}

/// Why a socket could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{path}: something is already listening on this socket (another cairn?); stop it or pick another path")]
    InUse { path: PathBuf },
    #[error("{path}: the path exists and is not a socket; pick another path (nothing is removed)")]
    NotASocket { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A bound Unix socket of mode 0600; the file is removed when the listener is dropped.
pub struct Listener {
    listener: tokio::net::UnixListener,
    path: PathBuf,
}

impl Listener {
    /// Binds `path` with mode 0600. The socket is made in a new directory of mode 0700 beside
    /// `path`, given its mode, and only then renamed to `path`: no other user can connect in
    /// between, whatever the umask. A stale socket (nobody listening) at `path` is replaced;
    /// a live one or any other file is refused.
    pub fn bind(path: &Path) -> Result<Listener, BindError> {
        let io = |source| BindError::Io {
            path: path.to_owned(),
            source,
        };
        match std::fs::symlink_metadata(path) {
            Ok(m) if !m.file_type().is_socket() => {
                return Err(BindError::NotASocket {
                    path: path.to_owned(),
                })
            }
            Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => {
                    return Err(BindError::InUse {
                        path: path.to_owned(),
                    })
                }
                Err(_) => std::fs::remove_file(path).map_err(io)?,
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let private = parent.join(format!(
            ".cairn-socket-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&private)
            .map_err(io)?;
        let staged = private.join("s");
        let bound = (|| {
            let listener = std::os::unix::net::UnixListener::bind(&staged)?;
            std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
            std::fs::rename(&staged, path)?;
            listener.set_nonblocking(true)?;
            tokio::net::UnixListener::from_std(listener)
        })();
        let _ = std::fs::remove_file(&staged);
        let _ = std::fs::remove_dir(&private);
        Ok(Listener {
            listener: bound.map_err(io)?,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The address clients dial: `unix:PATH`.
    pub fn addr(&self) -> String {
        format!("{SCHEME}{}", self.path.display())
    }

    /// The connections, as a stream a tonic server accepts; the socket file goes when the
    /// stream is dropped.
    pub(crate) fn into_incoming(
        self,
    ) -> impl futures::Stream<Item = Result<tokio::net::UnixStream, std::io::Error>> + Send + 'static
    {
        futures::stream::unfold(self, |l| async move {
            let accepted = l.listener.accept().await.map(|(stream, _)| stream);
            Some((accepted, l))
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A lazily connecting channel to the socket at `path`; calls fail with UNAVAILABLE while
/// nothing listens there.
pub fn channel(path: &Path) -> tonic::transport::Channel {
    let path = path.to_owned();
    let connector = tower::service_fn(move |_: http::Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(&path).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    tonic::transport::Endpoint::from_static("http://unix-socket")
        .initial_stream_window_size(Some(crate::STREAM_WINDOW))
        .initial_connection_window_size(Some(crate::CONNECTION_WINDOW))
        .connect_with_connector_lazy(connector)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn unix_addresses_name_their_path() {
        assert_eq!(path_of("unix:/run/c.sock"), Some(Path::new("/run/c.sock")));
        assert_eq!(
            path_of("unix:///run/c.sock"),
            Some(Path::new("/run/c.sock"))
        );
        assert_eq!(path_of("unix:c.sock"), Some(Path::new("c.sock")));
        assert_eq!(path_of("unix:"), None);
        assert_eq!(path_of("127.0.0.1:7070"), None);
        assert_eq!(path_of("http://unix:7070"), None);
    }

    #[tokio::test]
    async fn a_socket_is_0600_from_the_start_and_goes_with_its_listener() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cairn.sock");
        let l = Listener::bind(&path).unwrap();
        let m = std::fs::symlink_metadata(&path).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        // Only the socket is left beside it: the private directory is gone.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("cairn.sock")]);
        // A live socket is not taken over; another file is never removed.
        assert!(matches!(
            Listener::bind(&path),
            Err(BindError::InUse { .. })
        ));
        let file = dir.path().join("plain");
        std::fs::write(&file, "keep").unwrap();
        assert!(matches!(
            Listener::bind(&file),
            Err(BindError::NotASocket { .. })
        ));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
        drop(l);
        assert!(!path.exists());
        // A stale socket (nobody listening) is replaced.
        let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(stale);
        assert!(path.exists());
        let again = Listener::bind(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        drop(again);
    }
}
