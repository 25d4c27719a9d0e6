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
    /// The first process runs as root (without capabilities), not as the sandbox user.
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
    let (uid, gid) = if spec.root { (0, 0) } else { user };
    json!({
        "ociVersion": "1.0.0",
        "process": {
            "user": {"uid": uid, "gid": gid},
            "args": spec.argv,
            "env": spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
            "cwd": spec.cwd,
            "noNewPrivileges": true,
            "capabilities": {"bounding": no_caps, "effective": no_caps,
                             "inheritable": no_caps, "permitted": no_caps},
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

    fn limits() -> Limits {
        Limits {
            pids: 9,
            memory_bytes: 64 << 20,
            cpu_millis: 500,
            max_output_bytes: 1000,
            ..Limits::DEFAULTS
        }
    }

    fn spec<'a>(limits: &'a Limits, env: &'a [(String, String)], network: bool) -> Spec<'a> {
        Spec {
            id: "sb-1".into(),
            root: false,
            binds: vec![
                (PathBuf::from("/host/in"), "/input", false),
                (PathBuf::from("/host/out"), "/output", true),
            ],
            network,
            limits,
            timeout: Duration::from_millis(4_500),
            cwd: "/output",
            env,
            argv: vec!["python3".into(), "-c".into(), "pass".into()],
        }
    }

    fn config(spec: &Spec<'_>, cgroup: Option<&str>) -> Value {
        oci_config(spec, Path::new("/roots/img"), cgroup, (10001, 10002))
    }

    fn types(v: &Value) -> Vec<&str> {
        v.as_array()
            .map(|a| a.iter().filter_map(|n| n["type"].as_str()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn the_program_runs_unprivileged_on_a_read_only_root_with_only_its_environment() {
        let l = limits();
        let env = vec![("HOME".to_owned(), "/output".to_owned())];
        let c = config(&spec(&l, &env, false), None);
        let p = &c["process"];
        assert_eq!(p["user"], json!({"uid": 10001, "gid": 10002}));
        assert_eq!(p["noNewPrivileges"], json!(true));
        for set in ["bounding", "effective", "inheritable", "permitted"] {
            assert_eq!(p["capabilities"][set], json!([]), "{set} capabilities");
        }
        assert_eq!(p["env"], json!(["HOME=/output"]));
        assert_eq!(p["args"], json!(["python3", "-c", "pass"]));
        assert_eq!(p["cwd"], json!("/output"));
        assert_eq!(c["root"], json!({"path": "/roots/img", "readonly": true}));
        assert_eq!(c["hostname"], json!("sandbox"));

        let root = Spec {
            root: true,
            ..spec(&l, &env, false)
        };
        let c = config(&root, None);
        assert_eq!(c["process"]["user"], json!({"uid": 0, "gid": 0}));
        assert_eq!(
            c["process"]["capabilities"]["effective"],
            json!([]),
            "root inside has no capabilities either"
        );
    }

    #[test]
    fn rlimits_are_those_of_every_backend_plus_open_files() {
        let l = limits();
        let c = config(&spec(&l, &[], false), None);
        let got: Vec<(String, u64, u64)> = c["process"]["rlimits"]
            .as_array()
            .unwrap_or(&Vec::new())
            .iter()
            .map(|r| {
                (
                    r["type"].as_str().unwrap_or_default().to_owned(),
                    r["hard"].as_u64().unwrap_or(u64::MAX),
                    r["soft"].as_u64().unwrap_or(u64::MAX),
                )
            })
            .collect();
        let mut want: Vec<(String, u64, u64)> = rlimits(&l, Duration::from_millis(4_500))
            .into_iter()
            .map(|(n, v)| (format!("RLIMIT_{}", n.to_uppercase()), v, v))
            .collect();
        want.push(("RLIMIT_NOFILE".into(), NOFILE, NOFILE));
        assert_eq!(got, want);
        assert!(got.iter().any(|r| r == &("RLIMIT_NPROC".to_owned(), 9, 9)));
    }

    #[test]
    fn only_the_given_binds_are_mounted_and_read_only_unless_writable() {
        let l = limits();
        let c = config(&spec(&l, &[], false), None);
        let mounts = c["mounts"].as_array().cloned().unwrap_or_default();
        let dest: Vec<&str> = mounts
            .iter()
            .filter_map(|m| m["destination"].as_str())
            .collect();
        assert_eq!(dest, ["/proc", "/dev", "/sys", "/tmp", "/input", "/output"]);
        assert_eq!(
            mounts[2]["options"],
            json!(["nosuid", "noexec", "nodev", "ro"]),
            "/sys read-only"
        );
        assert_eq!(
            mounts[3]["options"],
            json!([format!("size={}", 64u64 << 20), "mode=1777"]),
            "/tmp bounded by the memory limit"
        );
        assert_eq!(
            mounts[4],
            json!({"destination": "/input", "type": "bind", "source": "/host/in",
                   "options": ["rbind", "ro"]})
        );
        assert_eq!(mounts[5]["options"], json!(["rbind", "rw"]));
    }

    #[test]
    fn without_network_the_sandbox_gets_its_own_network_namespace_and_none_from_runsc() {
        let l = limits();
        let off = config(&spec(&l, &[], false), None);
        assert_eq!(
            types(&off["linux"]["namespaces"]),
            ["pid", "ipc", "uts", "mount", "network"]
        );
        let on = config(&spec(&l, &[], true), None);
        assert_eq!(
            types(&on["linux"]["namespaces"]),
            ["pid", "ipc", "uts", "mount"]
        );
        assert_eq!(network_flag(false), "--network=none");
        assert_eq!(network_flag(true), "--network=host");
    }

    #[test]
    fn memory_and_cpu_go_to_the_runners_cgroup_when_there_is_one() {
        let l = limits();
        let c = config(&spec(&l, &[], false), Some("cairn-gvisor-r1"));
        assert_eq!(c["linux"]["cgroupsPath"], json!("/cairn-gvisor-r1/sb-1"));
        assert_eq!(
            c["linux"]["resources"],
            json!({
                "memory": {"limit": 64u64 << 20, "swap": 64u64 << 20},
                "cpu": {"quota": 50_000, "period": 100_000},
            }),
            "no swap beyond memory; 500 millicores = half of each period"
        );
        let none = config(&spec(&l, &[], false), None);
        assert!(none["linux"].get("cgroupsPath").is_none());
        assert!(none["linux"].get("resources").is_none());
    }
}
