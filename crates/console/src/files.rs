//! Project files through the artifact-store: the file view (Markdown rendered, code and text
//! escaped, binaries and archives offered for download), streaming downloads and the directory
//! browser. Paths from the browser go to the store as given; the store validates them
//! (pathguard) and its refusal is shown. Nothing here opens a file.

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use cairn_proto::v1::{get_response, EntryKind, FileInfo, GetRequest, ListRequest, PageRequest};
use maud::{html, Markup};
use serde::Deserialize;
use tonic::Code;

use super::evidence;
use super::markdown;
use super::page::{self, layout};
use super::session::Visitor;
use super::{Console, ConsoleError};

/// Most bytes of a file shown in the browser (the download has all of it).
pub(super) const VIEW_LIMIT: u64 = 1 << 20;

/// The start of a file as the store returned it.
pub(super) struct Read {
    pub info: FileInfo,
    pub bytes: Vec<u8>,
    /// The file is larger than what was read.
    pub truncated: bool,
}

impl Read {
    /// The bytes as text, when they are text (UTF-8 without NUL; a character cut by the
    /// limit at the very end is dropped).
    pub fn text(&self) -> Option<&str> {
        let s = match std::str::from_utf8(&self.bytes) {
            Ok(s) => s,
            Err(e) if self.truncated && e.error_len().is_none() => {
                std::str::from_utf8(&self.bytes[..e.valid_up_to()]).ok()?
            }
            Err(_) => return None,
        };
        (!s.contains('\0')).then_some(s)
    }
}

/// Reads at most `limit` bytes of `path`; None when there is no such file.
pub(super) async fn read(
    console: &Console,
    project: &str,
    path: &str,
    limit: u64,
) -> Result<Option<Read>, ConsoleError> {
    let what = format!("reading {path}");
    let req = GetRequest {
        project_id: project.to_owned(),
        path: path.to_owned(),
        offset: 0,
        length: limit,
    };
    let fut = async {
        let mut stream = console.store().get(req).await?.into_inner();
        let mut info = None;
        let mut bytes = Vec::new();
        while let Some(msg) = stream.message().await? {
            match msg.msg {
                Some(get_response::Msg::Info(i)) => info = Some(i),
                Some(get_response::Msg::Chunk(c)) => {
                    let room = (limit as usize).saturating_sub(bytes.len());
                    bytes.extend_from_slice(&c[..c.len().min(room)]);
                }
                None => {}
            }
        }
        Ok::<_, tonic::Status>((info, bytes))
    };
    match tokio::time::timeout(console.rpc_timeout(), fut).await {
        Err(_) => Err(ConsoleError::Timeout {
            what,
            secs: console.config().rpc_timeout_s,
        }),
        Ok(Err(s)) if s.code() == Code::NotFound => Ok(None),
        Ok(Err(s)) => Err(ConsoleError::rpc(&what, s)),
        Ok(Ok((None, _))) => Err(ConsoleError::Rpc {
            what,
            code: Code::Internal,
            message: "the store sent no file description".into(),
            reason: None,
        }),
        Ok(Ok((Some(info), bytes))) => {
            let truncated = info.size_bytes > bytes.len() as u64;
            Ok(Some(Read {
                info,
                bytes,
                truncated,
            }))
        }
    }
}

/// One page of entries under `prefix` (empty when the directory does not exist) and the
/// token of the next page.
pub(super) async fn list(
    console: &Console,
    project: &str,
    prefix: &str,
    recursive: bool,
    page_size: u32,
    page_token: &str,
) -> Result<(Vec<FileInfo>, String), ConsoleError> {
    let req = ListRequest {
        project_id: project.to_owned(),
        prefix: prefix.to_owned(),
        recursive,
        page: Some(PageRequest {
            page_size,
            page_token: page_token.to_owned(),
        }),
    };
    match console
        .call(&format!("listing {prefix}/"), console.store().list(req))
        .await
    {
        Ok(r) => Ok((r.entries, r.next_page_token)),
        Err(ConsoleError::Rpc {
            code: Code::NotFound,
            ..
        }) => Ok((Vec::new(), String::new())),
        Err(e) => Err(e),
    }
}

/// How a file is shown.
#[derive(Debug, PartialEq)]
enum Shape {
    Markdown,
    Image(&'static str),
    Binary,
    Text,
}

fn extension(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default()
}

fn shape(path: &str) -> Shape {
    match extension(path).as_str() {
        "md" | "markdown" => Shape::Markdown,
        "png" => Shape::Image("image/png"),
        "jpg" | "jpeg" => Shape::Image("image/jpeg"),
        "gif" => Shape::Image("image/gif"),
        "webp" => Shape::Image("image/webp"),
        "zip" | "tar" | "gz" | "tgz" | "bz2" | "xz" | "zst" | "7z" | "jar" | "whl" | "pdf"
        | "exe" | "so" | "dll" | "bin" | "wasm" | "class" | "o" | "a" => Shape::Binary,
        _ => Shape::Text,
    }
}

/// Links to each directory above `path`.
fn breadcrumbs(project: &str, path: &str) -> Markup {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    html! {
        nav.crumbs {
            a href=(page::tree_url(project, "")) { (project) }
            @for (i, part) in parts.iter().enumerate() {
                " / "
                @if i + 1 < parts.len() {
                    a href=(page::tree_url(project, &parts[..=i].join("/"))) { (part) }
                } @else {
                    span { (part) }
                }
            }
        }
    }
}

#[derive(Deserialize)]
pub(super) struct FileQuery {
    #[serde(default)]
    path: String,
    #[serde(default)]
    inline: Option<String>,
}

pub(super) async fn view(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path(project): Path<String>,
    Query(q): Query<FileQuery>,
) -> Result<Response, ConsoleError> {
    if q.path.is_empty() {
        return Err(ConsoleError::BadRequest(
            "which file? add ?path=docs/... to the address".into(),
        ));
    }
    let Some(file) = read(&console, &project, &q.path, VIEW_LIMIT).await? else {
        return Err(ConsoleError::NotFound(format!(
            "there is no file {} in project {project}",
            q.path
        )));
    };
    let download = page::download_url(&project, &q.path);
    // A run's documents (its notes, its reports) link the evidence they cite.
    let cites = match (shape(&q.path), evidence::run_of(&q.path)) {
        (Shape::Markdown, Some(run)) => Some(evidence::load(&console, &project, run).await),
        _ => None,
    };
    let content = match (shape(&q.path), file.text()) {
        (Shape::Image(_), _) => {
            html! { img.preview src=(format!("{download}&inline=1")) alt=(q.path); }
        }
        (Shape::Binary, _) | (_, None) => html! {
            p.hint { "This file is not text; download it to open it." }
        },
        (Shape::Markdown, Some(text)) => html! {
            article.markdown { (markdown::render(text, &markdown::Base { project: &project, path: &q.path, cites: cites.as_ref() })) }
        },
        (Shape::Text, Some(text)) => html! { pre.code { code { (text) } } },
    };
    let flash = console.sessions().take_flash(&visitor.session_id);
    let body = html! {
        (breadcrumbs(&project, &q.path))
        h1.path { (q.path) }
        p.meta {
            (page::size(file.info.size_bytes)) " · sha256 " code { (file.info.sha256) }
            " · modified " (page::when(&file.info.modified_at))
            " · " a.download href=(download) download { "download" }
        }
        @if file.truncated {
            p.hint { "Showing the first " (page::size(VIEW_LIMIT)) "; download the file for the rest." }
        }
        (content)
    };
    Ok(layout(&q.path, Some(&visitor), flash.as_ref(), body).into_response())
}

/// `Content-Disposition` naming the file's last component (ASCII fallback and UTF-8 form).
fn disposition(path: &str, inline: bool) -> HeaderValue {
    let name = path.rsplit('/').next().unwrap_or("download");
    let ascii: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let kind = if inline { "inline" } else { "attachment" };
    let v = format!(
        "{kind}; filename=\"{ascii}\"; filename*=UTF-8''{}",
        page::seg(name)
    );
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

/// Streams a file from the store: memory stays flat whatever its size. Only raster images
/// are ever served inline (for Markdown and the image view); everything else is an attachment.
pub(super) async fn download(
    State(console): State<Console>,
    Path(project): Path<String>,
    Query(q): Query<FileQuery>,
) -> Result<Response, ConsoleError> {
    if q.path.is_empty() {
        return Err(ConsoleError::BadRequest(
            "which file? add ?path=docs/... to the address".into(),
        ));
    }
    let what = format!("downloading {}", q.path);
    let req = GetRequest {
        project_id: project.clone(),
        path: q.path.clone(),
        offset: 0,
        length: 0,
    };
    let mut stream = console.call(&what, console.store().get(req)).await?;
    let first = tokio::time::timeout(console.rpc_timeout(), stream.message())
        .await
        .map_err(|_| ConsoleError::Timeout {
            what: what.clone(),
            secs: console.config().rpc_timeout_s,
        })?
        .map_err(|s| ConsoleError::rpc(&what, s))?;
    let Some(get_response::Msg::Info(info)) = first.and_then(|m| m.msg) else {
        return Err(ConsoleError::Rpc {
            what,
            code: Code::Internal,
            message: "the store sent no file description".into(),
            reason: None,
        });
    };
    if info.kind != EntryKind::File as i32 {
        return Err(ConsoleError::BadRequest(format!(
            "{} is not a file",
            q.path
        )));
    }
    let inline = match (q.inline.is_some(), shape(&q.path)) {
        (true, Shape::Image(mime)) => Some(mime),
        _ => None,
    };
    // After an error the stream ends (the client sees a broken download, never a short file
    // passed off as whole: Content-Length is the file's size).
    let body = futures::stream::unfold(Some(stream), |state| async move {
        let mut s = state?;
        loop {
            match s.message().await {
                Ok(Some(m)) => {
                    if let Some(get_response::Msg::Chunk(c)) = m.msg {
                        return Some((Ok::<Bytes, std::io::Error>(c), Some(s)));
                    }
                }
                Ok(None) => return None,
                Err(status) => {
                    return Some((
                        Err(std::io::Error::other(status.message().to_owned())),
                        None,
                    ))
                }
            }
        }
    });
    let mut res = Body::from_stream(body).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(inline.unwrap_or("application/octet-stream")),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(info.size_bytes));
    h.insert(
        header::CONTENT_DISPOSITION,
        disposition(&q.path, inline.is_some()),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; sandbox"),
    );
    Ok(res)
}

#[derive(Deserialize)]
pub(super) struct TreeQuery {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    page_token: String,
}

/// One directory of the project, a page at a time.
pub(super) async fn tree(
    State(console): State<Console>,
    Extension(visitor): Extension<Visitor>,
    Path(project): Path<String>,
    Query(q): Query<TreeQuery>,
) -> Result<Response, ConsoleError> {
    let prefix = q.prefix.trim_end_matches('/');
    let (entries, next) = list(&console, &project, prefix, false, 500, &q.page_token).await?;
    let flash = console.sessions().take_flash(&visitor.session_id);
    let body = html! {
        (breadcrumbs(&project, prefix))
        h1.path { (if prefix.is_empty() { project.as_str() } else { prefix }) "/" }
        @if entries.is_empty() {
            p.hint { "Nothing here." }
        } @else {
            (file_table(&project, &entries))
        }
        @if !next.is_empty() {
            p { a href=(format!("{}&page_token={}", page::tree_url(&project, prefix), page::qv(&next))) { "Next page" } }
        }
    };
    Ok(layout(
        &format!("{project}/{prefix}"),
        Some(&visitor),
        flash.as_ref(),
        body,
    )
    .into_response())
}

/// Entries with links: directories to the browser, files to the view and the download.
pub(super) fn file_table(project: &str, entries: &[FileInfo]) -> Markup {
    html! {
        table.files {
            thead { tr { th { "Path" } th.num { "Size" } th { "Modified" } th { "Download" } } }
            tbody {
                @for e in entries {
                    tr {
                        @if e.kind == EntryKind::Directory as i32 {
                            td data-label="Path" { a href=(page::tree_url(project, &e.path)) { (e.path) "/" } }
                            td {} td data-label="Modified" { (page::when(&e.modified_at)) } td {}
                        } @else if e.kind == EntryKind::File as i32 {
                            td data-label="Path" { a.file href=(page::file_url(project, &e.path)) { (e.path) } }
                            td.num data-label="Size" { (page::size(e.size_bytes)) }
                            td data-label="Modified" { (page::when(&e.modified_at)) }
                            td { a href=(page::download_url(project, &e.path)) download { "download" } }
                        } @else {
                            td data-label="Path" { (e.path) } td {} td data-label="Modified" { (page::when(&e.modified_at)) } td { "(not served)" }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn shapes_by_extension() {
        assert_eq!(shape("docs/a.MD"), Shape::Markdown);
        assert_eq!(shape("x/out.tar.gz"), Shape::Binary);
        assert_eq!(shape("src/main.rs"), Shape::Text);
        assert_eq!(shape("a.png"), Shape::Image("image/png"));
        assert_eq!(shape("Makefile"), Shape::Text);
    }

    #[test]
    fn disposition_is_a_valid_header() {
        let v = disposition("docs/ä b\"c.zip", false);
        let s = v.to_str().unwrap();
        assert!(
            s.starts_with(
                "attachment; filename=\"__b_c.zip\"; filename*=UTF-8''%C3%A4%20b%22c.zip"
            ),
            "{s}"
        );
    }
}
