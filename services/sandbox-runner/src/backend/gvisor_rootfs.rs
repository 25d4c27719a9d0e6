//! The root file system of gVisor sandboxes: the sandbox image's, never the host's. It is
//! exported once through the Docker engine (the file system of a created, never started
//! container) into `<gvisor_rootfs_cache>/<image id>/` and shared, read-only, by every
//! sandbox of that image. It is made under a name of its own and renamed into place, so
//! runners and calls that make it at once never see half of one; a rebuilt image has a new id
//! and gets a new directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::error::{Error, Result};

/// Names of directories still being made start with this (and carry their maker's pid).
const MAKING: &str = ".making-";

/// The root of `image` under `cache`, made from the image when it is not there yet.
pub async fn prepare(cache: &Path, image: &str) -> Result<PathBuf> {
    let client = bollard::Docker::connect_with_local_defaults()
        .map_err(Error::docker("connecting to the Docker engine"))?;
    let client = tokio::time::timeout(Duration::from_secs(5), client.negotiate_version())
        .await
        .map_err(|_| Error::NoIsolation(format!(
            "the gvisor backend runs sandboxes on the file system of image {image:?}, exported through the Docker engine, which did not answer within 5 s: start it (DOCKER_HOST or /var/run/docker.sock)"
        )))?
        .map_err(Error::docker("negotiating the Engine API version"))?;
    let id = client
        .inspect_image(image)
        .await
        .map_err(|e| Error::Docker {
            context: format!(
                "sandbox image {image:?} is missing: build it with deploy/images/build-images.sh (nothing can be pulled) or set `image`"
            ),
            source: e,
        })?
        .id
        .unwrap_or_default();
    let key = id.trim_start_matches("sha256:");
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(Error::Sandbox(format!(
            "the Docker engine gave image {image:?} the id {id:?}"
        )));
    }
    let root = cache.join(key);
    if root.join("rootfs").is_dir() {
        return Ok(root.join("rootfs"));
    }
    create_private_dir(cache)?;
    sweep(cache);
    let making = cache.join(format!(
        "{MAKING}{key}-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ));
    let made = export(&client, image, &making).await;
    let made = match made {
        Ok(()) => match std::fs::rename(&making, &root) {
            Ok(()) => Ok(()),
            // Another maker was first: use theirs.
            Err(_) if root.join("rootfs").is_dir() => Ok(()),
            Err(e) => Err(Error::io(format!("moving {} into place", root.display()))(
                e,
            )),
        },
        Err(e) => Err(e),
    };
    if making.exists() {
        let _ = std::fs::remove_dir_all(&making);
    }
    made?;
    tracing::info!(image, root = %root.display(), "gvisor backend: the image's root file system is ready");
    Ok(root.join("rootfs"))
}

/// Writes the file system of a container created from `image` to `<dir>/rootfs`.
async fn export(client: &bollard::Docker, image: &str, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let name = format!("cairn_rootfs_{}", uuid::Uuid::now_v7().simple());
    let body = ContainerCreateBody {
        image: Some(image.to_owned()),
        cmd: Some(vec!["true".into()]),
        network_disabled: Some(true),
        ..Default::default()
    };
    let opts = CreateContainerOptionsBuilder::default().name(&name).build();
    client
        .create_container(Some(opts), body)
        .await
        .map_err(Error::docker(format!(
            "creating a container of {image} to export"
        )))?;
    let tar = dir.join("rootfs.tar");
    let written = async {
        let mut file = tokio::fs::File::create(&tar)
            .await
            .map_err(Error::io(format!("creating {}", tar.display())))?;
        let mut stream = client.export_container(&name);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(Error::docker(format!("exporting {image}")))?;
            file.write_all(&chunk)
                .await
                .map_err(Error::io(format!("writing {}", tar.display())))?;
        }
        file.flush()
            .await
            .map_err(Error::io(format!("writing {}", tar.display())))
    }
    .await;
    let remove = RemoveContainerOptionsBuilder::default().force(true).build();
    let _ = client.remove_container(&name, Some(remove)).await;
    written?;
    let (tar_path, rootfs) = (tar.clone(), dir.join("rootfs"));
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut archive = tar::Archive::new(std::fs::File::open(&tar_path)?);
        archive.set_preserve_permissions(true);
        archive.set_preserve_ownerships(true);
        archive.set_unpack_xattrs(false);
        archive.unpack(&rootfs)?;
        std::fs::remove_file(&tar_path)
    })
    .await
    .map_err(|e| Error::Sandbox(format!("unpacking the image panicked: {e}")))?
    .map_err(Error::io(format!(
        "unpacking {image} into {}",
        dir.display()
    )))
}

/// `dir` and its parents, `dir` itself readable by root only.
fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(Error::io(format!("chmod {}", dir.display())))
}

/// Removes what a maker that is gone left half made.
fn sweep(cache: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(MAKING) else {
            continue;
        };
        let pid = rest.split('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Two first uses at once end with one root file system and nothing half made.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_first_uses_share_one_root() {
        let image = crate::config::SANDBOX_IMAGE;
        let ready = async {
            let c = bollard::Docker::connect_with_local_defaults().ok()?;
            c.inspect_image(image).await.ok()
        };
        if !rustix::process::geteuid().is_root() || ready.await.is_none() {
            assert!(
                std::env::var("CAIRN_REQUIRE_DOCKER").as_deref() != Ok("1"),
                "CAIRN_REQUIRE_DOCKER=1 but docker with {image} (as root) is not usable"
            );
            println!("SKIP: rootfs export: needs root and a Docker engine with {image}");
            return;
        }
        let cache = tempfile::tempdir().unwrap();
        let (a, b) = tokio::join!(prepare(cache.path(), image), prepare(cache.path(), image));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b);
        assert!(a.join("usr/bin").is_dir() && a.join("etc/passwd").is_file());
        let names: Vec<String> = std::fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(!names[0].starts_with(MAKING));
        // A third use finds it without exporting again.
        assert_eq!(prepare(cache.path(), image).await.unwrap(), a);
    }
}
