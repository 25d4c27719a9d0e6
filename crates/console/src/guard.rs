//! Which requests the console answers at all: only those addressed to one of its own names
//! (Host: the listen address, the loopback names, configured `public_hosts`), and, for every
//! POST, only those sent from one of its own pages (Origin). A web page whose name an attacker
//! rebinds to 127.0.0.1 reaches the console with the attacker's name as Host and gets nothing
//! (no page, no session, no CSRF token); a form on another site or another local port fails
//! the Origin check even before the CSRF token is looked at.
//!
//! Runs outermost (before sessions), and must never depend on anything but the request line
//! and headers.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{Console, ConsoleError};

/// A host name with an optional port, lowercased (IPv6 addresses in brackets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct HostName {
    name: String,
    port: Option<u16>,
}

impl HostName {
    /// `name`, `name:port`, `[v6]`, `[v6]:port`.
    pub(super) fn parse(s: &str) -> Result<HostName, String> {
        let s = s.trim();
        let authority: axum::http::uri::Authority = s
            .parse()
            .map_err(|_| "not a host name or host:port".to_owned())?;
        if authority.as_str().contains('@') || authority.host().is_empty() {
            return Err("not a host name or host:port".into());
        }
        Ok(HostName {
            name: authority.host().to_ascii_lowercase(),
            port: authority.port_u16(),
        })
    }
}

/// The Host names the console answers to.
pub(super) struct AllowedHosts {
    /// Any port: the loopback names and the listen address's IP.
    names: Vec<String>,
    /// From `public_hosts`: with a port, only that port.
    public: Vec<HostName>,
}

impl AllowedHosts {
    pub(super) fn new(
        listen: Option<SocketAddr>,
        public_hosts: &[String],
    ) -> Result<AllowedHosts, ConsoleError> {
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        if let Some(a) = listen.filter(|a| !a.ip().is_unspecified()) {
            names.push(match a.ip() {
                std::net::IpAddr::V4(ip) => ip.to_string(),
                std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            });
        }
        let public = public_hosts
            .iter()
            .map(|h| {
                HostName::parse(h)
                    .map_err(|e| ConsoleError::Config(format!("console.public_hosts: `{h}`: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(AllowedHosts { names, public })
    }

    fn allows(&self, host: &HostName) -> bool {
        self.names.contains(&host.name) || self.is_public(host)
    }

    fn is_public(&self, host: &HostName) -> bool {
        self.public
            .iter()
            .any(|p| p.name == host.name && (p.port.is_none() || p.port == host.port))
    }
}

/// The Host a request was sent to: the Host header (HTTP/1.1), else the URI's authority
/// (HTTP/2 `:authority`).
fn host_of(req: &Request) -> Option<&str> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
}

/// Whether a POST's Origin is one of the console's own pages: the same scheme-less authority
/// as the Host it was sent to, or a configured public host (a proxy may rewrite Host).
fn origin_ok(hosts: &AllowedHosts, headers: &HeaderMap, host: &str) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    if authority.contains('/') {
        return false;
    }
    if authority.eq_ignore_ascii_case(host) {
        return true;
    }
    HostName::parse(authority).is_ok_and(|h| hosts.is_public(&h))
}

/// Middleware: refuses a request to a Host not in the allowlist, and a POST whose Origin is
/// not the console's own; each refusal is logged at warn with the peer.
pub(super) async fn check_host_and_origin(
    State(console): State<Console>,
    req: Request,
    next: Next,
) -> Response {
    let hosts = &console.inner.hosts;
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_else(|| "unknown".into());
    let host = host_of(&req).unwrap_or("").to_owned();
    if !HostName::parse(&host).is_ok_and(|h| hosts.allows(&h)) {
        tracing::warn!(peer = %peer, host = %host, path = %req.uri().path(), "console request refused: Host not allowed");
        return ConsoleError::Forbidden(format!(
            "this console does not answer to the host name `{host}`; open it by its own address, or add the name to console.public_hosts"
        ))
        .into_response();
    }
    let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if !safe && !origin_ok(hosts, req.headers(), &host) {
        let origin = req
            .headers()
            .get(header::ORIGIN)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("(none)")
            .to_owned();
        tracing::warn!(peer = %peer, host = %host, origin = %origin, path = %req.uri().path(), "console POST refused: Origin not the console's own");
        return ConsoleError::Forbidden(format!(
            "this form was not sent from the console's own page (Origin {origin}); reload the console and try again"
        ))
        .into_response();
    }
    next.run(req).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_post_s_origin_must_be_the_host_it_was_sent_to_or_a_public_host() {
        let hosts = AllowedHosts::new(None, &["ops.example.com:8443".into()]).unwrap();
        let ok = |origin: Option<&str>, host: &str| {
            let mut headers = HeaderMap::new();
            if let Some(o) = origin {
                headers.insert(header::ORIGIN, o.parse().unwrap());
            }
            origin_ok(&hosts, &headers, host)
        };
        assert!(ok(Some("http://127.0.0.1:7480"), "127.0.0.1:7480"));
        assert!(ok(Some("https://LOCALHOST:7480"), "localhost:7480"));
        // Behind a proxy that rewrites Host: the configured public name.
        assert!(ok(Some("https://ops.example.com:8443"), "127.0.0.1:7480"));
        for (origin, host) in [
            (None, "127.0.0.1:7480"),
            (Some("null"), "127.0.0.1:7480"),
            (Some("http://127.0.0.1:7481"), "127.0.0.1:7480"),
            (Some("http://evil.example"), "127.0.0.1:7480"),
            (Some("127.0.0.1:7480"), "127.0.0.1:7480"),
            (Some("http://127.0.0.1:7480/x"), "127.0.0.1:7480"),
            (Some("https://ops.example.com"), "127.0.0.1:7480"),
        ] {
            assert!(!ok(origin, host), "{origin:?} to {host}");
        }
    }

    #[test]
    fn host_names_parse() {
        assert_eq!(
            HostName::parse("LocalHost:7480").unwrap(),
            HostName {
                name: "localhost".into(),
                port: Some(7480)
            }
        );
        assert_eq!(HostName::parse("[::1]:1").unwrap().name, "[::1]");
        assert!(HostName::parse("").is_err());
        assert!(HostName::parse("a b").is_err());
        assert!(HostName::parse("user@host").is_err());
        let hosts = AllowedHosts::new(
            Some("10.0.0.5:7480".parse().unwrap()),
            &["ops.example.com:8443".into()],
        )
        .unwrap();
        assert!(hosts.allows(&HostName::parse("10.0.0.5:7480").unwrap()));
        assert!(hosts.allows(&HostName::parse("ops.example.com:8443").unwrap()));
        assert!(!hosts.allows(&HostName::parse("ops.example.com").unwrap()));
        assert!(!hosts.allows(&HostName::parse("10.0.0.6:7480").unwrap()));
    }
}
