//! `tool_call`: renders the arguments and runs a built-in tool (tools.rs) or an installed one
//! (tools/installed.rs: a subprocess, or a sandbox run with `use_for_tools`).

use serde_json::{Map, Value};

use cairn_graph::{Template, ToolCall};
use cairn_node::{NodeCtx, NodeError, NodeSuccess, Scope};

pub async fn run(
    ctx: &NodeCtx,
    spec: &ToolCall,
    kind: &ToolCallKind,
) -> Result<NodeSuccess, NodeError> {
    let args = render_args(&ctx.scope, &spec.args)?;
    if !crate::is_builtin(&spec.tool) {
        return crate::installed::call(ctx, &kind.tools_dir, kind.use_sandbox, &spec.tool, &args)
            .await;
    }
    let outputs = crate::call(ctx.store(), &ctx.project, &ctx.run_id, &spec.tool, &args).await?;
    Ok(NodeSuccess {
        outputs,
        events: vec![],
    })
}

/// Text values are templates; a value that is exactly one reference keeps its type.
fn render_args(scope: &Scope, args: &Map<String, Value>) -> Result<Map<String, Value>, NodeError> {
    fn walk(scope: &Scope, field: &str, v: &Value) -> Result<Value, NodeError> {
        Ok(match v {
            Value::String(s) => {
                let t = Template::parse(s)
                    .map_err(|e| NodeError::refused(format!("field `{field}`: {e}")))?;
                scope.render_value(field, &t)?
            }
            Value::Array(a) => Value::Array(
                a.iter()
                    .enumerate()
                    .map(|(i, x)| walk(scope, &format!("{field}[{i}]"), x))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, x)| Ok((k.clone(), walk(scope, &format!("{field}.{k}"), x)?)))
                    .collect::<Result<_, NodeError>>()?,
            ),
            other => other.clone(),
        })
    }
    args.iter()
        .map(|(k, v)| Ok((k.clone(), walk(scope, &format!("args.{k}"), v)?)))
        .collect()
}

/// The `tool_call` kind, with where installed tools live and where they run.
pub struct ToolCallKind {
    pub tools_dir: String,
    /// Installed tools run on a sandbox runner (else as subprocesses).
    pub use_sandbox: bool,
}

impl cairn_node::Kind for ToolCallKind {
    fn type_name(&self) -> &'static str {
        "tool_call"
    }

    /// An installed tool exists now and gets its arguments (a run never fails on a tool that
    /// was never there).
    fn check(&self, node: &cairn_graph::Node) -> Result<(), String> {
        let cairn_graph::NodeKind::ToolCall(t) = &node.kind else {
            return Ok(());
        };
        if crate::is_builtin(&t.tool) {
            return Ok(());
        }
        let tool =
            crate::manifest::load(&self.tools_dir, &t.tool, &crate::builtin_names().join(", "))
                .map_err(|e| e.to_string())?;
        match tool.manifest.args.iter().find(|a| !t.args.contains_key(*a)) {
            Some(a) => Err(format!("tool `{}` needs argument `{a}`", t.tool)),
            None => Ok(()),
        }
    }

    fn run<'a>(
        &'a self,
        ctx: &'a NodeCtx,
    ) -> cairn_node::BoxFuture<'a, Result<NodeSuccess, NodeError>> {
        Box::pin(async move {
            match &ctx.node.kind {
                cairn_graph::NodeKind::ToolCall(spec) => run(ctx, spec, self).await,
                _ => Err(cairn_node::mismatch(self.type_name(), &ctx.node)),
            }
        })
    }
}
