//! For Docker tests of the toolchain image: the image's name, a Docker network the test
//! creates, and a local Python package index (PEP 503 "simple", one tiny wheel) bound on that
//! network's gateway address (the host's end of the bridge), so a container on the network
//! reaches it and nothing else does. Also used by the orchestrator's code delivery test
//! (#[path]).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::Command;
use std::sync::{Arc, Mutex};

use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The toolchain image tests use (CAIRN_TOOLCHAIN_IMAGE, default cairn-toolchain:latest).
pub fn toolchain_image() -> String {
    std::env::var("CAIRN_TOOLCHAIN_IMAGE").unwrap_or_else(|_| "cairn-toolchain:latest".into())
}

/// Does the Docker engine have the toolchain image?
pub fn toolchain_image_present() -> bool {
    Command::new("docker")
        .args(["image", "inspect", &toolchain_image()])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The package the index serves and what importing it prints.
pub const PACKAGE: &str = "cairntiny";
pub const VALUE: &str = "served-by-the-test-index";

/// A Docker network removed when dropped.
pub struct TestNetwork {
    pub name: String,
    /// The bridge's address on the host.
    pub gateway: String,
}

impl TestNetwork {
    pub fn create(tag: &str) -> TestNetwork {
        let name = format!("cairn-test-{tag}-{}", std::process::id());
        let _ = Command::new("docker")
            .args(["network", "rm", &name])
            .output();
        let out = Command::new("docker")
            .args(["network", "create", "--driver", "bridge", &name])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docker network create {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = Command::new("docker")
            .args([
                "network",
                "inspect",
                "-f",
                "{{range .IPAM.Config}}{{.Gateway}}{{end}}",
                &name,
            ])
            .output()
            .unwrap();
        let gateway = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(!gateway.is_empty(), "network {name} has no gateway address");
        TestNetwork { name, gateway }
    }
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["network", "rm", &self.name])
            .output();
    }
}

/// The index: its URL (`http://<gateway>:<port>/simple/`) and the paths it was asked for.
pub struct PackageIndex {
    pub url: String,
    pub host: String,
    requests: Arc<Mutex<Vec<String>>>,
}

impl PackageIndex {
    /// Serves on `addr` (an address of this host, port 0 for any) until the runtime ends.
    pub async fn serve(addr: &str) -> PackageIndex {
        let listener = tokio::net::TcpListener::bind(format!("{addr}:0"))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let wheel_name = format!("{PACKAGE}-1.0-py3-none-any.whl");
        let wheel = wheel();
        let page = format!(
            "<!DOCTYPE html><html><body><a href=\"/files/{wheel_name}#sha256={}\">{wheel_name}</a></body></html>\n",
            hex::encode(sha2::Sha256::digest(&wheel))
        );
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let (page, wheel, wheel_name, seen) = (
                    page.clone(),
                    wheel.clone(),
                    wheel_name.clone(),
                    seen.clone(),
                );
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head);
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                    seen.lock().unwrap().push(path.clone());
                    let (status, kind, body) = if path == format!("/simple/{PACKAGE}/") {
                        ("200 OK", "text/html", page.into_bytes())
                    } else if path == format!("/files/{wheel_name}") {
                        ("200 OK", "application/octet-stream", wheel)
                    } else {
                        ("404 Not Found", "text/plain", b"not found\n".to_vec())
                    };
                    let reply = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(reply.as_bytes()).await;
                    let _ = conn.write_all(&body).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        PackageIndex {
            url: format!("http://{addr}:{port}/simple/"),
            host: addr.to_owned(),
            requests,
        }
    }

    /// Paths asked for so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// A shell script that makes a venv in `dir`, installs the package from this index only,
    /// and prints what importing it gives.
    pub fn pip_install_script(&self, dir: &str) -> String {
        format!(
            "set -e\npython3 -m venv {dir}\n{dir}/bin/pip install --no-cache-dir --retries 0 --timeout 10 \
             --index-url {url} --trusted-host {host} {PACKAGE}\n\
             {dir}/bin/python -c 'import {PACKAGE}; print({PACKAGE}.VALUE)'\n",
            url = self.url,
            host = self.host,
        )
    }
}

/// A pure-Python wheel of PACKAGE 1.0 whose module holds VALUE.
pub fn wheel() -> Vec<u8> {
    let info = format!("{PACKAGE}-1.0.dist-info");
    let files = [
        (
            format!("{PACKAGE}/__init__.py"),
            format!("VALUE = {VALUE:?}\n"),
        ),
        (
            format!("{info}/METADATA"),
            format!("Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n"),
        ),
        (
            format!("{info}/WHEEL"),
            "Wheel-Version: 1.0\nGenerator: cairn-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                .to_owned(),
        ),
    ];
    let mut record = String::new();
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default();
    for (name, body) in &files {
        zip.start_file(name.as_str(), opts).unwrap();
        zip.write_all(body.as_bytes()).unwrap();
        record.push_str(&format!(
            "{name},sha256={},{}\n",
            urlsafe_b64(&sha2::Sha256::digest(body.as_bytes())),
            body.len()
        ));
    }
    record.push_str(&format!("{info}/RECORD,,\n"));
    zip.start_file(format!("{info}/RECORD"), opts).unwrap();
    zip.write_all(record.as_bytes()).unwrap();
    zip.finish().unwrap().into_inner()
}

/// Base64 with the URL-safe alphabet and no padding (wheel RECORD hashes).
fn urlsafe_b64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}
