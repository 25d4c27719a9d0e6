//! Fuzz target: ingest's parser on arbitrary bytes must not panic, and what it returns must
//! hold together (content inside the input, digests right, counts consistent).
#![no_main]

use cairn_ingest::{parse, sha256_hex, BlockStatus, Limits, Manifest, Source};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|doc: &[u8]| {
    // Small limits so the limit paths are reached too; the first byte picks them.
    let limits = match doc.first() {
        Some(b) if b % 2 == 0 => Limits {
            max_block_bytes: u64::from(*b),
            max_blocks: u32::from(b % 7),
            max_document_bytes: 4096,
        },
        _ => Limits::default(),
    };
    let blocks = parse(doc, &limits, &pathguard::Policy::default());
    for (i, b) in blocks.iter().enumerate() {
        assert_eq!(b.index as usize, i);
        assert!(b.content.start <= b.content.end && b.content.end <= doc.len());
        let content = b.content_of(doc);
        assert_eq!(b.bytes, content.len() as u64);
        assert_eq!(b.sha256, sha256_hex(content));
        assert_eq!(b.status == BlockStatus::Written, b.reason.is_empty());
    }
    let source = Source {
        kind: "graph_runtime".into(),
        mode: "unknown".into(),
        doc_path: String::new(),
    };
    let m = Manifest::new("r", "n", source, &blocks);
    assert_eq!(
        m.summary.written + m.summary.skipped + m.summary.rejected,
        m.summary.total_blocks
    );
    assert_eq!(m.summary.total_blocks as usize, blocks.len());
});
