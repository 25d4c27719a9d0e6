//! Projects: `<data_root>/projects/<project_id>/` with `docs/`, `workspace/`, `.cairn/runs/`,
//! and `.cairn/project.json` holding the id and creation time. (The id rule shared by
//! projects and runs is `layout::check_id`.)
//!
//! May depend on: state, layout, files, page, stamp, error, cairn-contain.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use bytes::Bytes;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use cairn_contain as contain;

use crate::error::{refusal, Error, Result};
use crate::files;
use crate::layout::check_id;
use crate::page::Page;
use crate::stamp::{mtime_of, timestamp_now};
use crate::state::{blocking, State};

/// Directories every project has.
pub const LAYOUT: &[&str] = &["docs", "workspace", ".cairn/runs"];
const METADATA: &str = ".cairn/project.json";

/// A project and when it was created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    pub project_id: String,
    pub created_at: String,
}

/// Creates the project when missing (idempotent) and returns its root and description.
pub(crate) fn ensure(state: &State, project_id: &str) -> Result<(OwnedFd, Project)> {
    check_id("project", project_id)?;
    match rustix::fs::mkdirat(
        state.layout.projects.as_fd(),
        project_id,
        Mode::from_raw_mode(contain::DIR_MODE),
    ) {
        Ok(()) => {
            contain::sync_dir(state.layout.projects.as_fd())
                .map_err(|e| Error::io("fsync of the projects directory", e))?;
            tracing::info!(project = project_id, "project created");
        }
        Err(Errno::EXIST) => {}
        Err(e) => return Err(Error::io(format!("creating project {project_id:?}"), e)),
    }
    let root = state.layout.project_root(project_id)?;
    for dir in LAYOUT {
        contain::ensure_dir(root.as_fd(), dir)
            .map_err(|e| refusal(e, project_id, dir, "creating"))?;
    }
    let project = match read_metadata(&root, project_id)? {
        Some(project) => project,
        None => {
            let json = serde_json::json!({"project_id": project_id, "created_at": timestamp_now()});
            let bytes = Bytes::from(format!("{json}\n"));
            // Two creators racing: overwrite=false lets exactly one publish its metadata.
            match files::write_bytes(state, root.as_fd(), project_id, METADATA, &[bytes], false) {
                Ok(_) | Err(Error::Exists { .. }) => {}
                Err(e) => return Err(e),
            }
            read_metadata(&root, project_id)?.ok_or_else(|| {
                Error::io(
                    "reading project metadata",
                    std::io::Error::other("metadata vanished"),
                )
            })?
        }
    };
    Ok((root, project))
}

/// `.cairn/project.json`, or None when absent; falls back to the directory's mtime when it
/// cannot be parsed (a project directory made by hand).
fn read_metadata(root: &OwnedFd, project_id: &str) -> Result<Option<Project>> {
    let fd = match contain::open(root.as_fd(), METADATA, OFlags::RDONLY | OFlags::NONBLOCK, 0) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(refusal(e, project_id, METADATA, "reading")),
    };
    let mut text = String::new();
    let _ = std::fs::File::from(fd)
        .take(64 << 10)
        .read_to_string(&mut text);
    let created_at = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.get("created_at")
                .and_then(|c| c.as_str())
                .map(String::from)
        });
    let created_at = match created_at {
        Some(c) => c,
        None => rustix::fs::fstat(root)
            .map(|st| mtime_of(&st))
            .unwrap_or_default(),
    };
    Ok(Some(Project {
        project_id: project_id.to_owned(),
        created_at,
    }))
}

/// CreateProject.
pub async fn create(state: &Arc<State>, project_id: &str) -> Result<Project> {
    let (state, id) = (state.clone(), project_id.to_owned());
    blocking(move || ensure(&state, &id).map(|(_, p)| p)).await
}

/// ListProjects: projects in id order, one page.
pub async fn list(state: &Arc<State>, page: Page) -> Result<(Vec<Project>, String)> {
    let state = state.clone();
    blocking(move || {
        let mut ids: Vec<String> = contain::read_dir(state.layout.projects.as_fd())
            .map_err(|e| Error::io("listing projects", e))?
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| check_id("project", name).is_ok())
            .collect();
        ids.sort();
        let (ids, next) = page.cut(ids, |s| s.as_str());
        let mut projects = Vec::with_capacity(ids.len());
        for id in ids {
            // Entries that are not directories (or vanished) are not projects.
            let Ok(root) = contain::open_dir(state.layout.projects.as_fd(), &id) else {
                continue;
            };
            if let Some(p) = read_metadata(&root, &id)? {
                projects.push(p);
            } else {
                let created_at = rustix::fs::fstat(&root)
                    .map(|st| mtime_of(&st))
                    .unwrap_or_default();
                projects.push(Project {
                    project_id: id,
                    created_at,
                });
            }
        }
        Ok((projects, next))
    })
    .await
}
