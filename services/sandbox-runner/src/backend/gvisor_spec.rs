//! What a gVisor sandbox may see and do: the OCI runtime spec the runner writes for it (its
//! root read-only, only the binds it is given, its own pid, ipc, uts, mount and (without
//! network) network namespaces, no capabilities, no new privileges, the rlimits of every
//! backend, memory and cpu in its cgroup) and runsc's network flag.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use super::local::rlimits;
use crate::limits::Limits;

/// Open files a sandboxed process may hold.
const NOFILE: u64 = 1024;

/// One sandboxed program to start.
pub(super) struct Spec<'a> {
    pub(super) id: String,
    /// The first process runs as root with only CAP_SETUID and CAP_SETGID (a session's: it
    /// starts the session's commands as the sandbox user), not as the sandbox user.
    pub(super) root: bool,
    /// (host path, sandbox path, writable)
    pub(super) binds: Vec<(PathBuf, &'static str, bool)>,
    pub(super) network: bool,
    pub(super) limits: &'a Limits,
    pub(super) timeout: Duration,
    pub(super) cwd: &'a str,
    pub(super) env: &'a [(String, String)],
    pub(super) argv: Vec<String>,
}

/// runsc's network: `none` (no interface but loopback), or with network `host`, the sockets
/// of the runner's network namespace (`sandbox`, gVisor's own stack, refuses the root
/// network namespace, where runners usually are).
pub(super) fn network_flag(network: bool) -> &'static str {
    if network {
        "--network=host"
    } else {
        "--network=none"
    }
}

/// The OCI runtime spec of `spec`'s sandbox over the read-only `rootfs`. `cgroup`: the
/// runner's cgroup, where the sandbox's memory and cpu limits go, or None where runsc cannot
/// use cgroups. `user`: the sandbox uid and gid.
pub(super) fn oci_config(
    spec: &Spec<'_>,
    rootfs: &Path,
    cgroup: Option<&str>,
    user: (u32, u32),
) -> Value {
    let mut rl: Vec<Value> = rlimits(spec.limits, spec.timeout)
        .into_iter()
        .map(|(name, value)| {
            json!({"type": format!("RLIMIT_{}", name.to_uppercase()), "hard": value, "soft": value})
        })
        .collect();
    rl.push(json!({"type": "RLIMIT_NOFILE", "hard": NOFILE, "soft": NOFILE}));
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs"}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": ["nosuid", "noexec", "nodev", "ro"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
               "options": [format!("size={}", spec.limits.memory_bytes), "mode=1777"]}),
    ];
    for (host, inside, writable) in &spec.binds {
        mounts.push(
            json!({"destination": inside, "type": "bind", "source": host,
                           "options": ["rbind", if *writable { "rw" } else { "ro" }]}),
        );
    }
    let mut namespaces = vec![
        json!({"type": "pid"}),
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
    ];
    if !spec.network {
        namespaces.push(json!({"type": "network"}));
    }
    let mut linux = json!({ "namespaces": namespaces });
    if let Some(parent) = cgroup {
        linux["cgroupsPath"] = json!(format!("/{parent}/{}", spec.id));
        linux["resources"] = json!({
            "memory": {"limit": spec.limits.memory_bytes, "swap": spec.limits.memory_bytes},
            "cpu": {"quota": spec.limits.cpu_millis * 100, "period": 100_000},
        });
    }
    let no_caps: Vec<String> = Vec::new();
    let (uid, gid, caps) = if spec.root {
        (0, 0, vec!["CAP_SETUID".to_owned(), "CAP_SETGID".to_owned()])
    } else {
        (user.0, user.1, Vec::new())
    };
    json!({
        "ociVersion": "1.0.0",
        "process": {
            "user": {"uid": uid, "gid": gid},
            "args": spec.argv,
            "env": spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
            "cwd": spec.cwd,
            "noNewPrivileges": true,
            "capabilities": {"bounding": caps, "effective": caps,
                             "inheritable": no_caps, "permitted": caps},
            "rlimits": rl,
        },
        "root": {"path": rootfs, "readonly": true},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": linux,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        pids: 9,
        memory_bytes: 64 << 20,
        cpu_millis: 500,
        max_output_bytes: 1000,
        ..Limits::DEFAULTS
    };
    const T: Duration = Duration::from_millis(4_500);

    fn config(root: bool, network: bool, cgroup: Option<&str>) -> Value {
        let env = [("HOME".to_owned(), "/output".to_owned())];
        let spec = Spec {
            id: "sb-1".into(),
            root,
            binds: vec![
                ("/h/in".into(), "/input", false),
                ("/h/out".into(), "/output", true),
            ],
            network,
            limits: &L,
            timeout: T,
            cwd: "/output",
            env: &env,
            argv: vec!["python3".into(), "-c".into(), "pass".into()],
        };
        oci_config(&spec, Path::new("/roots/img"), cgroup, (10001, 10002))
    }

    #[test]
    fn the_program_runs_unprivileged_on_a_read_only_root_with_only_its_environment() {
        let c = config(false, false, None);
        let p = &c["process"];
        assert_eq!(p["user"], json!({"uid": 10001, "gid": 10002}));
        assert_eq!(p["noNewPrivileges"], json!(true));
        let none = json!({"bounding": [], "effective": [], "inheritable": [], "permitted": []});
        assert_eq!(p["capabilities"], none);
        assert_eq!(
            (&p["env"], &p["cwd"]),
            (&json!(["HOME=/output"]), &json!("/output"))
        );
        assert_eq!(p["args"], json!(["python3", "-c", "pass"]));
        assert_eq!(c["root"], json!({"path": "/roots/img", "readonly": true}));
        assert_eq!(c["hostname"], json!("sandbox"));
        let root = config(true, false, None);
        assert_eq!(root["process"]["user"], json!({"uid": 0, "gid": 0}));
        let setid = json!(["CAP_SETUID", "CAP_SETGID"]);
        assert_eq!(
            root["process"]["capabilities"],
            json!({"bounding": setid, "effective": setid, "inheritable": [], "permitted": setid}),
            "root has only the capabilities to start commands as the sandbox user"
        );
    }

    #[test]
    fn rlimits_are_those_of_every_backend_plus_open_files() {
        let mut want: Vec<Value> = rlimits(&L, T)
            .into_iter()
            .map(|(n, v)| json!({"type": format!("RLIMIT_{}", n.to_uppercase()), "hard": v, "soft": v}))
            .collect();
        want.push(json!({"type": "RLIMIT_NOFILE", "hard": NOFILE, "soft": NOFILE}));
        assert_eq!(
            config(false, false, None)["process"]["rlimits"],
            json!(want)
        );
        assert!(want.contains(&json!({"type": "RLIMIT_NPROC", "hard": 9, "soft": 9})));
    }

    #[test]
    fn only_the_given_binds_are_mounted_and_read_only_unless_writable() {
        let c = config(false, false, None);
        let m = &c["mounts"];
        let dest: Vec<&str> = (0..6)
            .filter_map(|i| m[i]["destination"].as_str())
            .collect();
        assert_eq!(dest, ["/proc", "/dev", "/sys", "/tmp", "/input", "/output"]);
        assert!(m[6].is_null(), "nothing else");
        assert_eq!(m[2]["options"], json!(["nosuid", "noexec", "nodev", "ro"]));
        assert_eq!(
            m[3]["options"],
            json!([format!("size={}", 64u64 << 20), "mode=1777"])
        );
        let input = json!({"destination": "/input", "type": "bind", "source": "/h/in", "options": ["rbind", "ro"]});
        assert_eq!((&m[4], &m[5]["options"]), (&input, &json!(["rbind", "rw"])));
    }

    #[test]
    fn without_network_the_sandbox_gets_its_own_network_namespace_and_none_from_runsc() {
        let ns = |network| config(false, network, None)["linux"]["namespaces"].clone();
        let own = ["pid", "ipc", "uts", "mount"].map(|t| json!({"type": t}));
        assert_eq!(ns(true), json!(own));
        let mut off = own.to_vec();
        off.push(json!({"type": "network"}));
        assert_eq!(ns(false), json!(off));
        assert_eq!(
            (network_flag(false), network_flag(true)),
            ("--network=none", "--network=host")
        );
    }

    #[test]
    fn memory_and_cpu_go_to_the_runners_cgroup_when_there_is_one() {
        let c = config(false, false, Some("cairn-gvisor-r1"));
        assert_eq!(c["linux"]["cgroupsPath"], json!("/cairn-gvisor-r1/sb-1"));
        // No swap beyond memory; 500 millicores: half of each period.
        let mem = 64u64 << 20;
        let want = json!({"memory": {"limit": mem, "swap": mem}, "cpu": {"quota": 50_000, "period": 100_000}});
        assert_eq!(c["linux"]["resources"], want);
        let none = config(false, false, None);
        assert!(
            none["linux"].get("cgroupsPath").is_none() && none["linux"].get("resources").is_none()
        );
    }
}
