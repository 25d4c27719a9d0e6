//! Project ids follow one pattern (no leading `.` or `-`, no Windows device names), and the
//! store's files and directories are private to its user and group (0640 / 0750).
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use cairn_proto::v1::CreateProjectRequest;
use common::*;
use tonic::Code;

#[tokio::test]
async fn project_ids_with_a_leading_dot_or_dash_or_a_device_name_are_refused() {
    let mut s = serve().await;
    for id in [".cairn", "-rf", "CON", "con", "nul.txt", "COM1", "_x", ""] {
        let e = s
            .client
            .create_project(CreateProjectRequest {
                project_id: id.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{id:?}: {e:?}");
        assert!(
            e.message().contains("starting with a letter or digit")
                && e.message().contains("device name"),
            "{id:?}: the message states the pattern: {}",
            e.message()
        );
        // A write that would create the project is refused the same way.
        let e = put(&mut s.client, id, "docs/a.md", b"x").await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{id:?}: {e:?}");
    }
    for id in ["demo", "a.b_c-d", "Team1", "console", "com10"] {
        create_project(&mut s.client, id).await;
    }
    assert!(!s.data_root.join("projects/.cairn").exists());
    assert!(!s.data_root.join("projects/-rf").exists());
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

/// Every file is 0640 (the claim key 0600) and every directory 0750 at and below `root` (tests
/// run with umask 022).
fn assert_private(root: &Path) {
    let mut seen = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        assert_eq!(mode(&dir), 0o750, "directory {}", dir.display());
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let ft = std::fs::symlink_metadata(&path).unwrap().file_type();
            if ft.is_dir() {
                stack.push(path);
            } else if ft.is_file() {
                // The claim key is the store's secret: owner only.
                let want = if path.ends_with("claim.key") {
                    0o600
                } else {
                    0o640
                };
                assert_eq!(mode(&path), want, "file {}", path.display());
                seen += 1;
            }
        }
    }
    assert!(seen >= 3, "files were written under {}", root.display());
}

#[tokio::test]
async fn the_stores_files_are_0640_and_its_directories_0750() {
    let mut s = serve().await;
    put(&mut s.client, "p", "docs/deep/a.md", b"hello")
        .await
        .unwrap();
    put(&mut s.client, "p", "workspace/src/main.rs", b"fn main() {}")
        .await
        .unwrap();
    put_overwrite(&mut s.client, "p", "docs/deep/a.md", b"again")
        .await
        .unwrap();
    assert_private(&s.data_root);
}
