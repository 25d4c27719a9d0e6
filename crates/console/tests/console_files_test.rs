//! Project files through `console_router` (a real artifact-store): a traversal refused by the
//! store with its reason, Markdown without raw HTML, code as text, archives downloaded whole.
#![allow(clippy::unwrap_used)]

mod console_support;

use axum::http::{header, StatusCode};
use console_support::*;

#[tokio::test]
async fn traversal_in_an_artifact_link_is_refused_by_the_store() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(None));
    for (path, reason) in [
        ("../../etc/passwd", "traversal"),
        ("%2Fetc%2Fpasswd", "absolute_path"),
        ("docs/..%2F..%2F..%2Fetc%2Fpasswd", "traversal"),
    ] {
        let p = c.get(&format!("/projects/proj/files?path={path}")).await;
        assert_eq!(p.status, StatusCode::BAD_REQUEST, "{path}: {}", p.body);
        assert!(
            p.body.contains(&format!("(reason: {reason})")),
            "{path}: {}",
            p.body
        );
        assert!(p.body.contains("id=\"error-message\""), "{}", p.body);
        let d = c.get(&format!("/projects/proj/download?path={path}")).await;
        assert_eq!(d.status, StatusCode::BAD_REQUEST, "{path}");
        assert!(!d.body.contains("root:"), "nothing of the host leaks");
        let t = c.get(&format!("/projects/proj/tree?prefix={path}")).await;
        assert_eq!(t.status, StatusCode::BAD_REQUEST, "{path}");
    }
    // A project id that is a path is refused too.
    let p = c.get("/projects/..%2F..%2Fetc/files?path=passwd").await;
    assert!(p.status.is_client_error(), "{}", p.status);
    // The denylist holds for reads.
    let p = c.get("/projects/proj/files?path=.ssh/id_rsa").await;
    assert!(
        p.status == StatusCode::FORBIDDEN || p.status == StatusCode::BAD_REQUEST,
        "{}",
        p.status
    );
    // A missing file is a 404 page.
    let p = c.get("/projects/proj/files?path=docs/none.md").await;
    assert_eq!(p.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn markdown_is_rendered_without_raw_html_and_code_is_text() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(None));
    let md = c
        .get("/projects/proj/files?path=docs/run-1/report.md")
        .await;
    assert_eq!(md.status, StatusCode::OK, "{}", md.body);
    assert!(
        md.body.contains("<h1>Report</h1>") && md.body.contains("<strong>bold</strong>"),
        "{}",
        md.body
    );
    assert!(
        md.body.contains("&lt;script&gt;alert('md')&lt;/script&gt;"),
        "{}",
        md.body
    );
    assert!(!md.body.contains("<script>alert"), "{}", md.body);
    assert!(
        md.body
            .contains("href=\"/projects/proj/files?path=docs/run-1/next.md\""),
        "relative links stay in the project: {}",
        md.body
    );
    assert!(!md.body.contains("javascript:"), "{}", md.body);

    let code = c
        .get("/projects/proj/files?path=workspace/src/main.rs")
        .await;
    assert!(
        code.body.contains(
            "<pre class=\"code\"><code>fn main() { println!(&quot;&lt;b&gt;hi&lt;/b&gt;&quot;); }"
        ),
        "{}",
        code.body
    );

    let zip = c
        .get("/projects/proj/files?path=docs/run-1/bundle.zip")
        .await;
    assert!(zip.body.contains("This file is not text"), "{}", zip.body);
    assert!(!zip.body.contains("PK"), "binary bytes are not shown");

    let tree = c.get("/projects/proj/tree?prefix=docs").await;
    assert!(
        tree.body
            .contains("href=\"/projects/proj/tree?prefix=docs/run-1\""),
        "{}",
        tree.body
    );
}

#[tokio::test]
async fn archives_download_whole_as_attachments() {
    let s = Services::start().await;
    let mut c = Client::new(s.router(None));
    let d = c
        .get("/projects/proj/download?path=docs/run-1/bundle.zip")
        .await;
    assert_eq!(d.status, StatusCode::OK);
    assert_eq!(
        d.headers.get(header::CONTENT_TYPE).unwrap(),
        "application/octet-stream"
    );
    let disp = d
        .headers
        .get(header::CONTENT_DISPOSITION)
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        disp.starts_with("attachment; filename=\"bundle.zip\""),
        "{disp}"
    );
    assert_eq!(
        d.bytes.len(),
        3_000_004,
        "the whole file, streamed in chunks"
    );
    assert_eq!(&d.bytes[..4], b"PK\x03\x04");
    assert!(d.bytes[4..]
        .iter()
        .enumerate()
        .all(|(i, b)| *b == (i as u32 % 251) as u8));
    assert_eq!(d.headers.get(header::CONTENT_LENGTH).unwrap(), "3000004");
    // Only raster images are ever inline; a Markdown file asked inline is still an attachment.
    let md = c
        .get("/projects/proj/download?path=docs/run-1/report.md&inline=1")
        .await;
    assert!(md
        .headers
        .get(header::CONTENT_DISPOSITION)
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("attachment"));
}
