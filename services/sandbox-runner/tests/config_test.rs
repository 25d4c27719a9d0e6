//! The runner's configuration: defaults, the config file, `CAIRN_SANDBOX_RUNNER_*`
//! overrides and the checks that refuse a bad value with the key named.
#![allow(clippy::unwrap_used)]

use cairn_sandbox_runner::config::*;
use cairn_server::config;
#[test]
fn env_overrides_reach_sections_and_top_level() {
    let mut c = Config::default();
    let vars = vec![
        (
            "CAIRN_SANDBOX_RUNNER_POOL_SIZE".to_string(),
            "3".to_string(),
        ),
        (
            "CAIRN_SANDBOX_RUNNER_DEFAULTS_TIMEOUT_MS".to_string(),
            "5000".to_string(),
        ),
        (
            "CAIRN_SANDBOX_RUNNER_MAX_SESSIONS".to_string(),
            "7".to_string(),
        ),
        (
            "CAIRN_SANDBOX_RUNNER_BACKEND".to_string(),
            "local".to_string(),
        ),
        ("OTHER".to_string(), "x".to_string()),
    ];
    ENV.apply(&mut c, vars).unwrap();
    assert_eq!(c.pool_size, 3);
    assert_eq!(c.max_sessions, 7);
    assert_eq!(c.backend, BackendChoice::Local);
    assert_eq!(c.default_limits().timeout_ms, 5000);
}

#[test]
fn concurrent_runs_derive_from_cpus_and_memory() {
    const GIB: u64 = 1 << 30;
    assert_eq!(derived_max_concurrent_runs(2, 24 * GIB), 8);
    assert_eq!(derived_max_concurrent_runs(16, 2 * GIB), 8);
    assert_eq!(derived_max_concurrent_runs(1, GIB / 4), 2);
    let c = Config {
        max_concurrent_runs: 3,
        ..Config::default()
    };
    assert_eq!(c.concurrent_runs(), 3);
    assert!(Config::default().concurrent_runs() >= 2);
}

/// `text` read as the runner's config file.
fn parse(text: &str) -> Result<Config, config::ConfigError> {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    config::from_file(file.path())
}

#[test]
fn image_and_network_keys_parse_from_file_and_env() {
    let c = parse(
        "image = \"cairn-sandbox:latest\"\nallowed_images = [\"cairn-toolchain:latest\", \"registry.local/app@sha256:AB12\"]\nnetwork_allowed = true\ndocker_network = \"cairn-egress\"\n",
    )
    .unwrap();
    c.check().unwrap();
    assert_eq!(
        c.allowed_images,
        ["cairn-toolchain:latest", "registry.local/app@sha256:AB12"]
    );
    assert!(c.network_allowed);
    assert_eq!(c.docker_network, "cairn-egress");

    let mut c = Config::default();
    assert_eq!(
        c.allowed_images,
        ["cairn-sandbox:latest", "cairn-toolchain:latest"]
    );
    assert_eq!(c.docker_network, "bridge");
    let vars = [
        ("ALLOWED_IMAGES", "a:1, b:2"),
        ("NETWORK_ALLOWED", "true"),
        ("DOCKER_NETWORK", "net1"),
    ]
    .map(|(k, v)| (format!("{ENV_PREFIX}{k}"), v.to_string()));
    ENV.apply(&mut c, vars).unwrap();
    assert_eq!(c.allowed_images, ["a:1", "b:2"]);
    assert!(c.network_allowed);
    assert_eq!(c.docker_network, "net1");
    c.set("allowed_images", "").unwrap();
    assert!(c.allowed_images.is_empty());
}

#[test]
fn a_refused_image_lists_each_allowed_image_once() {
    // The default allows its own image in allowed_images too.
    let e = Config::default()
        .image_for("nope:1")
        .unwrap_err()
        .to_string();
    assert_eq!(e.matches("cairn-sandbox:latest").count(), 1, "{e}");
    assert!(e.contains("cairn-toolchain:latest"), "{e}");
}

#[test]
fn unknown_and_bad_keys_are_errors() {
    for text in [
        "allowed_image = [\"x\"]",
        "network = true",
        "allowed_images = \"cairn-toolchain:latest\"",
        "network_allowed = \"maybe\"",
    ] {
        assert!(parse(text).is_err(), "{text}");
    }
    let mut c = Config::default();
    let unknown = [(
        format!("{ENV_PREFIX}ALLOWED_IMAGE"),
        "cairn-toolchain:latest".to_string(),
    )];
    assert!(ENV.apply(&mut c, unknown).is_err());
    for (key, value) in [
        ("allowed_images", "ok:1,-bad"),
        ("image", "Has Space"),
        ("docker_network", ""),
        ("docker_network", "a/b"),
    ] {
        let mut c = Config::default();
        c.set(key, value).unwrap();
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains(key), "{key}={value}: {e}");
    }
}

#[test]
fn gvisor_backend_and_platform_keys() {
    let mut c = Config::default();
    assert_eq!(c.gvisor_platform, "ptrace");
    let vars = [
        ("BACKEND", "gvisor"),
        ("GVISOR_PLATFORM", "kvm"),
        ("RUNSC", "/opt/runsc"),
    ]
    .map(|(k, v)| (format!("{ENV_PREFIX}{k}"), v.to_string()));
    ENV.apply(&mut c, vars).unwrap();
    assert_eq!(c.backend, BackendChoice::Gvisor);
    assert_eq!(c.runsc, "/opt/runsc");
    c.check().unwrap();
    c.set("gvisor_platform", "qemu").unwrap();
    let e = c.check().unwrap_err().to_string();
    assert!(
        e.contains("gvisor_platform") && e.contains("ptrace or kvm"),
        "{e}"
    );
    c.set("gvisor_platform", "ptrace").unwrap();
    assert_eq!(c.gvisor_checkpoint_compression, "flate-best-speed");
    c.set("gvisor_checkpoint_compression", "none").unwrap();
    c.check().unwrap();
    c.set("gvisor_checkpoint_compression", "zstd").unwrap();
    let e = c.check().unwrap_err().to_string();
    assert!(
        e.contains("gvisor_checkpoint_compression") && e.contains("none or flate-best-speed"),
        "{e}"
    );
    let c = parse("backend = \"gvisor\"\n").unwrap();
    assert_eq!(c.backend, BackendChoice::Gvisor);
    assert!(parse("backend = \"gvisr\"\n").is_err());
}

#[test]
fn writable_area_and_rootfs_cache_keys() {
    let c = Config::default();
    assert_eq!(c.max_total_output_bytes, 256 << 20);
    let c = parse(
        "max_total_output_bytes = 8388608\ngvisor_rootfs_cache = \"/var/cache/cairn-rootfs\"\n",
    )
    .unwrap();
    assert_eq!(c.max_total_output_bytes, 8 << 20);
    c.check().unwrap();
    for (key, value) in [
        ("max_total_output_bytes", "4096"),
        ("gvisor_rootfs_cache", "relative/dir"),
    ] {
        let mut c = Config::default();
        c.set(key, value).unwrap();
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains(key), "{key}={value}: {e}");
    }
}

#[test]
fn default_above_max_is_refused() {
    let mut c = Config::default();
    c.set("defaults.pids", "100").unwrap();
    c.set("max.pids", "50").unwrap();
    assert!(c.check().unwrap_err().to_string().contains("pids"));
}
