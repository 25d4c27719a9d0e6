//! The one configuration: a file with a section per service, then environment variables, then
//! flags, read the same way by `cairn config show` and the commands that start services.
#![allow(clippy::unwrap_used)]

mod common;

use common::cairn;

use predicates::prelude::*;

fn value<'a>(
    shown: &'a serde_json::Value,
    section: &str,
    key: &str,
) -> (&'a serde_json::Value, &'a str) {
    let row = shown["values"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["section"] == section && r["key"] == key)
        .unwrap_or_else(|| panic!("no {section}.{key}"));
    (&row["value"], row["source"].as_str().unwrap())
}

/// `cairn --config FILE --json config show` with `env`: the parsed output and its text.
fn show_json(
    data: &std::path::Path,
    file: &std::path::Path,
    env: &[(&str, &str)],
) -> (serde_json::Value, String) {
    let out = cairn(data)
        .envs(env.iter().copied())
        .arg("--config")
        .arg(file)
        .args(["--json", "config", "show"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (serde_json::from_str(&text).unwrap(), text)
}

#[test]
fn config_show_names_the_source_of_each_value() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cairn.toml");
    std::fs::write(
        &file,
        "[sandbox_runner]\npool_size = 3\n[llm]\nmodel = \"from-file\"\n[console]\ntoken = \"s3cret-token\"\n[artifact_store]\nmax_file_bytes = 1000\n",
    )
    .unwrap();
    let (shown, stdout) = show_json(
        &dir.path().join("data"),
        &file,
        &[("CAIRN_ORCHESTRATOR_MAX_PARALLEL_RUNS", "5")],
    );
    assert_eq!(
        value(&shown, "sandbox_runner", "pool_size"),
        (&3.into(), "file")
    );
    assert_eq!(
        value(&shown, "orchestrator", "llm.model"),
        (&"from-file".into(), "file")
    );
    assert_eq!(
        value(&shown, "orchestrator", "max_parallel_runs"),
        (&5.into(), "env")
    );
    assert_eq!(value(&shown, "artifact_store", "data_root").1, "flag");
    assert_eq!(value(&shown, "ingest", "max_blocks").1, "default");
    // Secrets are masked, in JSON and in text.
    assert_eq!(value(&shown, "console", "token").0, "***");
    assert!(!stdout.contains("s3cret-token"));
    cairn(&dir.path().join("data"))
        .arg("--config")
        .arg(&file)
        .args(["config", "show"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("pool_size = 3  # file")
                .and(predicate::str::contains("s3cret-token").not()),
        );
}

#[test]
fn unknown_sections_keys_and_values_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    for (text, needle) in [
        ("[sandbox]\npool_size = 2\n", "unknown section [sandbox]"),
        ("[ingest]\nmax_blockz = 2\n", "max_blockz"),
        (
            "[code_delivery]\ndocker_image = \"ubuntu:24.04\"\n",
            "docker_image",
        ),
        (
            "[sandbox_runner]\nallowed_image = [\"cairn-toolchain:latest\"]\n",
            "allowed_image",
        ),
        (
            "[code_delivery]\nnetwork_allowed = true\n",
            "network_allowed",
        ),
    ] {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text).unwrap();
        cairn(&dir.path().join("data"))
            .arg("--config")
            .arg(&file)
            .args(["config", "show"])
            .assert()
            .failure()
            .stderr(predicate::str::contains(needle));
    }
}

#[test]
fn embedded_commands_run_with_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cairn.toml");
    std::fs::write(&file, "[artifact_store]\nmax_file_bytes = 10\n").unwrap();
    let local = dir.path().join("big.txt");
    std::fs::write(&local, "more than ten bytes\n").unwrap();
    let data = dir.path().join("data");
    cairn(&data)
        .arg("--config")
        .arg(&file)
        .args(["store", "put"])
        .arg(&local)
        .arg("docs/big.txt")
        .assert()
        .code(5)
        .stderr(predicate::str::contains("exceeds the limit of 10 bytes"));
    // Without the file the same put succeeds.
    cairn(&data)
        .args(["store", "put"])
        .arg(&local)
        .arg("docs/big.txt")
        .assert()
        .success();
}

/// The example of docs/configuration.md is a configuration cairn accepts.
#[test]
fn the_documented_example_is_accepted() {
    let doc = include_str!("../../docs/configuration.md");
    let start = doc.find("```toml\n").unwrap() + "```toml\n".len();
    let end = start + doc[start..].find("```").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cairn.toml");
    std::fs::write(&file, &doc[start..end]).unwrap();
    let (shown, _) = show_json(&dir.path().join("data"), &file, &[]);
    assert_eq!(
        value(&shown, "sandbox_runner", "pool_size"),
        (&2.into(), "file")
    );
    assert_eq!(
        value(&shown, "ingest", "tls.dir"),
        (&"/etc/cairn/pki".into(), "file"),
        "[tls] applies to every service"
    );
}

#[test]
fn every_section_takes_cairn_section_key_variables() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cairn.toml");
    std::fs::write(&file, "[llm]\nmodel = \"from-file\"\n").unwrap();
    let tokens = dir.path().join("tokens.toml");
    let tokens = tokens.to_str().unwrap();
    let (shown, _) = show_json(
        &dir.path().join("data"),
        &file,
        &[
            ("CAIRN_ARTIFACT_STORE_MAX_FILE_BYTES", "1000"),
            ("CAIRN_INGEST_MAX_BLOCKS", "7"),
            ("CAIRN_SANDBOX_RUNNER_POOL_SIZE", "3"),
            ("CAIRN_ORCHESTRATOR_MAX_PARALLEL_RUNS", "5"),
            ("CAIRN_LLM_MODEL", "from-env"),
            ("CAIRN_CODE_DELIVERY_MAX_ARCHIVE_SIZE_MB", "9"),
            ("CAIRN_AUTH_TOKENS_FILE", tokens),
            ("CAIRN_CONSOLE_LISTEN", "127.0.0.1:7999"),
        ],
    );
    for (section, key, want) in [
        ("artifact_store", "max_file_bytes", 1000.into()),
        ("ingest", "max_blocks", 7.into()),
        ("sandbox_runner", "pool_size", 3.into()),
        ("orchestrator", "max_parallel_runs", 5.into()),
        ("orchestrator", "llm.model", "from-env".into()),
        (
            "orchestrator",
            "code_delivery.max_archive_size_mb",
            9.into(),
        ),
        ("orchestrator", "auth.tokens_file", tokens.into()),
        ("console", "listen", "127.0.0.1:7999".into()),
    ] {
        assert_eq!(
            value(&shown, section, key),
            (&want, "env"),
            "{section}.{key}"
        );
    }

    // The older spellings still work.
    let (shown, _) = show_json(
        &dir.path().join("data"),
        &file,
        &[
            ("CAIRN_STORE_MAX_FILE_BYTES", "2000"),
            ("CAIRN_ORCHESTRATOR_LLM_MODEL", "old-spelling"),
        ],
    );
    assert_eq!(
        value(&shown, "artifact_store", "max_file_bytes"),
        (&2000.into(), "env")
    );
    assert_eq!(
        value(&shown, "orchestrator", "llm.model"),
        (&"old-spelling".into(), "env")
    );

    // A typo under a section's prefix, or two spellings that disagree, are errors naming them.
    for (env, needles) in [
        (
            vec![("CAIRN_LLM_MODLE", "m")],
            vec!["CAIRN_LLM_MODLE", "model"],
        ),
        (
            vec![("CAIRN_ARTIFACT_STORE_MAX_FILE_BYTE", "1")],
            vec!["CAIRN_ARTIFACT_STORE_MAX_FILE_BYTE", "max_file_bytes"],
        ),
        (
            vec![
                ("CAIRN_LLM_MODEL", "a"),
                ("CAIRN_ORCHESTRATOR_LLM_MODEL", "b"),
            ],
            vec![
                "CAIRN_LLM_MODEL",
                "CAIRN_ORCHESTRATOR_LLM_MODEL",
                "llm.model",
            ],
        ),
    ] {
        let out = cairn(&dir.path().join("data"))
            .envs(env.iter().copied())
            .arg("--config")
            .arg(&file)
            .args(["config", "show"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{env:?} was accepted");
        for n in needles {
            assert!(stderr.contains(n), "{env:?}: {n} not in {stderr}");
        }
    }
}
