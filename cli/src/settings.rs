//! The one configuration of every mode: a TOML file (`cairn --config FILE` / `CAIRN_CONFIG`)
//! with a section per service, then each service's environment variables, then flags. `cairn
//! up`, the commands that start services in this process and `cairn serve <service>` read it
//! the same way; `cairn config show` prints the outcome and where each value came from.
//!
//! Sections, each with variables `CAIRN_<SECTION>_<KEY>`: `[artifact_store]`, `[ingest]`,
//! `[sandbox_runner]`, `[orchestrator]`, `[console]`; `[llm]`, `[code_delivery]`, `[onebot]`
//! and `[auth]` are the orchestrator's and may stand at the top level; `[tls]` (`CAIRN_TLS_DIR`
//! etc.) applies to every service (a service's own `tls` table wins). Any other section, and any
//! unknown key, is refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use cairn_server::config::{Env, UnknownVars};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

/// The services' sections, in the order `config show` prints them.
pub const SERVICES: [&str; 5] = [
    "artifact_store",
    "ingest",
    "sandbox_runner",
    "orchestrator",
    "console",
];
/// The orchestrator's own sections, accepted at the top level.
pub const ORCHESTRATOR_PARTS: [&str; 4] = ["llm", "code_delivery", "onebot", "auth"];
/// The section every service takes as its `tls`.
pub const SHARED_TLS: &str = "tls";

/// `CAIRN_CONSOLE_<KEY>` overrides of the console section (the prefix is shared with the CLI's
/// own `CAIRN_CONSOLE_TOKEN`, which names the same key).
pub const CONSOLE_ENV: Env = Env {
    prefix: "CAIRN_CONSOLE_",
    unknown: UnknownVars::Ignore,
    aliases: &[],
};

/// Where a value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Default,
    File,
    Env,
    Flag,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::File => "file",
            Source::Env => "env",
            Source::Flag => "flag",
        }
    }
}

/// One service's effective configuration, and the source of each value (`a.b.c` keys).
pub struct Section<T> {
    pub config: T,
    pub sources: BTreeMap<String, Source>,
}

/// The sections of the one file, split by service (shared and top-level parts merged in).
#[derive(Default)]
pub struct File {
    pub path: Option<PathBuf>,
    sections: BTreeMap<String, Map<String, Value>>,
}

impl File {
    /// Reads `path` (or nothing): unknown sections are refused with the known ones named.
    pub fn read(path: Option<&Path>) -> anyhow::Result<File> {
        let Some(path) = path else {
            return Ok(File::default());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the configuration {}", path.display()))?;
        let table: toml::Table = toml::from_str(&text)
            .with_context(|| format!("the configuration {} is not TOML", path.display()))?;
        let mut top = match serde_json::to_value(table)? {
            Value::Object(m) => m,
            _ => bail!("the configuration {} is not a table", path.display()),
        };
        let mut sections: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
        let tls = top.remove(SHARED_TLS);
        for (name, value) in top {
            let Value::Object(table) = value else {
                bail!("{}: `{name}` must be a section ([{name}])", path.display());
            };
            if SERVICES.contains(&name.as_str()) {
                let section = sections.entry(name).or_default();
                if let Some(key) = both(section, &table) {
                    bail!("{}: {}", path.display(), twice(&key));
                }
                merge(section, table);
            } else if ORCHESTRATOR_PARTS.contains(&name.as_str()) {
                let mut part = Map::new();
                part.insert(name, Value::Object(table));
                let orchestrator = sections.entry("orchestrator".into()).or_default();
                if let Some(key) = both(orchestrator, &part) {
                    bail!("{}: {}", path.display(), twice(&key));
                }
                merge(orchestrator, part);
            } else {
                bail!(
                    "{}: unknown section [{name}]; the sections are {}, {} and [{SHARED_TLS}]",
                    path.display(),
                    SERVICES.map(|s| format!("[{s}]")).join(", "),
                    ORCHESTRATOR_PARTS.map(|s| format!("[{s}]")).join(", ")
                );
            }
        }
        for (section, key, old, now) in MOVED {
            if sections
                .get(section)
                .is_some_and(|t| pointer(&Value::Object(t.clone()), key).is_some())
            {
                bail!(
                    "{}: {old} is not a key of cairn's configuration; it is now {now}",
                    path.display()
                );
            }
        }
        if let Some(Value::Object(tls)) = tls {
            for service in SERVICES {
                let section = sections.entry(service.into()).or_default();
                // The service's own tls table wins over the shared one.
                let mut shared = Map::new();
                shared.insert(SHARED_TLS.into(), Value::Object(tls.clone()));
                merge(&mut shared, section.clone());
                *section = shared;
            }
        }
        Ok(File {
            path: Some(path.to_path_buf()),
            sections,
        })
    }

    /// A service's own configuration file (its keys at the top level) as its section.
    pub fn read_own(path: &Path, service: &str) -> anyhow::Result<File> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the configuration {}", path.display()))?;
        let table: toml::Table = toml::from_str(&text)
            .with_context(|| format!("the configuration {} is not TOML", path.display()))?;
        let Value::Object(section) = serde_json::to_value(table)? else {
            bail!("the configuration {} is not a table", path.display());
        };
        Ok(File {
            path: Some(path.to_path_buf()),
            sections: BTreeMap::from([(service.to_owned(), section)]),
        })
    }

    /// The section of `service` as TOML text (for programs that read a service's own file).
    pub fn section_toml(&self, service: &str) -> anyhow::Result<String> {
        let table = self.sections.get(service).cloned().unwrap_or_default();
        Ok(toml::to_string(&Value::Object(table))?)
    }

    /// Defaults, then this file's section, then `env`, then `flags` (`key=value`, as `--set`).
    pub fn section<T>(
        &self,
        service: &str,
        defaults: T,
        env: &Env,
        flags: &[(&str, String)],
    ) -> anyhow::Result<Section<T>>
    where
        T: Serialize + DeserializeOwned,
    {
        let d = serde_json::to_value(&defaults)?;
        let mut config = match self.sections.get(service) {
            Some(table) => {
                let mut merged = d.clone();
                if let Value::Object(m) = &mut merged {
                    merge(m, table.clone());
                }
                serde_json::from_value::<T>(merged).map_err(|e| {
                    anyhow::anyhow!(
                        "{}: [{service}]: {e}",
                        self.path.as_deref().unwrap_or(Path::new("")).display()
                    )
                })?
            }
            None => defaults,
        };
        let f = serde_json::to_value(&config)?;
        env.apply(&mut config, std::env::vars())?;
        let e = serde_json::to_value(&config)?;
        for (key, value) in flags {
            cairn_server::config::set(&mut config, key, value)
                .with_context(|| format!("[{service}] {key}"))?;
        }
        let l = serde_json::to_value(&config)?;
        let mut sources = BTreeMap::new();
        leaves(&l, "", &mut |key, value| {
            let at = |v: &Value| pointer(v, key).cloned();
            let source = if at(&e).as_ref() != Some(value) {
                Source::Flag
            } else if at(&f) != at(&e) {
                Source::Env
            } else if at(&d) != at(&f) {
                Source::File
            } else {
                Source::Default
            };
            sources.insert(key.to_owned(), source);
        });
        Ok(Section { config, sources })
    }
}

/// Deep-merges `over` into `base` (tables merge, everything else is replaced).
/// Keys of earlier configurations that moved: section, key, as the file spells it, where it
/// is now.
const MOVED: [(&str, &str, &str, &str); 3] = [
    (
        "orchestrator",
        "docker_image",
        "[orchestrator] docker_image",
        "`image` in [sandbox_runner] (other images a graph may name: `allowed_images` there)",
    ),
    (
        "orchestrator",
        "code_delivery.docker_image",
        "[code_delivery] docker_image",
        "`image` in [sandbox_runner] (other images a graph may name: `allowed_images` there)",
    ),
    (
        "orchestrator",
        "code_delivery.network_allowed",
        "[code_delivery] network_allowed",
        "`network_allowed` in [sandbox_runner]",
    ),
];

/// The refusal of an orchestrator key (`llm.model`) set both at the top level and in
/// [orchestrator].
fn twice(key: &str) -> String {
    let (part, rest) = key.split_once('.').unwrap_or((key, ""));
    format!("[{part}] and [orchestrator.{part}] both set `{rest}`; keep one of them")
}

/// The first leaf key (`a.b`) both tables set, if any: the same key given twice.
fn both(a: &Map<String, Value>, b: &Map<String, Value>) -> Option<String> {
    let a = Value::Object(a.clone());
    let mut found = None;
    leaves(&Value::Object(b.clone()), "", &mut |key, _| {
        if found.is_none() && pointer(&a, key).is_some() {
            found = Some(key.to_owned());
        }
    });
    found
}

fn merge(base: &mut Map<String, Value>, over: Map<String, Value>) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(Value::Object(b)), Value::Object(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Calls `f` with every leaf of `v` and its dotted key (arrays are leaves).
fn leaves(v: &Value, prefix: &str, f: &mut dyn FnMut(&str, &Value)) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(x, &key, f);
            }
        }
        _ => f(prefix, v),
    }
}

fn pointer<'a>(v: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(v, |v, k| v.get(k))
}

/// Keys whose values are never printed.
pub fn is_secret(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key);
    last == "token"
        || last.ends_with("_token")
        || last.contains("password")
        || last.contains("secret")
        || last == "api_key"
}

/// The `[tls]` keys the global TLS flags set (`--tls-dir` etc.), as `key=value` flags.
pub fn tls_flags(global: &crate::cli::Global) -> Vec<(&'static str, String)> {
    let tls = global.tls.config();
    [
        ("tls.dir", &tls.dir),
        ("tls.cert", &tls.cert),
        ("tls.key", &tls.key),
        ("tls.ca", &tls.ca),
    ]
    .into_iter()
    .filter_map(|(key, value)| value.as_ref().map(|p| (key, p.display().to_string())))
    .collect()
}

/// The console's defaults in this process: the global --project is shown first.
pub fn console_defaults(global: &crate::cli::Global) -> cairn_console::ConsoleConfig {
    cairn_console::ConsoleConfig {
        default_project: global.project.clone(),
        ..Default::default()
    }
}

/// Every service's effective configuration as `cairn up` would run it.
pub struct Settings {
    pub file: File,
    pub artifact_store: Section<cairn_artifact_store::Config>,
    pub ingest: Section<cairn_ingest::Config>,
    pub sandbox_runner: Section<cairn_sandbox_runner::Config>,
    pub orchestrator: Section<cairn_orchestrator::Config>,
    pub console: Section<cairn_console::ConsoleConfig>,
}

impl Settings {
    /// The one file (if any), the environment, then what this process decides: the data root
    /// (`--data-root`) and the TLS flags.
    /// A configuration that cannot be used is a usage error (exit 2), with how to check it.
    pub fn load(global: &crate::cli::Global) -> anyhow::Result<Settings> {
        Settings::load_unchecked(global).map_err(|e| {
            crate::failure::Failure::usage(
                "config",
                format!("{e:#}"),
                "fix the file and check it with `cairn --config FILE config show`; docs/configuration.md lists every key",
            )
            .into()
        })
    }

    fn load_unchecked(global: &crate::cli::Global) -> anyhow::Result<Settings> {
        let file = File::read(global.config.as_deref())?;
        let data_root = std::path::absolute(&global.data_root)?;
        let mut tls_flags = tls_flags(global);
        let console = file.section(
            "console",
            console_defaults(global),
            &CONSOLE_ENV,
            // The console serves HTTP, never gRPC: --insecure-listen is not its key.
            &tls_flags,
        )?;
        if global.tls.insecure_listen {
            tls_flags.push(("insecure_listen", "true".into()));
        }
        let with = |extra: &[(&'static str, String)]| -> Vec<(&'static str, String)> {
            tls_flags
                .iter()
                .cloned()
                .chain(extra.iter().cloned())
                .collect()
        };
        let mut artifact_store = file.section(
            "artifact_store",
            cairn_artifact_store::Config::default(),
            &cairn_artifact_store::config::ENV,
            &with(&[("data_root", data_root.display().to_string())]),
        )?;
        // --data-root always decides the store's data_root; say where its value came from.
        use clap::parser::ValueSource;
        let source = match global.data_root_source {
            Some(ValueSource::EnvVariable) => Source::Env,
            Some(ValueSource::CommandLine) => Source::Flag,
            _ => Source::Default,
        };
        artifact_store.sources.insert("data_root".into(), source);
        let ingest = file.section(
            "ingest",
            cairn_ingest::Config::default(),
            &cairn_ingest::config::ENV,
            &with(&[]),
        )?;
        let sandbox_runner = file.section(
            "sandbox_runner",
            cairn_sandbox_runner::Config {
                work_root: data_root.join("sandbox"),
                ..Default::default()
            },
            &cairn_sandbox_runner::config::ENV,
            &with(&[]),
        )?;
        let orchestrator = file.section(
            "orchestrator",
            cairn_orchestrator::Config::default(),
            &cairn_orchestrator::config::ENV,
            &with(&[]),
        )?;
        Ok(Settings {
            file,
            artifact_store,
            ingest,
            sandbox_runner,
            orchestrator,
            console,
        })
    }

    /// `(section, key, value, source)` of every value, secrets masked.
    pub fn rows(&self) -> anyhow::Result<Vec<(String, String, Value, Source)>> {
        let mut out = Vec::new();
        let mut add = |name: &str, config: Value, sources: &BTreeMap<String, Source>| {
            for (key, source) in sources {
                let value = pointer(&config, key).cloned().unwrap_or(Value::Null);
                let shown = if is_secret(key) && !value.is_null() && value != "" {
                    Value::from("***")
                } else {
                    value
                };
                out.push((name.to_owned(), key.clone(), shown, *source));
            }
        };
        add(
            "artifact_store",
            serde_json::to_value(&self.artifact_store.config)?,
            &self.artifact_store.sources,
        );
        add(
            "ingest",
            serde_json::to_value(&self.ingest.config)?,
            &self.ingest.sources,
        );
        add(
            "sandbox_runner",
            serde_json::to_value(&self.sandbox_runner.config)?,
            &self.sandbox_runner.sources,
        );
        add(
            "orchestrator",
            serde_json::to_value(&self.orchestrator.config)?,
            &self.orchestrator.sources,
        );
        add(
            "console",
            serde_json::to_value(&self.console.config)?,
            &self.console.sources,
        );
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn file(text: &str) -> anyhow::Result<File> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cairn.toml");
        std::fs::write(&path, text).unwrap();
        File::read(Some(&path))
    }

    #[test]
    fn unknown_sections_and_keys_are_refused() {
        let e = file("[sandbox]\npool_size = 2\n").err().unwrap();
        assert!(e.to_string().contains("unknown section [sandbox]"), "{e}");
        let f = file("[ingest]\nno_such_key = 1\n").unwrap();
        let e = f
            .section(
                "ingest",
                cairn_ingest::Config::default(),
                &cairn_ingest::config::ENV,
                &[],
            )
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("no_such_key"), "{e:#}");
    }

    #[test]
    fn top_level_orchestrator_parts_and_shared_tls_land_in_their_services() {
        let f =
            file("[llm]\nmodel = \"m1\"\n[tls]\ndir = \"/pki\"\n[ingest.tls]\ndir = \"/own\"\n")
                .unwrap();
        let o = f
            .section(
                "orchestrator",
                cairn_orchestrator::Config::default(),
                &cairn_orchestrator::config::ENV,
                &[],
            )
            .unwrap();
        assert_eq!(o.config.llm.model, "m1");
        assert_eq!(o.sources["llm.model"], Source::File);
        assert_eq!(o.config.tls.dir, Some("/pki".into()));
        let i = f
            .section(
                "ingest",
                cairn_ingest::Config::default(),
                &cairn_ingest::config::ENV,
                &[],
            )
            .unwrap();
        assert_eq!(
            i.config.tls.dir,
            Some("/own".into()),
            "a service's own tls wins"
        );
    }

    #[test]
    fn flags_win_and_are_named() {
        let f = file("[sandbox_runner]\npool_size = 3\nmax_sessions = 5\n").unwrap();
        let s = f
            .section(
                "sandbox_runner",
                cairn_sandbox_runner::Config::default(),
                &cairn_sandbox_runner::config::ENV,
                &[("max_sessions", "7".into())],
            )
            .unwrap();
        assert_eq!(s.config.pool_size, 3);
        assert_eq!(s.sources["pool_size"], Source::File);
        assert_eq!(s.config.max_sessions, 7);
        assert_eq!(s.sources["max_sessions"], Source::Flag);
        assert_eq!(s.sources["listen"], Source::Default);
    }

    #[test]
    fn secrets_are_recognised() {
        assert!(is_secret("token"));
        assert!(is_secret("onebot.access_token"));
        assert!(!is_secret("onebot.access_token_env"));
        assert!(!is_secret("llm.api_key_env"));
    }
}
