//! In-process connections: services hosted in one process (`cairn up`, the commands that start
//! services themselves) call each other through memory instead of a port. Nothing outside the
//! process can open such a connection, so a host trusts it as the process itself; this is what
//! lets a host require a credential from every caller on its port without weakening the calls
//! its own services make to each other. Addresses look like `inproc://<n>`; they exist only
//! while the [`Listener`] that made them does.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::mpsc;
use tonic::transport::server::Connected;

/// The scheme of in-process addresses.
pub const SCHEME: &str = "inproc://";

/// Bytes buffered each way of one connection.
const BUFFER: usize = 1 << 20;

type Hosts = Mutex<HashMap<String, mpsc::UnboundedSender<DuplexStream>>>;

fn hosts() -> &'static Hosts {
    static HOSTS: OnceLock<Hosts> = OnceLock::new();
    HOSTS.get_or_init(Default::default)
}

/// The server end: connections opened to [`Listener::addr`].
pub struct Listener {
    addr: String,
    incoming: mpsc::UnboundedReceiver<DuplexStream>,
}

impl Listener {
    /// A new, unique in-process address.
    pub fn new() -> Listener {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let addr = format!(
            "{SCHEME}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let (tx, incoming) = mpsc::unbounded_channel();
        if let Ok(mut h) = hosts().lock() {
            h.insert(addr.clone(), tx);
        }
        Listener { addr, incoming }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The connections, as a stream a tonic server accepts.
    pub(crate) fn into_incoming(
        self,
    ) -> impl futures::Stream<Item = Result<Connection, std::io::Error>> + Send + 'static {
        let Listener { addr, incoming } = self;
        let unregister = Unregister(addr);
        futures::stream::unfold((incoming, unregister), |(mut rx, u)| async move {
            let io = rx.recv().await?;
            Some((Ok(Connection(io)), (rx, u)))
        })
    }
}

impl Default for Listener {
    fn default() -> Self {
        Listener::new()
    }
}

/// Removes the address when the server stops accepting.
struct Unregister(String);

impl Drop for Unregister {
    fn drop(&mut self) {
        if let Ok(mut h) = hosts().lock() {
            h.remove(&self.0);
        }
    }
}

/// What an in-process connection tells the server about its peer: that it is this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InProcess;

/// The server side of one in-process connection.
pub struct Connection(DuplexStream);

impl Connected for Connection {
    type ConnectInfo = InProcess;
    fn connect_info(&self) -> InProcess {
        InProcess
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// A lazily connecting channel to the in-process address `addr`; calls fail with UNAVAILABLE
/// while no host serves it.
pub fn channel(addr: &str) -> tonic::transport::Channel {
    let addr = addr.to_owned();
    let connector = tower::service_fn(move |_: http::Uri| {
        let addr = addr.clone();
        async move {
            let (client, server) = tokio::io::duplex(BUFFER);
            let sent = hosts()
                .lock()
                .ok()
                .and_then(|h| h.get(&addr).cloned())
                .map(|tx| tx.send(server).is_ok())
                .unwrap_or(false);
            if sent {
                Ok(hyper_util::rt::TokioIo::new(client))
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    format!("no service is hosted at {addr} in this process"),
                ))
            }
        }
    });
    tonic::transport::Endpoint::from_static("http://in-process")
        .initial_stream_window_size(Some(crate::STREAM_WINDOW))
        .initial_connection_window_size(Some(crate::CONNECTION_WINDOW))
        .connect_with_connector_lazy(connector)
}
