//! The LLM providers of this orchestrator: the operator's `[llm.providers.<name>]` tables (plus
//! an implicit `default` made from `default_llm`), and the rules for what a request or graph
//! may pick. A request names a provider, sends a cassette inline, or points at a cassette in
//! its project; a URL it names itself is refused unless `llm.allow_request_llm_urls`, and even
//! then it gets no API key unless it is the `base_url` of a configured provider. Nothing here
//! reads the host's file system: cassettes come through the artifact-store (`cassette.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::openai::{self, LlmConfig, OpenAiProvider};
use super::{cassette, AgentError, Provider, ProviderSpec, ReplayProvider};
use cairn_graph::{Graph, NodeKind};
use cairn_store_client::Store;

/// Name of the provider `default_llm` makes when it is a URL or a cassette path.
pub const IMPLICIT_DEFAULT: &str = "default";

/// Reason word of a URL refused because `allow_request_llm_urls` is off.
pub const REASON_URL_NOT_ALLOWED: &str = "llm_url_not_allowed";
/// Reason word of a provider name this orchestrator does not have.
pub const REASON_UNKNOWN_PROVIDER: &str = "unknown_llm_provider";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// An OpenAI-compatible chat-completions server.
    #[default]
    Openai,
    /// Recorded answers from a cassette in the run's project.
    Replay,
}

/// `[llm.providers.<name>]`. Timeouts, attempts and streaming come from `[llm]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderConfig {
    /// `openai` (default) or `replay`.
    pub kind: ProviderKind,
    /// openai: the server's base URL (`http://127.0.0.1:8000/v1`).
    pub base_url: String,
    /// openai: the model; "" = `llm.model`.
    pub model: String,
    /// openai: environment variable holding the API key sent to `base_url`, and only there;
    /// "" = no key (`[llm].api_key_env` is not inherited).
    pub api_key_env: String,
    /// replay: the cassette's path in the run's project, read through the artifact-store.
    pub cassette: String,
}

impl ProviderConfig {
    /// Checks one table; the message names the key to fix.
    pub fn check(&self, name: &str, default_model: &str) -> Result<(), String> {
        let key = |k: &str| format!("llm.providers.{name}.{k}");
        if !valid_name(name) {
            return Err(format!(
                "llm.providers.{name}: a provider name is 1-64 letters, digits, `_` or `-`"
            ));
        }
        match self.kind {
            ProviderKind::Openai => {
                if !self.cassette.is_empty() {
                    return Err(format!(
                        "{} is for kind = \"replay\"; this provider is kind = \"openai\"",
                        key("cassette")
                    ));
                }
                openai::base_url(&self.base_url)
                    .map_err(|(_, message)| format!("{}: {message}", key("base_url")))?;
                if self.model.trim().is_empty() && default_model.trim().is_empty() {
                    return Err(format!("{} is required (or set llm.model)", key("model")));
                }
            }
            ProviderKind::Replay => {
                if !self.base_url.is_empty() || !self.api_key_env.is_empty() {
                    return Err(format!(
                        "{} and {} are for kind = \"openai\"; a replay provider has only `cassette`",
                        key("base_url"),
                        key("api_key_env")
                    ));
                }
                pathguard::validate(&self.cassette).map_err(|rej| {
                    format!(
                        "{}: {rej}; it is a path in the run's project (e.g. docs/cassettes/demo.yaml)",
                        key("cassette")
                    )
                })?;
            }
        }
        Ok(())
    }
}

/// A provider name: what `llm: <name>` may say.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The provider table with the implicit one `default_llm` makes, and the setting a run gets
/// when neither its request nor its graph names one. `default_llm` is the operator's: a URL
/// there is a configured base URL (it gets `[llm].api_key_env`).
fn with_default(
    llm: &LlmConfig,
    default_llm: &str,
) -> Result<(BTreeMap<String, ProviderConfig>, String), String> {
    let mut table = llm.providers.clone();
    if default_llm.trim().is_empty() {
        return Ok((table, String::new()));
    }
    let spec = ProviderSpec::parse(default_llm).map_err(|e| format!("default_llm: {e}"))?;
    let implicit = match spec {
        ProviderSpec::Named(name) => {
            if !table.contains_key(&name) {
                return Err(format!(
                    "default_llm names provider `{name}`, which has no [llm.providers.{name}] table"
                ));
            }
            return Ok((table, ProviderSpec::Named(name).to_spec_string()));
        }
        ProviderSpec::OpenAi { base_url, model } => ProviderConfig {
            kind: ProviderKind::Openai,
            base_url,
            model,
            api_key_env: llm.api_key_env.clone(),
            cassette: String::new(),
        },
        ProviderSpec::Replay(path) => ProviderConfig {
            kind: ProviderKind::Replay,
            cassette: path,
            ..ProviderConfig::default()
        },
        ProviderSpec::ReplayInline(_) => return Err(
            "default_llm: name a provider, `replay:<project path>` or `openai:<base_url>#<model>`"
                .into(),
        ),
    };
    if table.contains_key(IMPLICIT_DEFAULT) {
        return Err(format!(
            "default_llm `{default_llm}` makes a provider named `{IMPLICIT_DEFAULT}`, but [llm.providers.{IMPLICIT_DEFAULT}] exists too; set default_llm = \"{IMPLICIT_DEFAULT}\" instead"
        ));
    }
    implicit.check(IMPLICIT_DEFAULT, &llm.model)?;
    table.insert(IMPLICIT_DEFAULT.to_owned(), implicit);
    Ok((
        table,
        ProviderSpec::Named(IMPLICIT_DEFAULT.into()).to_spec_string(),
    ))
}

/// Checks `default_llm` against the `[llm]` section (config check).
pub fn check_default(llm: &LlmConfig, default_llm: &str) -> Result<(), String> {
    with_default(llm, default_llm).map(|_| ())
}

/// Builds providers from `llm` settings. Cassettes are read at each use (through the store),
/// so an edited cassette takes effect on the next request.
#[derive(Default)]
pub struct Providers {
    /// The `[llm]` settings of OpenAI-compatible providers.
    pub llm: LlmConfig,
    /// `llm.providers` plus the implicit `default`.
    table: BTreeMap<String, ProviderConfig>,
    /// The setting of a run that names none (`provider:<name>`, or "").
    default: String,
    /// One HTTP client (connection pool) for every OpenAI-compatible provider.
    http: std::sync::OnceLock<reqwest::Client>,
}

impl Providers {
    /// The providers of `llm` (no default).
    pub fn new(llm: LlmConfig) -> Providers {
        Providers {
            table: llm.providers.clone(),
            llm,
            default: String::new(),
            http: std::sync::OnceLock::new(),
        }
    }

    /// The providers of `llm` with `default_llm` as the default of runs that name none.
    pub fn with_default(llm: LlmConfig, default_llm: &str) -> Result<Providers, String> {
        let (table, default) = with_default(&llm, default_llm)?;
        Ok(Providers {
            table,
            default,
            ..Providers::new(llm)
        })
    }

    /// The names of the configured providers, comma-separated (for messages).
    fn names(&self) -> String {
        if self.table.is_empty() {
            "none".into()
        } else {
            self.table.keys().cloned().collect::<Vec<_>>().join(", ")
        }
    }

    fn http(&self) -> Result<reqwest::Client, AgentError> {
        Ok(match self.http.get() {
            Some(c) => c.clone(),
            None => {
                let c = openai::http_client(&self.llm)?;
                self.http.get_or_init(|| c).clone()
            }
        })
    }

    /// The key configured for `base_url`: the `api_key_env` of the (first) openai provider
    /// whose base URL it is. A URL no provider has gets none.
    fn key_for(&self, base_url: &str) -> Option<String> {
        let wanted = openai::base_url(base_url).ok()?;
        self.table
            .values()
            .filter(|p| p.kind == ProviderKind::Openai && !p.api_key_env.is_empty())
            .find(|p| openai::base_url(&p.base_url).ok().as_deref() == Some(wanted.as_str()))
            .and_then(|p| std::env::var(&p.api_key_env).ok())
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty())
    }

    /// The OpenAI-compatible provider of `base_url` and `model` ("" = `llm.model`), with the
    /// key configured for that base URL (none when no provider has it).
    pub fn openai(&self, base_url: &str, model: &str) -> Result<OpenAiProvider, AgentError> {
        Ok(
            OpenAiProvider::with_client(self.http()?, base_url, model, &self.llm)?
                .with_api_key(self.key_for(base_url)),
        )
    }

    /// The setting a run records: the request's, else the graph's, else the default; checked
    /// now (URL rule, provider known, cassette loads), node-level settings of the graph too.
    pub async fn choose(
        &self,
        requested: &str,
        graph: &Graph,
        store: &Store,
        project: &str,
    ) -> Result<String, AgentError> {
        let chosen = [requested, graph.llm.as_deref().unwrap_or("")]
            .into_iter()
            .find(|s| !s.trim().is_empty());
        let spec = match chosen {
            Some(s) => ProviderSpec::parse(s)?.to_spec_string(),
            None => self.default.clone(),
        };
        if !spec.is_empty() {
            self.get(&spec, store, project).await?;
        }
        for node_llm in node_settings(graph) {
            self.get(node_llm, store, project).await?;
        }
        Ok(spec)
    }

    /// The provider an `llm` setting stands for, under this orchestrator's rules; a cassette
    /// is read from `project` through `store`.
    pub async fn get(
        &self,
        spec: &str,
        store: &Store,
        project: &str,
    ) -> Result<Arc<dyn Provider>, AgentError> {
        if spec.trim().is_empty() {
            return Err(AgentError::NotConfigured);
        }
        let provider: Arc<dyn Provider> = match ProviderSpec::parse(spec)? {
            ProviderSpec::Named(name) => {
                let Some(config) = self.table.get(&name) else {
                    return Err(AgentError::Refused {
                        spec: spec.to_owned(),
                        reason: REASON_UNKNOWN_PROVIDER,
                        message: format!(
                            "this orchestrator has no provider `{name}` (configured: {}); the operator adds one under [llm.providers.<name>] in the orchestrator's config",
                            self.names()
                        ),
                    });
                };
                match config.kind {
                    ProviderKind::Openai => Arc::new(
                        OpenAiProvider::with_client(
                            self.http()?,
                            &config.base_url,
                            &config.model,
                            &self.llm,
                        )?
                        .with_api_key(
                            std::env::var(&config.api_key_env)
                                .ok()
                                .filter(|_| !config.api_key_env.is_empty())
                                .map(|k| k.trim().to_owned()),
                        ),
                    ),
                    ProviderKind::Replay => {
                        let text = cassette::read(store, project, &config.cassette).await?;
                        Arc::new(ReplayProvider::from_text(&config.cassette, &text)?)
                    }
                }
            }
            ProviderSpec::Replay(path) => {
                let text = cassette::read(store, project, &path).await?;
                Arc::new(ReplayProvider::from_text(&path, &text)?)
            }
            ProviderSpec::ReplayInline(text) => {
                Arc::new(ReplayProvider::from_text("inline cassette", &text)?)
            }
            ProviderSpec::OpenAi { base_url, model } => {
                if !self.llm.allow_request_llm_urls {
                    return Err(AgentError::Refused {
                        spec: spec.to_owned(),
                        reason: REASON_URL_NOT_ALLOWED,
                        message: format!(
                            "this orchestrator takes no LLM URL from requests or graphs (llm.allow_request_llm_urls is off); name one of its providers instead (configured: {}), or ask the operator to add this server under [llm.providers.<name>] in the orchestrator's config",
                            self.names()
                        ),
                    });
                }
                Arc::new(self.openai(&base_url, &model)?)
            }
        };
        Ok(provider)
    }
}

/// The node-level `llm:` settings of a graph (agent_task and code_delivery nodes, map bodies
/// included).
fn node_settings(graph: &Graph) -> impl Iterator<Item = &str> {
    graph.nodes.iter().filter_map(|n| {
        let kind = match &n.kind {
            NodeKind::Map(m) => &m.node.kind,
            k => k,
        };
        match kind {
            NodeKind::AgentTask(a) => a.llm.as_deref(),
            NodeKind::CodeDelivery(c) => c.llm.as_deref(),
            _ => None,
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn openai(base_url: &str, key_env: &str) -> ProviderConfig {
        ProviderConfig {
            base_url: base_url.into(),
            model: "m".into(),
            api_key_env: key_env.into(),
            ..Default::default()
        }
    }

    #[test]
    fn default_llm_makes_an_implicit_provider() {
        let llm = LlmConfig::default();
        let (table, default) = with_default(&llm, "openai:http://h:1/v1#m").unwrap();
        assert_eq!(default, "provider:default");
        assert_eq!(table["default"].api_key_env, "OPENAI_API_KEY");
        let (table, default) = with_default(&llm, "replay:docs/c.yaml").unwrap();
        assert_eq!(default, "provider:default");
        assert_eq!(table["default"].cassette, "docs/c.yaml");
        assert!(with_default(&llm, "replay:/etc/passwd").is_err());
        assert!(with_default(&llm, "replay:../x.yaml").is_err());
        assert!(with_default(&llm, "nope").unwrap_err().contains("nope"));
        let mut named = llm.clone();
        named
            .providers
            .insert("local".into(), openai("http://h/v1", ""));
        assert_eq!(with_default(&named, "local").unwrap().1, "provider:local");
        named
            .providers
            .insert("default".into(), openai("http://h/v1", ""));
        assert!(with_default(&named, "http://other/v1#m")
            .unwrap_err()
            .contains("default_llm = \"default\""));
    }

    #[test]
    fn tables_are_checked() {
        let ok = openai("http://h/v1", "K");
        assert!(ok.check("a", "").is_ok());
        assert!(ok.check("bad name", "").is_err());
        assert!(openai("ftp://h", "").check("a", "").is_err());
        let no_model = ProviderConfig {
            model: String::new(),
            ..ok.clone()
        };
        assert!(no_model.check("a", "").unwrap_err().contains("model"));
        assert!(no_model.check("a", "qwen").is_ok());
        let replay = ProviderConfig {
            kind: ProviderKind::Replay,
            cassette: "/etc/shadow".into(),
            ..Default::default()
        };
        assert!(replay.check("r", "").unwrap_err().contains("cassette"));
    }

    #[test]
    fn provider_names_are_1_to_64_letters_digits_underscores_and_dashes() {
        for name in ["a", "local-llm_2", "_", "-", &"x".repeat(64)] {
            assert!(valid_name(name), "{name}");
        }
        for name in ["", "a b", "a.b", "a/b", "é", &"x".repeat(65)] {
            assert!(!valid_name(name), "{name}");
        }
    }

    #[test]
    fn a_replay_table_refuses_any_openai_key() {
        let replay = |base_url: &str, api_key_env: &str| ProviderConfig {
            kind: ProviderKind::Replay,
            base_url: base_url.into(),
            api_key_env: api_key_env.into(),
            cassette: "docs/c.yaml".into(),
            ..Default::default()
        };
        assert!(replay("", "").check("r", "").is_ok());
        for (base_url, key) in [("http://h/v1", ""), ("", "K"), ("http://h/v1", "K")] {
            let e = replay(base_url, key).check("r", "").unwrap_err();
            assert!(e.contains("llm.providers.r.base_url"), "{e}");
        }
    }

    #[test]
    fn the_config_check_refuses_a_default_llm_no_table_backs() {
        let mut llm = LlmConfig::default();
        assert!(check_default(&llm, "").is_ok());
        assert!(check_default(&llm, "openai:http://h:1/v1#m").is_ok());
        let e = check_default(&llm, "local").unwrap_err();
        assert!(e.contains("[llm.providers.local]"), "{e}");
        assert!(check_default(&llm, "replay:../c.yaml").is_err());
        llm.providers
            .insert("local".into(), openai("http://h/v1", ""));
        assert!(check_default(&llm, "local").is_ok());
    }

    fn graph(yaml: &str) -> Graph {
        Graph::from_yaml(yaml, "r1", &BTreeMap::new()).unwrap()
    }

    const PLAIN: &str = "version: 1\nnodes:\n  - id: a\n    type: agent_task\n    prompt: hi\n";

    /// Named providers only: the store is never dialled.
    fn store() -> Store {
        Store::connect("127.0.0.1:1").unwrap()
    }

    fn refusal(e: AgentError) -> (&'static str, String) {
        match e {
            AgentError::Refused {
                reason, message, ..
            } => (reason, message),
            e => panic!("not a refusal: {e}"),
        }
    }

    #[tokio::test]
    async fn a_run_gets_the_request_s_then_the_graph_s_then_the_default_provider() {
        let mut llm = LlmConfig::default();
        llm.providers.insert("p".into(), openai("http://h/v1", ""));
        let providers = Providers::with_default(llm, "openai:http://h:1/v1#m").unwrap();
        let store = store();
        let plain = graph(PLAIN);
        let chose = |requested: &'static str, g: Graph| {
            let (providers, store) = (&providers, &store);
            async move { providers.choose(requested, &g, store, "p").await }
        };
        assert_eq!(chose("", plain.clone()).await.unwrap(), "provider:default");
        assert_eq!(chose("p", plain.clone()).await.unwrap(), "provider:p");
        let with_llm = graph(&format!("llm: provider:p\n{PLAIN}"));
        assert_eq!(chose("", with_llm.clone()).await.unwrap(), "provider:p");
        assert_eq!(
            chose("default", with_llm).await.unwrap(),
            "provider:default"
        );

        // Whatever is chosen is checked now, and so is every node's own setting.
        let (reason, message) = refusal(chose("nope", plain).await.unwrap_err());
        assert_eq!(reason, REASON_UNKNOWN_PROVIDER);
        assert!(
            message.contains("no provider `nope` (configured: default, p)"),
            "{message}"
        );
        let task = graph(&format!("{PLAIN}    llm: provider:nope\n"));
        let (reason, _) = refusal(chose("", task).await.unwrap_err());
        assert_eq!(reason, REASON_UNKNOWN_PROVIDER);
        let delivery = graph(concat!(
            "version: 1\nnodes:\n  - id: d\n    type: code_delivery\n    prompt: hi\n",
            "    source_type: empty\n    target: {type: directory, path: out}\n",
            "    llm: provider:nope\n",
        ));
        let (reason, _) = refusal(chose("", delivery).await.unwrap_err());
        assert_eq!(reason, REASON_UNKNOWN_PROVIDER);
    }

    #[tokio::test]
    async fn a_url_from_a_request_is_refused_unless_allowed() {
        let store = store();
        let spec = "openai:http://127.0.0.1:9/v1#m";
        let off = Providers::new(LlmConfig::default());
        let (reason, message) = refusal(off.get(spec, &store, "p").await.err().unwrap());
        assert_eq!(reason, REASON_URL_NOT_ALLOWED);
        assert!(message.contains("(configured: none)"), "{message}");
        let on = Providers::new(LlmConfig {
            allow_request_llm_urls: true,
            ..LlmConfig::default()
        });
        assert!(on.get(spec, &store, "p").await.is_ok());
    }

    #[test]
    fn keys_go_only_to_their_base_url() {
        let env = format!("CAIRN_UNIT_KEY_{}", std::process::id());
        std::env::set_var(&env, "sk-unit");
        let mut llm = LlmConfig::default();
        llm.providers
            .insert("p".into(), openai("http://127.0.0.1:9/v1/", &env));
        let providers = Providers::new(llm);
        assert_eq!(
            providers.key_for("http://127.0.0.1:9/v1").as_deref(),
            Some("sk-unit")
        );
        assert_eq!(
            providers
                .key_for("http://127.0.0.1:9/v1/chat/completions")
                .as_deref(),
            Some("sk-unit")
        );
        assert_eq!(providers.key_for("http://127.0.0.1:10/v1"), None);
        assert_eq!(providers.key_for("http://127.0.0.1:9/v2"), None);
        // A provider of the same URL without a key (sorted first) does not hide the key.
        let mut llm = providers.llm.clone();
        llm.providers
            .insert("a-keyless".into(), openai("http://127.0.0.1:9/v1", ""));
        llm.providers
            .insert("p".into(), openai("http://127.0.0.1:9/v1/", &env));
        assert_eq!(
            Providers::new(llm)
                .key_for("http://127.0.0.1:9/v1")
                .as_deref(),
            Some("sk-unit")
        );
        std::env::remove_var(&env);
    }
}
