//! Reading a `replay:` cassette: a path in the run's project, validated by pathguard and read
//! through the artifact-store, at most `MAX_CASSETTE_BYTES`: a Stat decides first (a Get would
//! have the store hash the whole file), and the read stops past the cap if the file grew. Never the host's file system: a client with a
//! local cassette sends it inline (`replay-inline:`; `cairn run` does). Errors name the path
//! and what to fix, never the file's content.

use tonic::Code;

use super::AgentError;
use cairn_store_client::Store;

/// Largest cassette accepted (in the project or inline).
pub const MAX_CASSETTE_BYTES: u64 = 16 << 20;

/// Reason word of a cassette path with no file in the project.
pub const REASON_NOT_FOUND: &str = "cassette_not_found";

const HINT: &str = "`replay:` takes a path in the run's project (e.g. docs/cassettes/demo.yaml); `cairn run --llm replay:<local file>` sends a local cassette inline";

/// The cassette at `path` in `project`, as text.
pub async fn read(store: &Store, project: &str, path: &str) -> Result<String, AgentError> {
    let refused = |reason: &'static str, message: String| AgentError::Cassette {
        path: path.to_owned(),
        reason,
        message,
    };
    if let Err(rej) = pathguard::validate(path) {
        return Err(refused(rej.reason.as_str(), format!("{rej}; {HINT}")));
    }
    let too_large = || {
        refused(
            "too_large",
            format!(
                "larger than {} MiB; a cassette holds recorded answers and is small",
                MAX_CASSETTE_BYTES >> 20
            ),
        )
    };
    let read = match store.stat(project, path, false).await {
        Ok(Some(info)) if info.size_bytes > MAX_CASSETTE_BYTES => return Err(too_large()),
        Ok(_) => store.get_at_most(project, path, MAX_CASSETTE_BYTES).await,
        Err(s) => Err(s),
    };
    let bytes = match read {
        Ok(Some(b)) => b,
        Ok(None) => {
            return Err(refused(
                REASON_NOT_FOUND,
                format!("no such file in project `{project}`; {HINT}"),
            ))
        }
        Err(s) if s.code() == Code::ResourceExhausted => return Err(too_large()),
        Err(s)
            if matches!(
                s.code(),
                Code::Unavailable | Code::Unknown | Code::Cancelled
            ) =>
        {
            return Err(AgentError::Unavailable(format!(
                "cannot read cassette {path} from the artifact-store: {}",
                s.message()
            )))
        }
        // The store's own refusals (denylist, prefix, not a file): its message names the path.
        Err(s) => {
            let reason = match cairn_proto::reason::of(&s).as_deref() {
                Some(word) => pathguard::Reason::from_str_opt(word)
                    .map(pathguard::Reason::as_str)
                    .unwrap_or("denied"),
                None => "denied",
            };
            return Err(refused(reason, s.message().to_owned()));
        }
    };
    String::from_utf8(bytes.to_vec()).map_err(|e| {
        refused(
            super::replay::REASON_MALFORMED,
            format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}
