//! From a document to its blocks and their planned status.
//!
//! Pure: no I/O, no store. Decides everything that can be decided from the document alone:
//! header form, unterminated fences, duplicates, path rules (through `pathguard`, the only
//! place they live) and the limits. A block left `Written` here is one the store is asked to
//! write; the store may still refuse it (`symlink_in_path`, `not_a_file`, `exists`, ...).

use std::collections::HashMap;
use std::ops::Range;

use pathguard::Policy;
use serde::{Deserialize, Serialize};

use crate::fence::{self, Header};

/// The reason words ingest itself assigns (common.proto vocabulary). Path reasons come from
/// `pathguard::Reason::as_str`, store refusals from the store's `cairn-reason` metadata.
pub mod reason {
    pub const MALFORMED_HEADER: &str = "malformed_header";
    pub const UNTERMINATED_FENCE: &str = "unterminated_fence";
    pub const SUPERSEDED: &str = "superseded";
    pub const TOO_LARGE: &str = "too_large";
    pub const TOO_MANY_BLOCKS: &str = "too_many_blocks";
    pub const STORE_UNAVAILABLE: &str = "store_unavailable";
    pub const IO_ERROR: &str = "io_error";
    /// The store refused a write: a newer claim on the run fenced the caller off.
    pub const FENCED: &str = "fenced";
    /// A workspace file someone other than ingest wrote or edited was left alone.
    pub const KEPT: &str = "kept";
    /// The store's compare-and-swap found the file changed meanwhile.
    pub const CHANGED: &str = "changed";
}

/// Every file= path is written beneath this project directory.
pub const WORKSPACE: &str = "workspace";

/// Size limits (config `max_block_bytes`, `max_blocks`, `max_document_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// A block whose content is larger is `rejected` / `too_large`.
    pub max_block_bytes: u64,
    /// Recorded blocks from this index on are `rejected` / `too_many_blocks`.
    pub max_blocks: u32,
    /// A larger document is not parsed: one `rejected` / `too_large` entry stands for it.
    pub max_document_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_block_bytes: 1 << 20,
            max_blocks: 1000,
            max_document_bytes: 16 << 20,
        }
    }
}

/// Manifest status of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockStatus {
    /// Written to `workspace/<file>` (after `parse` alone: would be written).
    Written,
    /// Did not qualify: malformed header, unterminated fence, superseded.
    Skipped,
    /// Refused by a safety or validation rule, a limit, the store, or not written because the
    /// store failed (`store_unavailable`, `io_error`).
    Rejected,
}

impl BlockStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockStatus::Written => "written",
            BlockStatus::Skipped => "skipped",
            BlockStatus::Rejected => "rejected",
        }
    }
}

/// One recorded block of a document: a manifest entry plus where its content is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// 0-based position among the recorded blocks.
    pub index: u32,
    /// The fence's language token ("" when a malformed header has none).
    pub lang: String,
    /// The file= value as written (for a malformed header: best effort, see docs/ingest.md).
    pub declared_file: String,
    /// `workspace/<normalised path>`, or "" when the path was refused before normalisation.
    pub workspace_path: String,
    /// Byte range of the content in the document given to [`parse`].
    pub content: Range<usize>,
    /// Content length.
    pub bytes: u64,
    /// Lower-case hex sha256 of the content.
    pub sha256: String,
    pub status: BlockStatus,
    /// Reason word; "" when written.
    pub reason: String,
    /// What is wrong and how to fix it (never content); "" when written. Not in the manifest.
    pub detail: String,
}

impl Block {
    /// The content bytes, given the document `parse` was called with.
    pub fn content_of<'a>(&self, doc: &'a [u8]) -> &'a [u8] {
        doc.get(self.content.clone()).unwrap_or_default()
    }

    pub(crate) fn set(&mut self, status: BlockStatus, reason: &str, detail: impl Into<String>) {
        self.status = status;
        self.reason = reason.to_owned();
        self.detail = detail.into();
    }
}

/// Lower-case hex sha256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    cairn_sha256::sha256_hex(bytes)
}

/// Parses `doc` into its recorded blocks with their planned status. Never panics.
///
/// Order of decisions for each block: position beyond `max_blocks` (`too_many_blocks`, nothing
/// else examined); header form (`malformed_header`); unterminated fence; path rules in
/// pathguard's order (including the denylist of `policy`); `too_large`; then duplicates among
/// the blocks still to be written (last wins, earlier ones `superseded`). A document over `max_document_bytes` is not parsed at all.
pub fn parse(doc: &[u8], limits: &Limits, policy: &Policy) -> Vec<Block> {
    if doc.len() as u64 > limits.max_document_bytes {
        let mut block =
            oversized_document(doc.len() as u64, sha256_hex(doc), limits.max_document_bytes);
        block.content = 0..doc.len();
        return vec![block];
    }

    // Entries beyond max_blocks are recorded one by one, but at most as many again: a document
    // of tiny fences must not turn into a manifest and events hundreds of MB long.
    let most = (limits.max_blocks as usize).saturating_mul(2).max(1);
    let fenced = fence::scan_at_most(doc, most + 1);
    let stopped = fenced.len() > most;
    let mut blocks: Vec<Block> = fenced
        .into_iter()
        .take(most)
        .enumerate()
        .map(|(i, f)| {
            let (lang, declared_file, header_problem) = match f.header {
                Header::File {
                    lang,
                    declared_file,
                } => (lang, declared_file, None),
                Header::Malformed {
                    lang,
                    declared_file,
                    problem,
                } => (lang, declared_file, Some(problem)),
            };
            let bytes = f.content.len() as u64;
            let mut block = Block {
                index: u32::try_from(i).unwrap_or(u32::MAX),
                lang,
                declared_file,
                workspace_path: String::new(),
                bytes,
                // Filled in below, on several threads for a large document.
                sha256: String::new(),
                content: f.content,
                status: BlockStatus::Written,
                reason: String::new(),
                detail: String::new(),
            };
            if i >= limits.max_blocks as usize {
                block.set(
                    BlockStatus::Rejected,
                    reason::TOO_MANY_BLOCKS,
                    format!(
                        "the document has more than {} blocks (max_blocks); split it",
                        limits.max_blocks
                    ),
                );
            } else if let Some(problem) = header_problem {
                block.set(BlockStatus::Skipped, reason::MALFORMED_HEADER, problem);
            } else if !f.terminated {
                block.set(
                    BlockStatus::Skipped,
                    reason::UNTERMINATED_FENCE,
                    "the document ends before the closing fence (truncated output?)",
                );
            }
            block
        })
        .collect();

    hash_contents(doc, &mut blocks);

    if stopped {
        if let Some(last) = blocks.last_mut() {
            last.detail = format!(
                "the document has more than {most} blocks (twice max_blocks = {}); it was not read further",
                limits.max_blocks
            );
        }
    }

    for b in blocks.iter_mut() {
        // Not examined (beyond the limit), or no file was declared in the accepted form.
        if b.reason == reason::TOO_MANY_BLOCKS || b.reason == reason::MALFORMED_HEADER {
            continue;
        }
        let path_check = check_path(&b.declared_file, policy);
        if let Ok(workspace_path) | Err((Some(workspace_path), _)) = &path_check {
            b.workspace_path = workspace_path.clone();
        }
        if b.status != BlockStatus::Written {
            continue;
        }
        if let Err((_, rejection)) = path_check {
            b.set(
                BlockStatus::Rejected,
                rejection.reason.as_str(),
                rejection.message,
            );
        } else if b.bytes > limits.max_block_bytes {
            b.set(
                BlockStatus::Rejected,
                reason::TOO_LARGE,
                format!(
                    "the block is {} bytes, over the limit of {} (max_block_bytes)",
                    b.bytes, limits.max_block_bytes
                ),
            );
        }
    }

    // the same path twice (NFC-normalised, case-folded) -> the last block wins; a
    // model that rewrites a file means its last version. Only blocks that would be written
    // compete: a refused or skipped block never supersedes a valid one.
    let keys: Vec<Option<String>> = blocks
        .iter()
        .map(|b| (b.status == BlockStatus::Written).then(|| duplicate_key(&b.declared_file)))
        .collect();
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (i, key) in keys.iter().enumerate() {
        if let Some(key) = key {
            last.insert(key, i);
        }
    }
    for (b, (i, key)) in blocks.iter_mut().zip(keys.iter().enumerate()) {
        let Some(key) = key else { continue };
        if last.get(key.as_str()) != Some(&i) {
            b.set(
                BlockStatus::Skipped,
                reason::SUPERSEDED,
                "a later block declares the same file",
            );
        }
    }
    blocks
}

/// Blocks of more content than this in all are hashed on several threads.
const PARALLEL_HASH_BYTES: usize = 4 << 20;
/// Most threads hashing one document's blocks.
const MAX_HASH_THREADS: usize = 4;

/// Sets each block's `sha256` from its content in `doc`. A large document's blocks are split
/// into runs of about equal bytes, hashed side by side (the last run on this thread); a run
/// whose thread cannot be started is hashed here.
fn hash_contents(doc: &[u8], blocks: &mut [Block]) {
    let ranges: Vec<Range<usize>> = blocks.iter().map(|b| b.content.clone()).collect();
    let digests = |run: &[Range<usize>]| -> Vec<String> {
        run.iter()
            .map(|r| sha256_hex(doc.get(r.clone()).unwrap_or_default()))
            .collect()
    };
    let total: usize = ranges.iter().map(|r| r.len()).sum();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_HASH_THREADS);
    // One run (all on this thread) unless it is worth splitting.
    let share = match threads < 2 || total < PARALLEL_HASH_BYTES {
        true => usize::MAX,
        false => total.div_ceil(threads),
    };
    let runs = runs_of(&ranges, share);
    let all: Vec<String> = std::thread::scope(|scope| {
        let (last, others) = runs
            .split_last()
            .map_or((None, &[][..]), |(l, o)| (Some(l), o));
        let started: Vec<_> = others
            .iter()
            .map(|run| {
                let (ranges, digests) = (&ranges, &digests);
                let thread = std::thread::Builder::new()
                    .name("ingest-hash".into())
                    .spawn_scoped(scope, move || digests(&ranges[run.clone()]));
                (run, thread.ok())
            })
            .collect();
        let last = last.map(|run| digests(&ranges[run.clone()]));
        let mut all = Vec::with_capacity(ranges.len());
        for (run, thread) in started {
            match thread.map(|t| t.join()) {
                Some(Ok(d)) => all.extend(d),
                _ => all.extend(digests(&ranges[run.clone()])),
            }
        }
        all.extend(last.unwrap_or_default());
        all
    });
    for (b, d) in blocks.iter_mut().zip(all) {
        b.sha256 = d;
    }
}

/// Consecutive runs of `ranges` (as index ranges) of at least `share` bytes each (the last
/// may be smaller), none empty.
fn runs_of(ranges: &[Range<usize>], share: usize) -> Vec<Range<usize>> {
    let (mut runs, mut start, mut bytes) = (Vec::new(), 0, 0);
    for (i, r) in ranges.iter().enumerate() {
        bytes += r.len();
        if bytes >= share {
            runs.push(start..i + 1);
            (start, bytes) = (i + 1, 0);
        }
    }
    if start < ranges.len() {
        runs.push(start..ranges.len());
    }
    runs
}

/// The one entry that stands for a document over `max_document_bytes` (`bytes` long, digest
/// `sha256`): index 0, no lang or paths, `rejected` / `too_large`. Its content range is empty;
/// [`parse`] sets it to the whole document.
pub fn oversized_document(bytes: u64, sha256: String, limit: u64) -> Block {
    Block {
        index: 0,
        lang: String::new(),
        declared_file: String::new(),
        workspace_path: String::new(),
        content: 0..0,
        bytes,
        sha256,
        status: BlockStatus::Rejected,
        reason: reason::TOO_LARGE.to_owned(),
        detail: format!("the document is {bytes} bytes, over the limit of {limit} (max_document_bytes); it was not parsed"),
    }
}

/// The path rules for a declared file: `Ok(workspace path)`, or the rejection together with
/// the workspace path when the refusal came after normalisation (denylist, length of the
/// joined path).
fn check_path(
    declared: &str,
    policy: &Policy,
) -> Result<String, (Option<String>, pathguard::Rejection)> {
    let safe = pathguard::validate(declared).map_err(|r| (None, r))?;
    let workspace_path = format!("{WORKSPACE}/{safe}");
    // The denylist applies to the declared path (the `workspace/` prefix is ingest's own); the
    // joined path can only fail on its length (a valid path under a valid prefix).
    match policy
        .check(declared)
        .and_then(|_| pathguard::validate(&workspace_path))
    {
        Ok(_) => Ok(workspace_path),
        Err(r) => Err((Some(workspace_path), r)),
    }
}

/// `pathguard::fold_key`, with a shortcut for ASCII paths (the common case), where NFC is the
/// identity and case folding is ASCII lowercasing. `ascii_fold_key_is_fold_key` keeps the two
/// equal.
pub fn duplicate_key(path: &str) -> String {
    if path.is_ascii() {
        path.to_ascii_lowercase()
    } else {
        pathguard::fold_key(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn ascii_fold_key_is_fold_key(path in "[ -~]{0,40}") {
            proptest::prop_assert_eq!(duplicate_key(&path), pathguard::fold_key(&path));
        }

        #[test]
        fn hash_runs_cover_every_block_once_in_order(
            lens in proptest::collection::vec(0usize..5000, 0..200),
            share in 1usize..20_000,
        ) {
            let mut at = 0;
            let ranges: Vec<Range<usize>> = lens.iter().map(|l| { at += l; at - l..at }).collect();
            let runs = runs_of(&ranges, share);
            let mut next = 0;
            for (i, run) in runs.iter().enumerate() {
                proptest::prop_assert_eq!(run.start, next);
                proptest::prop_assert!(run.end > run.start);
                let bytes: usize = ranges[run.clone()].iter().map(|r| r.len()).sum();
                proptest::prop_assert!(bytes >= share || i + 1 == runs.len());
                next = run.end;
            }
            proptest::prop_assert_eq!(next, ranges.len());
        }
    }

    #[test]
    fn a_large_document_s_blocks_each_get_the_digest_of_their_own_content() {
        // Above PARALLEL_HASH_BYTES, so hashed on several threads: a digest given to the
        // wrong block, or left out, shows here.
        let mut doc = String::new();
        let mut contents = Vec::new();
        for i in 0..700 {
            let body = format!("{i:05}\n").repeat(if i % 7 == 0 { 8000 } else { 1 + i % 50 });
            doc.push_str(&format!("```text file=f/{i}.txt\n{body}```\n"));
            contents.push(body);
        }
        doc.push_str("```text file=empty.txt\n```\n");
        contents.push(String::new());
        assert!(doc.len() > PARALLEL_HASH_BYTES);
        let limits = Limits {
            max_block_bytes: u64::MAX,
            max_blocks: 10_000,
            max_document_bytes: u64::MAX,
        };
        let blocks = parse(doc.as_bytes(), &limits, &Policy::default());
        assert_eq!(blocks.len(), contents.len());
        for (b, c) in blocks.iter().zip(&contents) {
            assert_eq!(
                b.content_of(doc.as_bytes()),
                c.as_bytes(),
                "block {}",
                b.index
            );
            assert_eq!(b.sha256, sha256_hex(c.as_bytes()), "block {}", b.index);
        }
    }

    #[test]
    fn document_over_the_limit_is_one_rejected_entry() {
        let limits = Limits {
            max_document_bytes: 10,
            ..Limits::default()
        };
        let doc = b"```py file=a.py\nx\n```\n";
        let blocks = parse(doc, &limits, &Policy::new(vec![], vec![]));
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].reason, reason::TOO_LARGE);
        assert_eq!(blocks[0].bytes, doc.len() as u64);
        assert_eq!(blocks[0].sha256, sha256_hex(doc));
    }

    #[test]
    fn recording_stops_at_twice_the_block_limit() {
        let limits = Limits {
            max_blocks: 2,
            ..Limits::default()
        };
        let doc = "```py file=a.py\n```\n".repeat(10);
        let blocks = parse(doc.as_bytes(), &limits, &Policy::new(vec![], vec![]));
        let reasons: Vec<&str> = blocks.iter().map(|b| b.reason.as_str()).collect();
        assert_eq!(
            reasons,
            ["superseded", "", "too_many_blocks", "too_many_blocks"]
        );
        assert!(
            blocks[3].detail.contains("not read further"),
            "{}",
            blocks[3].detail
        );
        assert!(!blocks[2].detail.contains("not read further"));
    }

    #[test]
    fn blocks_beyond_the_count_are_too_many() {
        let limits = Limits {
            max_blocks: 2,
            ..Limits::default()
        };
        let doc = b"```py file=a.py\n```\n```py file=b.py\n```\n```py path=c.py\n```\n```py file=d.py\n```\n";
        let blocks = parse(doc, &limits, &Policy::new(vec![], vec![]));
        let reasons: Vec<&str> = blocks.iter().map(|b| b.reason.as_str()).collect();
        assert_eq!(reasons, ["", "", "too_many_blocks", "too_many_blocks"]);
        assert!(blocks
            .iter()
            .all(|b| !b.detail.contains("not read further")));
    }
}
