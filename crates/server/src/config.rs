//! The one way a service's configuration is layered: defaults, then an optional TOML file,
//! then `<PREFIX><KEY>` environment variables, then flags (`set`); each later source wins.
//!
//! Keys are the serde field names of the service's config type. A key of a section is
//! `section.key` for `set` and `PREFIX_SECTION_KEY` in the environment (deeper sections
//! likewise); a value is read as the type the key has in the config (booleans also as
//! 1/0, yes/no, on/off; lists comma-separated). A key whose default is `None` is read as an
//! integer, boolean or string, and the config type decides. Every change goes through the
//! type's own deserializer, so a refused value leaves the config as it was and never
//! yields a config the type could not have parsed from a file.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a configuration source was refused; each names the file, variable or key to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {}: {message}", path.display())]
    File { path: PathBuf, message: String },
    // The value is left out: it may be a secret (a value that does not parse is quoted).
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("{key}: {message}")]
    Key { key: String, message: String },
}

/// What to do with a `<PREFIX>…` variable that names no key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownVars {
    /// Refuse it (a typo should not pass silently).
    Refuse,
    /// Skip it (the prefix is shared with variables of other programs).
    Ignore,
}

/// A service's environment overrides: `<prefix><KEY>` (`<prefix>CONFIG`, the file flag's
/// variable, is never a key), and the other spellings in `aliases`.
#[derive(Debug, Clone, Copy)]
pub struct Env {
    pub prefix: &'static str,
    pub unknown: UnknownVars,
    pub aliases: &'static [Alias],
}

/// Another prefix for the keys of one section: `CAIRN_LLM_<KEY>` for the orchestrator's
/// `[llm]`. A named section's alias is the name [`Env::names`] gives its keys; a top-level
/// alias (`section` empty) is an older spelling of the whole service that still works.
#[derive(Debug, Clone, Copy)]
pub struct Alias {
    pub prefix: &'static str,
    pub section: &'static str,
    pub unknown: UnknownVars,
}

/// A variable read as a key: the section its prefix names (empty = top level), the key below
/// it in environment spelling, and what to do when no key matches.
struct Spelling<'a> {
    section: &'a str,
    key: String,
    unknown: UnknownVars,
}

impl Env {
    /// `T::default()` or the TOML `file` (unknown keys refused), then the process environment.
    pub fn load<T>(&self, file: Option<&Path>) -> Result<T, ConfigError>
    where
        T: Serialize + DeserializeOwned + Default,
    {
        let mut config = match file {
            Some(path) => from_file(path)?,
            None => T::default(),
        };
        self.apply(&mut config, std::env::vars())?;
        Ok(config)
    }

    /// What `name` is a spelling of, if it carries one of the prefixes (the longest wins).
    fn spelling(&self, name: &str) -> Option<Spelling<'static>> {
        let own = std::iter::once(Alias {
            prefix: self.prefix,
            section: "",
            unknown: self.unknown,
        });
        own.chain(self.aliases.iter().copied())
            .filter(|a| name.starts_with(a.prefix))
            .max_by_key(|a| a.prefix.len())
            .and_then(|a| {
                let key = &name[a.prefix.len()..];
                (!key.is_empty() && key != "CONFIG").then(|| Spelling {
                    section: a.section,
                    key: key.to_ascii_lowercase(),
                    unknown: a.unknown,
                })
            })
    }

    /// Applies the `(name, value)` pairs that carry a prefix, in name order; all or none. Two
    /// spellings of one key with different values are refused.
    pub fn apply<T>(
        &self,
        config: &mut T,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ConfigError>
    where
        T: Serialize + DeserializeOwned,
    {
        let mut vars: Vec<(String, String, Spelling<'static>)> = vars
            .into_iter()
            .filter_map(|(name, value)| self.spelling(&name).map(|s| (name, value, s)))
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let mut table = to_table(config)?;
        let mut next = None;
        let mut seen: Vec<(Vec<String>, String, String)> = Vec::new();
        for (var, value, spelling) in vars {
            let err = |message: String| ConfigError::Env {
                var: var.clone(),
                message,
            };
            let path = if spelling.section.is_empty() {
                resolve(&table, &spelling.key)
            } else {
                let section = table
                    .get(spelling.section)
                    .and_then(toml::Value::as_table)
                    .cloned()
                    .unwrap_or_default();
                resolve(&section, &spelling.key).map(|mut p| {
                    p.insert(0, spelling.section.to_owned());
                    p
                })
            };
            let Some(path) = path else {
                match spelling.unknown {
                    UnknownVars::Ignore => continue,
                    UnknownVars::Refuse => {
                        let shown = if spelling.section.is_empty() {
                            leaf_names(&table)
                        } else {
                            leaf_names(&table)
                                .into_iter()
                                .filter_map(|k| {
                                    k.strip_prefix(spelling.section)?
                                        .strip_prefix('.')
                                        .map(str::to_owned)
                                })
                                .collect()
                        };
                        return Err(err(format!(
                            "no key `{}`; unset it or fix the name (keys: {})",
                            spelling.key,
                            shown.join(", ")
                        )));
                    }
                }
            };
            if let Some((_, other, _)) = seen.iter().find(|(p, _, v)| *p == path && *v != value) {
                return Err(err(format!(
                    "{other} sets the same key (`{}`) to another value; unset one of them",
                    path.join(".")
                )));
            }
            let (t, c) = with_value(&table, &path, &value).map_err(err)?;
            seen.push((path, var.clone(), value));
            table = t;
            next = Some(c);
        }
        if let Some(c) = next {
            *config = c;
        }
        Ok(())
    }

    /// The variable names of the keys `config` has (keys whose value is `None` are absent): a
    /// key of a section with an alias under that alias, every other key under `prefix`.
    pub fn names<T: Serialize>(&self, config: &T) -> Result<Vec<String>, ConfigError> {
        Ok(leaf_names(&to_table(config)?)
            .into_iter()
            .map(|k| {
                let alias = self.aliases.iter().find_map(|a| {
                    let rest = k.strip_prefix(a.section)?.strip_prefix('.')?;
                    (!a.section.is_empty()).then_some((a.prefix, rest))
                });
                let (prefix, rest) = alias.unwrap_or((self.prefix, k.as_str()));
                format!("{prefix}{}", rest.replace('.', "_").to_ascii_uppercase())
            })
            .collect())
    }

    /// Every spelling of every key `config` has: [`Env::names`], the same keys under
    /// `prefix`, and under top-level aliases.
    fn all_names<T: Serialize>(&self, config: &T) -> Result<Vec<String>, ConfigError> {
        let mut names = self.names(config)?;
        for k in leaf_names(&to_table(config)?) {
            let env = k.replace('.', "_").to_ascii_uppercase();
            names.push(format!("{}{env}", self.prefix));
            for a in self.aliases.iter().filter(|a| a.section.is_empty()) {
                names.push(format!("{}{env}", a.prefix));
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Applies the variables of the keys `config` has, read through `var` (tests, embedders).
    pub fn apply_lookup<T>(
        &self,
        config: &mut T,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError>
    where
        T: Serialize + DeserializeOwned,
    {
        let vars: Vec<(String, String)> = self
            .all_names(config)?
            .into_iter()
            .filter_map(|name| var(&name).map(|v| (name, v)))
            .collect();
        self.apply(config, vars)
    }
}

/// Parses a TOML file into `T` (keys as `T`'s field names; `T` decides about unknown keys).
pub fn from_file<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::File {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Sets one key (`pool_size`, `retry.max_attempts`, or `retry_max_attempts` as in the
/// environment; `-` reads as `_`) from its text (flags, `--set KEY=VALUE`).
pub fn set<T>(config: &mut T, key: &str, value: &str) -> Result<(), ConfigError>
where
    T: Serialize + DeserializeOwned,
{
    let err = |message: String| ConfigError::Key {
        key: key.to_owned(),
        message,
    };
    let table = to_table(config)?;
    let name = key.trim().replace('-', "_");
    let path = if name.contains('.') {
        let path: Vec<String> = name.split('.').map(str::to_owned).collect();
        let (_, parents) = path.split_last().ok_or_else(|| err("empty key".into()))?;
        lookup(&table, parents)
            .and_then(toml::Value::as_table)
            .is_some()
            .then_some(path)
    } else {
        resolve(&table, &name)
    };
    let path = path.ok_or_else(|| {
        err(format!(
            "unknown key `{name}` (keys: {})",
            leaf_names(&table).join(", ")
        ))
    })?;
    *config = with_value(&table, &path, value).map_err(err)?.1;
    Ok(())
}

/// Sets each key whose flag was given (`(key, None)` = flag absent), as [`set`] does.
pub fn set_flags<T>(
    config: &mut T,
    flags: impl IntoIterator<Item = (&'static str, Option<String>)>,
) -> Result<(), ConfigError>
where
    T: Serialize + DeserializeOwned,
{
    for (key, value) in flags {
        if let Some(v) = value {
            set(config, key, &v)?;
        }
    }
    Ok(())
}

fn to_table<T: Serialize>(config: &T) -> Result<toml::Table, ConfigError> {
    toml::Table::try_from(config).map_err(|e| ConfigError::Key {
        key: "(config)".into(),
        message: format!("cannot be written as TOML: {e}"),
    })
}

/// `table` with the key at `path` set from `text`, and the config it makes.
fn with_value<T: DeserializeOwned>(
    table: &toml::Table,
    path: &[String],
    text: &str,
) -> Result<(toml::Table, T), String> {
    let (leaf, parents) = path.split_last().ok_or("empty key")?;
    let mut next = table.clone();
    let mut section = &mut next;
    for p in parents {
        section = section
            .entry(p.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(|| format!("`{p}` is not a section"))?;
    }
    let value = match section.get(leaf) {
        Some(template) => parse_like(template, text)?,
        None => guess(text),
    };
    section.insert(leaf.clone(), value);
    let config = toml::Value::Table(next.clone())
        .try_into()
        .map_err(|e: toml::de::Error| format!("{} (key `{}`)", e.message(), path.join(".")))?;
    Ok((next, config))
}

/// The key an environment spelling (`retry_max_attempts`) stands for: a key of the config
/// whose path joined by `_` is `name` (the top level first: `max_sessions` is not
/// `[max] sessions`), else a key missing from the config in its longest matching section.
fn resolve(table: &toml::Table, name: &str) -> Option<Vec<String>> {
    let mut leaves = Vec::new();
    let mut sections = Vec::new();
    walk(table, &mut Vec::new(), &mut leaves, &mut sections);
    leaves.sort_by_key(Vec::len);
    if let Some(p) = leaves.into_iter().find(|p| p.join("_") == name) {
        return Some(p);
    }
    sections.sort_by_key(|p| std::cmp::Reverse(p.join("_").len()));
    sections.into_iter().find_map(|mut p| {
        let field = name.strip_prefix(&p.join("_"))?.strip_prefix('_')?;
        (!field.is_empty()).then(|| {
            p.push(field.to_owned());
            p
        })
    })
}

fn walk(
    table: &toml::Table,
    path: &mut Vec<String>,
    leaves: &mut Vec<Vec<String>>,
    sections: &mut Vec<Vec<String>>,
) {
    for (k, v) in table {
        path.push(k.clone());
        match v {
            toml::Value::Table(sub) => {
                sections.push(path.clone());
                walk(sub, path, leaves, sections);
            }
            _ => leaves.push(path.clone()),
        }
        path.pop();
    }
}

fn leaf_names(table: &toml::Table) -> Vec<String> {
    let mut leaves = Vec::new();
    walk(table, &mut Vec::new(), &mut leaves, &mut Vec::new());
    leaves.into_iter().map(|p| p.join(".")).collect()
}

fn lookup<'a>(table: &'a toml::Table, path: &[String]) -> Option<&'a toml::Value> {
    let (first, rest) = path.split_first()?;
    let mut value = table.get(first)?;
    for p in rest {
        value = value.as_table()?.get(p)?;
    }
    Some(value)
}

/// `text` read as the type of `template` (the key's current value).
fn parse_like(template: &toml::Value, text: &str) -> Result<toml::Value, String> {
    let t = text.trim();
    Ok(match template {
        toml::Value::Boolean(_) => toml::Value::Boolean(
            parse_bool(t).ok_or_else(|| format!("`{t}` is not a boolean (true/false)"))?,
        ),
        toml::Value::Integer(_) => {
            toml::Value::Integer(t.parse().map_err(|_| format!("`{t}` is not an integer"))?)
        }
        toml::Value::Float(_) => {
            toml::Value::Float(t.parse().map_err(|_| format!("`{t}` is not a number"))?)
        }
        toml::Value::Array(_) => toml::Value::Array(
            t.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.to_owned()))
                .collect(),
        ),
        toml::Value::Table(_) => return Err("is a section: set its keys".into()),
        toml::Value::String(_) | toml::Value::Datetime(_) => toml::Value::String(t.to_owned()),
    })
}

fn parse_bool(t: &str) -> Option<bool> {
    match t.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// A key the config leaves unset (`None`): an integer, a boolean, else a string.
fn guess(text: &str) -> toml::Value {
    let t = text.trim();
    t.parse::<i64>()
        .map(toml::Value::Integer)
        .ok()
        .or_else(|| t.parse::<bool>().ok().map(toml::Value::Boolean))
        .unwrap_or_else(|| toml::Value::String(t.to_owned()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Demo {
        listen: std::net::SocketAddr,
        max_items: u32,
        enabled: bool,
        names: Vec<String>,
        retry: Retry,
        limits: Limits,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Retry {
        max_attempts: u32,
        jitter: f64,
    }

    impl Default for Retry {
        fn default() -> Self {
            Retry {
                max_attempts: 3,
                jitter: 0.2,
            }
        }
    }

    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Limits {
        timeout_ms: Option<u64>,
    }

    impl Default for Demo {
        fn default() -> Self {
            Demo {
                listen: "127.0.0.1:1".parse().unwrap(),
                max_items: 10,
                enabled: true,
                names: Vec::new(),
                retry: Retry::default(),
                limits: Limits::default(),
            }
        }
    }

    const ENV: Env = Env {
        prefix: "DEMO_",
        unknown: UnknownVars::Refuse,
        aliases: &[],
    };

    /// `[retry]` also as `RETRY_<KEY>`; the whole service also as `OLD_<KEY>` (lenient).
    const ALIASED: Env = Env {
        prefix: "DEMO_",
        unknown: UnknownVars::Refuse,
        aliases: &[
            Alias {
                prefix: "RETRY_",
                section: "retry",
                unknown: UnknownVars::Refuse,
            },
            Alias {
                prefix: "OLD_",
                section: "",
                unknown: UnknownVars::Ignore,
            },
        ],
    };

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn config_file_then_env_then_set() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("demo.toml");
        std::fs::write(
            &file,
            "max_items = 5\nenabled = false\n[retry]\njitter = 0.5\n",
        )
        .unwrap();
        let mut c: Demo = from_file(&file).unwrap();
        assert_eq!((c.max_items, c.enabled, c.retry.jitter), (5, false, 0.5));
        assert_eq!(c.retry.max_attempts, 3, "unset keys keep their default");
        ENV.apply(
            &mut c,
            vars(&[("DEMO_MAX_ITEMS", "7"), ("DEMO_RETRY_MAX_ATTEMPTS", " 9 ")]),
        )
        .unwrap();
        assert_eq!((c.max_items, c.retry.max_attempts), (7, 9));
        assert!(
            !c.enabled,
            "the file's value stands where no variable is set"
        );
        set(&mut c, "max_items", "8").unwrap();
        set(&mut c, "retry.jitter", "0.1").unwrap();
        set(&mut c, "retry-max-attempts", "2").unwrap();
        assert_eq!(
            (c.max_items, c.retry.jitter, c.retry.max_attempts),
            (8, 0.1, 2)
        );
    }

    #[test]
    fn config_env_reaches_sections_and_unset_options() {
        let mut c = Demo::default();
        ENV.apply(
            &mut c,
            vars(&[
                ("DEMO_LIMITS_TIMEOUT_MS", "5000"),
                ("DEMO_ENABLED", "off"),
                ("DEMO_CONFIG", "/etc/demo.toml"),
                ("OTHER_MAX_ITEMS", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(c.limits.timeout_ms, Some(5000));
        assert!(!c.enabled);
        assert_eq!(c.max_items, 10);
        set(&mut c, "limits.timeout_ms", "6000").unwrap();
        assert_eq!(c.limits.timeout_ms, Some(6000));
    }

    #[test]
    fn config_lists_are_comma_separated() {
        let mut c = Demo::default();
        ENV.apply(&mut c, vars(&[("DEMO_NAMES", " a , b,,c ,")]))
            .unwrap();
        assert_eq!(c.names, ["a", "b", "c"]);
        set(&mut c, "names", "").unwrap();
        assert!(c.names.is_empty());
    }

    #[test]
    fn config_bad_values_name_the_variable_and_change_nothing() {
        let mut c = Demo::default();
        let err = ENV
            .apply(
                &mut c,
                vars(&[("DEMO_MAX_ITEMS", "3"), ("DEMO_RETRY_MAX_ATTEMPTS", "many")]),
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("DEMO_RETRY_MAX_ATTEMPTS"), "{err}");
        assert!(err.contains("not an integer"), "{err}");
        assert_eq!(c, Demo::default(), "a refused variable applies none");
        let err = ENV
            .apply(&mut c, vars(&[("DEMO_LISTEN", "nowhere")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("DEMO_LISTEN") && err.contains("`listen`"),
            "{err}"
        );
        let err = set(&mut c, "enabled", "maybe").unwrap_err().to_string();
        assert!(
            err.starts_with("enabled:") && err.contains("boolean"),
            "{err}"
        );
        let err = set(&mut c, "limits.timeout_ms", "soon")
            .unwrap_err()
            .to_string();
        assert!(err.contains("limits.timeout_ms"), "{err}");
        assert_eq!(c, Demo::default());
    }

    #[test]
    fn config_unknown_keys_are_refused() {
        let mut c = Demo::default();
        let err = set(&mut c, "nope", "1").unwrap_err().to_string();
        assert!(
            err.contains("unknown key `nope`") && err.contains("max_items"),
            "{err}"
        );
        assert!(set(&mut c, "retry.nope", "1").is_err());
        assert!(set(&mut c, "nosection.key", "1").is_err());
        let err = ENV
            .apply(&mut c, vars(&[("DEMO_MAX_ITEM", "1")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("DEMO_MAX_ITEM"), "{err}");
        let lenient = Env {
            unknown: UnknownVars::Ignore,
            ..ENV
        };
        lenient
            .apply(&mut c, vars(&[("DEMO_ADDR", "x"), ("DEMO_MAX_ITEMS", "4")]))
            .unwrap();
        assert_eq!(c.max_items, 4);

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("demo.toml");
        std::fs::write(&file, "[retry]\nmax_attempt = 2\n").unwrap();
        let err = from_file::<Demo>(&file).unwrap_err().to_string();
        assert!(
            err.contains("demo.toml") && err.contains("max_attempt"),
            "{err}"
        );
        let err = from_file::<Demo>(&dir.path().join("missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read config file"), "{err}");
    }

    #[test]
    fn config_lookup_reads_the_names_of_the_keys() {
        let mut c = Demo::default();
        let names = ENV.names(&c).unwrap();
        assert!(
            names.contains(&"DEMO_RETRY_MAX_ATTEMPTS".to_owned()),
            "{names:?}"
        );
        ENV.apply_lookup(&mut c, |k| (k == "DEMO_MAX_ITEMS").then(|| "6".into()))
            .unwrap();
        assert_eq!(c.max_items, 6);
    }

    #[test]
    fn config_section_aliases_name_a_section_and_old_spellings_still_work() {
        let mut c = Demo::default();
        ALIASED
            .apply(
                &mut c,
                vars(&[
                    ("RETRY_MAX_ATTEMPTS", "7"),
                    ("OLD_MAX_ITEMS", "4"),
                    ("OLD_ADDR", "not a key: ignored"),
                    ("OTHER_MAX_ITEMS", "99"),
                ]),
            )
            .unwrap();
        assert_eq!((c.retry.max_attempts, c.max_items), (7, 4));

        // The section alias is the name `names` gives; the primary spelling still works.
        let names = ALIASED.names(&c).unwrap();
        assert!(names.contains(&"RETRY_JITTER".to_owned()), "{names:?}");
        assert!(names.contains(&"DEMO_MAX_ITEMS".to_owned()), "{names:?}");
        assert!(
            !names.contains(&"DEMO_RETRY_JITTER".to_owned()),
            "{names:?}"
        );
        ALIASED
            .apply(&mut c, vars(&[("DEMO_RETRY_JITTER", "0.75")]))
            .unwrap();
        assert_eq!(c.retry.jitter, 0.75);

        // A section alias reads keys of its section only, and refuses a typo by its name.
        let err = ALIASED
            .apply(&mut c, vars(&[("RETRY_MAX_ITEMS", "1")]))
            .unwrap_err()
            .to_string();
        let listed = [
            "(keys: max_attempts, jitter)",
            "(keys: jitter, max_attempts)",
        ];
        assert!(
            err.contains("RETRY_MAX_ITEMS") && listed.iter().any(|l| err.contains(l)),
            "{err}"
        );
        assert_eq!(c.max_items, 4, "a refused variable changes nothing");

        // Two spellings of one key must agree.
        let err = ALIASED
            .apply(
                &mut c,
                vars(&[
                    ("DEMO_RETRY_MAX_ATTEMPTS", "2"),
                    ("RETRY_MAX_ATTEMPTS", "3"),
                ]),
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("DEMO_RETRY_MAX_ATTEMPTS") && err.contains("retry.max_attempts"),
            "{err}"
        );
        assert_eq!(c.retry.max_attempts, 7, "all or none");
        ALIASED
            .apply(
                &mut c,
                vars(&[
                    ("DEMO_RETRY_MAX_ATTEMPTS", "2"),
                    ("RETRY_MAX_ATTEMPTS", "2"),
                ]),
            )
            .unwrap();
        assert_eq!(c.retry.max_attempts, 2);

        // Lookups find every spelling.
        ALIASED
            .apply_lookup(&mut c, |k| (k == "OLD_MAX_ITEMS").then(|| "12".into()))
            .unwrap();
        assert_eq!(c.max_items, 12);
    }
}
