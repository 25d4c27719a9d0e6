//! Properties of the parser over arbitrary documents: it never panics, every block's content
//! is a piece of the input, the summary counts are the per-status counts, and the statuses
//! are consistent with the rules (last path wins, written blocks have clean paths).
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;

use cairn_ingest::{parse, BlockStatus, Limits, Manifest, Source};
use proptest::prelude::*;

fn check(doc: &[u8], limits: &Limits) -> Result<(), TestCaseError> {
    let policy = cairn_ingest::Config::default().policy();
    let blocks = parse(doc, limits, &policy);
    let mut written_keys = HashSet::new();
    for (i, b) in blocks.iter().enumerate() {
        prop_assert_eq!(b.index as usize, i);
        // Content is a contiguous piece of the input, described by its range.
        prop_assert!(b.content.start <= b.content.end && b.content.end <= doc.len());
        let content = b.content_of(doc);
        prop_assert_eq!(content.len() as u64, b.bytes);
        // The digest is the one an independent implementation (`sha2`) computes.
        prop_assert_eq!(
            &b.sha256,
            &hex::encode(<sha2::Sha256 as sha2::Digest>::digest(content))
        );
        if !content.is_empty() && doc.len() < 2048 {
            prop_assert!(doc.windows(content.len()).any(|w| w == content));
        }
        match b.status {
            BlockStatus::Written => {
                prop_assert_eq!(&b.reason, "");
                prop_assert!(!b.lang.is_empty());
                prop_assert_eq!(&b.workspace_path, &format!("workspace/{}", b.declared_file));
                prop_assert!(b.bytes <= limits.max_block_bytes);
                prop_assert!(i < limits.max_blocks as usize);
                prop_assert!(
                    written_keys.insert(pathguard::fold_key(&b.declared_file)),
                    "one write per path"
                );
            }
            BlockStatus::Skipped | BlockStatus::Rejected => {
                prop_assert!(!b.reason.is_empty());
                if b.reason == "malformed_header" || b.reason == "too_many_blocks" {
                    prop_assert_eq!(&b.workspace_path, "");
                }
            }
        }
    }
    let source = Source {
        kind: "graph_runtime".into(),
        mode: "unknown".into(),
        doc_path: String::new(),
    };
    let manifest = Manifest::new("r", "n", source, &blocks);
    let s = manifest.summary;
    let count = |st: BlockStatus| blocks.iter().filter(|b| b.status == st).count() as u32;
    prop_assert_eq!(s.total_blocks as usize, blocks.len());
    prop_assert_eq!(s.written, count(BlockStatus::Written));
    prop_assert_eq!(s.skipped, count(BlockStatus::Skipped));
    prop_assert_eq!(s.rejected, count(BlockStatus::Rejected));
    prop_assert_eq!(s.written + s.skipped + s.rejected, s.total_blocks);
    // The JSON round-trips.
    let back: Manifest = serde_json::from_str(&manifest.to_json()).unwrap();
    prop_assert_eq!(back, manifest);
    Ok(())
}

/// Lines that exercise the fence machinery: openers, closers, near misses, BOMs, CRs.
fn fence_line() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("```".to_owned()),
        Just("````".to_owned()),
        Just("~~~".to_owned()),
        Just("~~~~ ".to_owned()),
        Just("   ```".to_owned()),
        Just("    ```".to_owned()),
        Just("``` not a closer".to_owned()),
        Just("```python".to_owned()),
        Just("```py file=a.py".to_owned()),
        Just("```py file=A.py".to_owned()),
        Just("````md file=README.md".to_owned()),
        Just("```py file=src/x.py \t".to_owned()),
        Just("```py file=../x.py".to_owned()),
        Just("```py file=.git/config".to_owned()),
        Just("```py path=a.py".to_owned()),
        Just("``` file=a.py".to_owned()),
        Just(" ```py file=a.py".to_owned()),
        Just("~~~py file=a.py".to_owned()),
        Just("```py file=\"a.py\"".to_owned()),
        Just("```py file=`a.py`".to_owned()),
        Just("\u{feff}```py file=b.py".to_owned()),
        Just("caf\u{e9}".to_owned()),
        Just(String::new()),
        "[a-z =`~\t]{0,12}",
        "```[a-z+]{1,3} file=[a-zA-Z./]{1,8}",
    ]
}

fn fence_doc() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec((fence_line(), prop::bool::ANY), 0..40),
        prop::bool::ANY,
    )
        .prop_map(|(lines, bom)| {
            let mut doc = if bom {
                "\u{feff}".to_owned()
            } else {
                String::new()
            };
            for (line, crlf) in lines {
                doc.push_str(&line);
                doc.push_str(if crlf { "\r\n" } else { "\n" });
            }
            doc.into_bytes()
        })
}

fn small_limits() -> impl Strategy<Value = Limits> {
    (1u64..64, 1u32..8, 64u64..4096).prop_map(|(b, n, d)| Limits {
        max_block_bytes: b,
        max_blocks: n,
        max_document_bytes: d,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(doc in prop::collection::vec(any::<u8>(), 0..4096)) {
        check(&doc, &Limits::default())?;
    }

    #[test]
    fn fence_heavy_text(doc in fence_doc()) {
        check(&doc, &Limits::default())?;
    }

    #[test]
    fn fence_heavy_text_with_small_limits(doc in fence_doc(), limits in small_limits()) {
        check(&doc, &limits)?;
    }

    #[test]
    fn fence_text_with_random_bytes_spliced_in(doc in fence_doc(), noise in prop::collection::vec(any::<u8>(), 0..32), at in any::<prop::sample::Index>()) {
        let mut doc = doc;
        let at = if doc.is_empty() { 0 } else { at.index(doc.len()) };
        doc.splice(at..at, noise);
        check(&doc, &Limits::default())?;
    }
}

#[test]
fn default_limits_apply() {
    let policy = cairn_ingest::Config::default().policy();
    // 1001 blocks: the 1001st is too_many_blocks.
    let mut doc = String::new();
    for i in 0..1001 {
        doc.push_str(&format!("```py file=f{i}.py\n{i}\n```\n"));
    }
    let blocks = parse(doc.as_bytes(), &Limits::default(), &policy);
    assert_eq!(blocks.len(), 1001);
    assert!(blocks[..1000]
        .iter()
        .all(|b| b.status == BlockStatus::Written));
    assert_eq!(
        (blocks[1000].status, blocks[1000].reason.as_str()),
        (BlockStatus::Rejected, "too_many_blocks")
    );
    // A block of exactly 1 MiB is fine, 1 MiB + 1 is too_large.
    let body = "x".repeat((1 << 20) - 1) + "\n";
    let doc = format!("```txt file=ok.txt\n{body}```\n```txt file=big.txt\n{body}x\n```\n");
    let blocks = parse(doc.as_bytes(), &Limits::default(), &policy);
    assert_eq!(blocks[0].status, BlockStatus::Written);
    assert_eq!(blocks[0].bytes, 1 << 20);
    assert_eq!(
        (blocks[1].status, blocks[1].reason.as_str()),
        (BlockStatus::Rejected, "too_large")
    );
    // A document over 16 MiB is one too_large entry.
    let doc = vec![b'x'; (16 << 20) + 1];
    let blocks = parse(&doc, &Limits::default(), &policy);
    assert_eq!(blocks.len(), 1);
    assert_eq!(
        (blocks[0].status, blocks[0].reason.as_str(), blocks[0].bytes),
        (BlockStatus::Rejected, "too_large", (16 << 20) + 1)
    );
}
