//! What a Docker container may see and do: the host config every run and session container
//! gets (no network unless asked, memory without swap, cpu, pids, a read-only root, no
//! capabilities, no new privileges, an init, no engine logs) and a session's two writable
//! areas.

use std::collections::HashMap;

use bollard::models::{HostConfig, HostConfigLogConfig};

use crate::limits::Limits;

/// Every restriction the engine offers, for runs and sessions alike. `network`: the Docker
/// network to join (`docker_network`), or None for none.
pub fn host_config(limits: &Limits, network: Option<&str>) -> HostConfig {
    let memory = limits.memory_bytes as i64;
    HostConfig {
        network_mode: Some(network.unwrap_or("none").into()),
        memory: Some(memory),
        // Equal to memory: no swap.
        memory_swap: Some(memory),
        nano_cpus: Some((limits.cpu_millis * 1_000_000) as i64),
        pids_limit: Some(limits.pids as i64),
        readonly_rootfs: Some(true),
        // `exec` (the engine's default is noexec), as on the local backend: build tools run
        // what they make there (a venv's scripts, test binaries).
        tmpfs: Some(HashMap::from([(
            "/tmp".to_string(),
            format!(
                "rw,exec,nosuid,nodev,size={},mode=1777",
                limits.memory_bytes
            ),
        )])),
        // An init reaps zombies and passes SIGTERM on; when it exits everything in the
        // container's pid namespace dies, setsid'd or double-forked children included.
        init: Some(true),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges".into()]),
        auto_remove: Some(false),
        // Output is read from the attach stream; nothing is kept in engine logs on disk.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".into()),
            config: None,
        }),
        ..Default::default()
    }
}

/// Where a session's /workspace and /tmpfs live.
pub enum SessionAreasAt<'a> {
    /// The runner's own areas (host directories of bounded size), bound in.
    Runner {
        workspace: &'a std::path::Path,
        tmpfs: &'a std::path::Path,
    },
    /// tmpfs mounts the engine makes, of `size` bytes each, owned by the sandbox user.
    Engine { size: u64, uid: u32, gid: u32 },
}

/// A session container's host config: `base` (every restriction of a run) with its two
/// writable areas. Programs may run from them (build tools run what they make), but never
/// setuid or as devices.
pub fn session_host_config(base: HostConfig, areas: SessionAreasAt<'_>) -> HostConfig {
    match areas {
        SessionAreasAt::Runner { workspace, tmpfs } => HostConfig {
            binds: Some(vec![
                format!("{}:/workspace:rw", workspace.display()),
                format!("{}:/tmpfs:rw", tmpfs.display()),
            ]),
            ..base
        },
        SessionAreasAt::Engine { size, uid, gid } => {
            let mut mounts = base.tmpfs.clone().unwrap_or_default();
            for dir in ["/workspace", "/tmpfs"] {
                mounts.insert(
                    dir.to_string(),
                    format!("rw,exec,nosuid,nodev,size={size},mode=0755,uid={uid},gid={gid}"),
                );
            }
            HostConfig {
                tmpfs: Some(mounts),
                ..base
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        memory_bytes: 256 << 20,
        cpu_millis: 1500,
        pids: 33,
        ..Limits::DEFAULTS
    };

    #[test]
    fn a_container_gets_every_restriction_the_engine_offers() {
        let c = host_config(&L, None);
        assert_eq!(c.network_mode.as_deref(), Some("none"), "no network");
        assert_eq!(c.memory, Some(256 << 20));
        assert_eq!(c.memory_swap, Some(256 << 20), "no swap beyond memory");
        assert_eq!(c.nano_cpus, Some(1_500_000_000));
        assert_eq!(c.pids_limit, Some(33));
        assert_eq!(c.readonly_rootfs, Some(true));
        assert_eq!(c.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(c.security_opt, Some(vec!["no-new-privileges".to_owned()]));
        assert_eq!(c.init, Some(true), "an init reaps and forwards signals");
        assert_eq!(c.auto_remove, Some(false), "the runner removes it");
        assert_eq!(
            c.log_config.and_then(|l| l.typ).as_deref(),
            Some("none"),
            "nothing kept in engine logs"
        );
        assert_eq!(
            c.tmpfs,
            Some(HashMap::from([(
                "/tmp".to_owned(),
                format!("rw,exec,nosuid,nodev,size={},mode=1777", 256u64 << 20)
            )]))
        );
        assert_eq!(c.privileged, None, "never privileged");
        assert_eq!(c.binds, None, "no host path of a run's");
        assert_eq!(c.cap_add, None);
    }

    #[test]
    fn with_network_a_container_joins_only_the_named_network() {
        let c = host_config(&L, Some("cairn-sandbox"));
        assert_eq!(c.network_mode.as_deref(), Some("cairn-sandbox"));
        assert_eq!(c.cap_drop, Some(vec!["ALL".to_owned()]));
    }

    #[test]
    fn a_sessions_areas_are_bound_or_engine_tmpfs_never_setuid_or_devices() {
        let base = || host_config(&L, None);
        let (workspace, tmpfs) = (std::path::Path::new("/a/w"), std::path::Path::new("/a/t"));
        let bound = session_host_config(base(), SessionAreasAt::Runner { workspace, tmpfs });
        let binds = ["/a/w:/workspace:rw", "/a/t:/tmpfs:rw"].map(str::to_owned);
        assert_eq!(bound.binds, Some(binds.to_vec()));
        assert_eq!(bound.tmpfs, base().tmpfs, "only /tmp as a tmpfs");
        assert_eq!(bound.readonly_rootfs, Some(true));

        let (size, uid, gid) = (4096, 10001, 10002);
        let engine = session_host_config(base(), SessionAreasAt::Engine { size, uid, gid });
        assert_eq!(engine.binds, None, "no host path");
        let tmpfs = engine.tmpfs.unwrap_or_default();
        for dir in ["/workspace", "/tmpfs"] {
            assert_eq!(
                tmpfs.get(dir).map(String::as_str),
                Some("rw,exec,nosuid,nodev,size=4096,mode=0755,uid=10001,gid=10002"),
                "{dir}"
            );
        }
        assert!(tmpfs.contains_key("/tmp"), "/tmp kept");
        assert_eq!(engine.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(engine.network_mode.as_deref(), Some("none"));
    }
}
