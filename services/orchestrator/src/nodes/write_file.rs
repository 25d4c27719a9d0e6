//! `write_file`: renders `content` into the project file `path` through the store, then runs
//! the ingest hook when the file is a document.

use bytes::Bytes;

use super::{
    artifact_written, file_outputs, ingest, project_path, Access, NodeCtx, NodeError, NodeSuccess,
};
use cairn_graph::WriteFile;
use cairn_store_client::PutOptions;

pub async fn run(ctx: &NodeCtx, spec: &WriteFile) -> Result<NodeSuccess, NodeError> {
    let path = project_path(&ctx.scope, "path", &spec.path, Access::Write)?;
    let content = Bytes::from(ctx.scope.render("content", &spec.content)?);
    // Identical bytes come back UNCHANGED, so a redone attempt never duplicates a file. The
    // node's completion event makes the directory entry durable (one fsync per event batch).
    let opts = PutOptions {
        overwrite: spec.overwrite || ctx.reset,
        run_id: ctx.run_id.clone(),
        with_run_events: true,
        ..Default::default()
    };
    let put = ctx
        .store()
        .put(&ctx.project, &path, content.clone(), &opts)
        .await
        .map_err(|s| write_error(&path, &s))?;
    let mut out = NodeSuccess {
        outputs: file_outputs(&put),
        events: vec![artifact_written(&ctx.node_id, &put, None)],
    };
    if ingest::wants_hook(ctx, &put.path) {
        ingest::hook(ctx, &put.path, content, &mut out).await;
    }
    Ok(out)
}

pub use cairn_node::write_error;

cairn_node::unit_kind!(
    /// The `write_file` kind.
    WriteFileKind,
    "write_file",
    cairn_graph::NodeKind::WriteFile,
    run
);
