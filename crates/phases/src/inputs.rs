//! The files a graph names (contract `schema_file`s, plan `limits_file`s and their prompt
//! files): how their paths are checked and joined, the bounds of what a submitter sends, and
//! where they are read from at submit ([`GraphFiles`]). The orchestrator reads them from what
//! the submitter sent or from the run's project through the store, never from its own host;
//! a client collects them from the graph file's directory with [`collect`].

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use cairn_graph::Graph;
use cairn_proto::v1::InputFile;
use pathguard::SafePath;

/// Most files sent with one graph.
pub const MAX_FILES: usize = 256;
/// Largest file a graph names (schema, limits, prompt).
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Most bytes sent with one graph, all files together.
pub const MAX_TOTAL_BYTES: u64 = 8 << 20;

/// Where the files a graph names are read from at submit.
pub trait GraphFiles: Sync {
    /// The text of `path` (checked, relative to the graph's directory). Err names the path
    /// and what to fix, never the file's content.
    fn read(&self, path: &SafePath) -> impl Future<Output = Result<String, String>> + Send;
}

/// `rel`, as the graph names it in directory `dir` (None = the graph's own), checked by the
/// path rules: relative, no `..`.
pub fn resolve(dir: Option<&SafePath>, rel: &str) -> Result<SafePath, String> {
    let path = pathguard::validate(rel).map_err(|rej| {
        format!("`{rel}`: {rej} (files are named relative to the graph's directory)")
    })?;
    match dir {
        Some(d) => d
            .checked_join(&path)
            .map_err(|rej| format!("`{rel}`: {rej}")),
        None => Ok(path),
    }
}

/// Text of a file as UTF-8; Err names the path.
pub fn text(path: &SafePath, bytes: &[u8]) -> Result<String, String> {
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(path));
    }
    String::from_utf8(bytes.to_vec()).map_err(|e| {
        format!(
            "`{path}` is not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })
}

pub fn too_large(path: &SafePath) -> String {
    format!(
        "`{path}` is larger than {} KiB; a schema, limits or prompt file is small",
        MAX_FILE_BYTES >> 10
    )
}

/// The files a submitter sent, checked: relative paths without `..`, each once, at most
/// [`MAX_FILES`] files of [`MAX_FILE_BYTES`], [`MAX_TOTAL_BYTES`] in all.
pub fn check_sent(files: Vec<InputFile>) -> Result<BTreeMap<SafePath, Bytes>, String> {
    if files.len() > MAX_FILES {
        return Err(format!(
            "files: {} files sent; at most {MAX_FILES} files go with one graph",
            files.len()
        ));
    }
    let total: u64 = files.iter().map(|f| f.content.len() as u64).sum();
    if total > MAX_TOTAL_BYTES {
        return Err(format!(
            "files: {} KiB sent; at most {} MiB go with one graph",
            total >> 10,
            MAX_TOTAL_BYTES >> 20
        ));
    }
    let mut out = BTreeMap::new();
    for f in files {
        let path = pathguard::validate(&f.path).map_err(|rej| {
            format!(
                "files: `{}`: {rej} (send each file under the relative path the graph names it by)",
                f.path
            )
        })?;
        if f.content.len() as u64 > MAX_FILE_BYTES {
            return Err(format!("files: {}", too_large(&path)));
        }
        if out.insert(path.clone(), f.content).is_some() {
            return Err(format!(
                "files: `{path}` is sent twice; send each file once"
            ));
        }
    }
    Ok(out)
}

/// A client's reader of the graph file's directory on its own machine: a symlink leading out
/// of that directory is refused. Keeps what it read, to send with the graph.
struct LocalDir {
    root: PathBuf,
    read: Mutex<BTreeMap<String, Vec<u8>>>,
    /// A file that must not be sent (it leads out of the directory).
    refused: Mutex<Option<String>>,
}

impl LocalDir {
    fn read_now(&self, path: &SafePath) -> Result<String, String> {
        let full = self.root.join(path.as_str());
        let real = std::fs::canonicalize(&full)
            .map_err(|e| format!("cannot read {}: {e}", full.display()))?;
        if !real.starts_with(&self.root) {
            let m = format!(
                "{} leads out of the graph's directory (to {}); only files under it are sent",
                full.display(),
                real.display()
            );
            if let Ok(mut r) = self.refused.lock() {
                r.get_or_insert(m.clone());
            }
            return Err(m);
        }
        let meta =
            std::fs::metadata(&real).map_err(|e| format!("cannot read {}: {e}", full.display()))?;
        if !meta.is_file() {
            return Err(format!("{} is not a file", full.display()));
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(too_large(path));
        }
        let bytes =
            std::fs::read(&real).map_err(|e| format!("cannot read {}: {e}", full.display()))?;
        let out = text(path, &bytes)?;
        if let Ok(mut r) = self.read.lock() {
            r.insert(path.to_string(), bytes);
        }
        Ok(out)
    }
}

impl GraphFiles for LocalDir {
    fn read(&self, path: &SafePath) -> impl Future<Output = Result<String, String>> + Send {
        let out = self.read_now(path);
        async move { out }
    }
}

/// The files `graph` names, read from `dir` (the graph file's directory) on the client, to
/// send with it. A file missing here is left out (the orchestrator then looks in the project
/// and says what is missing); one leading out of `dir` is an error.
pub async fn collect(dir: &Path, graph: &Graph) -> Result<Vec<InputFile>, String> {
    let root = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let local = LocalDir {
        root,
        read: Mutex::new(BTreeMap::new()),
        refused: Mutex::new(None),
    };
    let mut graph = graph.clone();
    // An error here (a missing or malformed file) is the orchestrator's to report.
    let _ = crate::prepare(&mut graph, &local).await;
    if let Some(m) = local.refused.lock().ok().and_then(|mut r| r.take()) {
        return Err(m);
    }
    let read = local.read.into_inner().unwrap_or_default();
    Ok(read
        .into_iter()
        .map(|(path, content)| InputFile {
            path,
            content: content.into(),
        })
        .collect())
}

/// Files in memory, by path (tests).
#[cfg(test)]
pub(crate) struct Mem(pub BTreeMap<&'static str, &'static str>);

#[cfg(test)]
impl GraphFiles for Mem {
    fn read(&self, path: &SafePath) -> impl Future<Output = Result<String, String>> + Send {
        let out = self
            .0
            .get(path.as_str())
            .map(|t| (*t).to_owned())
            .ok_or_else(|| format!("no file `{path}`"));
        async move { out }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sent(path: &str, len: usize) -> InputFile {
        InputFile {
            path: path.into(),
            content: vec![b'x'; len].into(),
        }
    }

    #[test]
    fn paths_are_relative_and_joined_under_their_directory() {
        assert_eq!(resolve(None, "a/b.json").unwrap().as_str(), "a/b.json");
        let dir = pathguard::validate("limits").unwrap();
        assert_eq!(
            resolve(Some(&dir), "prompts/p.md").unwrap().as_str(),
            "limits/prompts/p.md"
        );
        for bad in ["../x", "/etc/passwd", "a/../../x", ""] {
            assert!(resolve(Some(&dir), bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sent_files_are_bounded_and_named_once() {
        assert_eq!(check_sent(vec![sent("a.json", 3)]).unwrap().len(), 1);
        let e = check_sent(vec![sent("../a", 1)]).unwrap_err();
        assert!(e.contains("`..`"), "{e}");
        let e = check_sent(vec![sent("/etc/passwd", 1)]).unwrap_err();
        assert!(e.contains("absolute"), "{e}");
        let e = check_sent(vec![sent("a", 1), sent("a", 1)]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
        let many = (0..=MAX_FILES).map(|i| sent(&format!("f{i}"), 1)).collect();
        let e = check_sent(many).unwrap_err();
        assert!(e.contains("at most 256 files"), "{e}");
        let big = vec![sent("a", (MAX_FILE_BYTES + 1) as usize)];
        assert!(check_sent(big).unwrap_err().contains("1024 KiB"));
        let total = (0..9).map(|i| sent(&format!("f{i}"), 1 << 20)).collect();
        let e = check_sent(total).unwrap_err();
        assert!(e.contains("at most 8 MiB"), "{e}");
    }

    const GRAPH: &str = "contracts:\n  - {files: [\"*.json\"], schema_file: s.json}\nnodes:\n  - {id: p, type: plan, limits_file: l/limits.yaml}\n";

    #[tokio::test]
    async fn a_client_collects_what_the_graph_names_and_never_a_link_out() {
        let dir = tempfile::tempdir().unwrap();
        let g = dir.path().join("g");
        std::fs::create_dir_all(g.join("l/prompts")).unwrap();
        std::fs::write(g.join("s.json"), "{}").unwrap();
        std::fs::write(
            g.join("l/limits.yaml"),
            "tasks:\n  a: {daily_limit: 1}\n  b: {daily_limit: 1, prompt_file: b.md}\n",
        )
        .unwrap();
        std::fs::write(g.join("l/prompts/todoist-auto-a.md"), "A").unwrap();
        std::fs::write(g.join("unused.md"), "U").unwrap();
        let graph = Graph::from_yaml(GRAPH, "r", &BTreeMap::new()).unwrap();
        // l/b.md is missing: left for the orchestrator to report.
        let got = collect(&g, &graph).await.unwrap();
        let paths: Vec<&str> = got.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            ["l/limits.yaml", "l/prompts/todoist-auto-a.md", "s.json"]
        );

        std::fs::write(dir.path().join("secret"), "SECRET").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), g.join("l/b.md")).unwrap();
        let e = collect(&g, &graph).await.unwrap_err();
        assert!(e.contains("leads out of the graph's directory"), "{e}");
        assert!(!e.contains("SECRET"), "{e}");
    }
}
