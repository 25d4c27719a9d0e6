//! The grammar and path rules of DESIGN.md "ingest", one document per rule, run three ways:
//! the pure parser, `Parse` (dry run) and `Ingest` over gRPC into a real artifact-store. For
//! every written block the bytes on disk equal the expected bytes and the manifest's sha256 is
//! their digest; the workspace holds exactly the expected files and nothing else.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use cairn_proto::v1::Level;
use common::{files_under, request, sha256_hex, Ingest, Store};

/// Reasons only the store can find (a dry run reports such blocks as written).
const STORE_SIDE: &[&str] = &[
    "exists",
    "kept",
    "symlink_in_path",
    "not_a_file",
    "prefix_not_allowed",
];

/// One expected manifest entry.
#[derive(Clone)]
struct E {
    status: &'static str,
    reason: &'static str,
    declared: String,
    /// For written blocks: the workspace-relative path and the bytes expected there.
    written: Option<(String, Vec<u8>)>,
}

fn w(declared: &str, content: &[u8]) -> E {
    E {
        status: "written",
        reason: "",
        declared: declared.into(),
        written: Some((declared.into(), content.to_vec())),
    }
}
fn s(reason: &'static str, declared: &str) -> E {
    E {
        status: "skipped",
        reason,
        declared: declared.into(),
        written: None,
    }
}
fn r(reason: &'static str, declared: &str) -> E {
    E {
        status: "rejected",
        reason,
        declared: declared.into(),
        written: None,
    }
}

/// What is in the workspace before the ingest.
enum Prepare {
    Nothing,
    File(&'static str, &'static [u8]),
    Dir(&'static str),
    /// A symlink at the path pointing to a directory outside the project.
    SymlinkToOutsideDir(&'static str),
    /// A symlink at the path pointing to a file outside the project.
    SymlinkToOutsideFile(&'static str),
}

struct Case {
    name: &'static str,
    doc: Vec<u8>,
    expect: Vec<E>,
    prepare: Prepare,
    overwrite: bool,
}

fn case(name: &'static str, doc: impl Into<Vec<u8>>, expect: Vec<E>) -> Case {
    Case {
        name,
        doc: doc.into(),
        expect,
        prepare: Prepare::Nothing,
        overwrite: false,
    }
}

/// Limits of the table's ingest service (small, so the limit cases stay small).
fn limits() -> cairn_ingest::Limits {
    cairn_ingest::Limits {
        max_block_bytes: 4096,
        max_blocks: 20,
        max_document_bytes: 64 << 10,
    }
}

fn block(header: &str, body: &str) -> String {
    format!("{header}\n{body}```\n")
}

fn cases() -> Vec<Case> {
    let nfc = "caf\u{e9}.py";
    let nfd = "cafe\u{301}.py";
    let long = format!("{}.py", "a".repeat(253)); // 256-byte component
    let big = "x".repeat(5000) + "\n";
    let mut many = String::new();
    for i in 0..25 {
        many.push_str(&block(&format!("```py file=m{i}.py"), &format!("{i}\n")));
    }
    let mut many_expect: Vec<E> = (0..20)
        .map(|i| w(&format!("m{i}.py"), format!("{i}\n").as_bytes()))
        .collect();
    many_expect.extend((20..25).map(|i| r("too_many_blocks", &format!("m{i}.py"))));
    let huge_doc = format!(
        "{}\n{}",
        block("```py file=a.py", "x\n"),
        "y".repeat(70 << 10)
    );

    let mut cases = vec![
        // --- the accepted form ---
        case(
            "simple block",
            "Here:\n```python file=src/main.py\nprint('hi')\n```\nDone.\n",
            vec![w("src/main.py", b"print('hi')\n")],
        ),
        case(
            "two blocks in nested dirs",
            block("```python file=pkg/mod/a.py", "A = 1\n")
                + "text\n"
                + &block("```toml file=pyproject.toml", "[x]\n"),
            vec![w("pkg/mod/a.py", b"A = 1\n"), w("pyproject.toml", b"[x]\n")],
        ),
        case(
            "lang characters _+.-",
            "```objective-c++_3.1 file=a.mm\nx\n```\n",
            vec![w("a.mm", b"x\n")],
        ),
        case(
            "unicode NFC path",
            "```py file=donn\u{e9}es/\u{e9}t\u{e9}.py\n# \u{e9}\n```\n",
            vec![w("donn\u{e9}es/\u{e9}t\u{e9}.py", "# \u{e9}\n".as_bytes())],
        ),
        case(
            "percent is literal",
            "```py file=%2e%2e/a.py\nx\n```\n",
            vec![w("%2e%2e/a.py", b"x\n")],
        ),
        case(
            "trailing blanks after the header",
            "```py file=a.py  \t\nx\n```\n",
            vec![w("a.py", b"x\n")],
        ),
        // --- fences inside fences ---
        case(
            "4-backtick block carries 3-backtick fences",
            "````markdown file=README.md\n# Demo\n```sh\npip install demo\n```\n````\n",
            vec![w("README.md", b"# Demo\n```sh\npip install demo\n```\n")],
        ),
        case(
            "5-backtick block carries a 4-backtick header line as content",
            "`````md file=doc.md\n````py file=inner.py\nx\n````\n`````\n",
            vec![w("doc.md", b"````py file=inner.py\nx\n````\n")],
        ),
        case(
            "header inside a plain fence is content",
            "```\n```py file=a.py\nx\n```\n",
            vec![],
        ),
        case(
            "header inside a tilde fence is content",
            "~~~\n```py file=a.py\nx\n```\n~~~\n```py file=b.py\ny\n```\n",
            vec![w("b.py", b"y\n")],
        ),
        case(
            "header inside a plain 4-backtick fence is content",
            "````text\n```py file=a.py\nx\n```\n````\n",
            vec![],
        ),
        case(
            "tilde fence with file= is malformed and its content is not a block",
            "~~~py file=a.py\n```py file=b.py\nx\n```\n~~~\n",
            vec![s("malformed_header", "a.py")],
        ),
        // --- malformed headers (refused outright) ---
        case(
            "double-quoted path",
            "```py file=\"a.py\"\nx\n```\n",
            vec![s("malformed_header", "\"a.py\"")],
        ),
        case(
            "single-quoted path",
            "```py file='a.py'\nx\n```\n",
            vec![s("malformed_header", "'a.py'")],
        ),
        case(
            "typographic quotes",
            "```py file=\u{201c}a.py\u{201d}\nx\n```\n",
            vec![s("malformed_header", "\u{201c}a.py\u{201d}")],
        ),
        case(
            "path= key",
            "```py path=a.py\nx\n```\n",
            vec![s("malformed_header", "a.py")],
        ),
        case(
            "filename= key",
            "```py filename=a.py\nx\n```\n",
            vec![s("malformed_header", "a.py")],
        ),
        case(
            "output= key",
            "```py output=a.py\nx\n```\n",
            vec![s("malformed_header", "a.py")],
        ),
        case(
            "several attributes",
            "```py file=a.py mode=755\nx\n```\n",
            vec![s("malformed_header", "a.py")],
        ),
        case(
            "missing lang",
            "``` file=a.py\nx\n```\n",
            vec![s("malformed_header", "a.py")],
        ),
        case(
            "missing lang, no space",
            "```file=a.py\nx\n```\n",
            vec![s("malformed_header", "a.py")],
        ),
        case(
            "two spaces",
            "```py  file=a.py\nx\n```\n",
            vec![s("malformed_header", "a.py")],
        ),
        case(
            "tab instead of space",
            "```py\tfile=a.py\nx\n```\n",
            vec![s("malformed_header", "a.py")],
        ),
        case(
            "empty file=",
            "```py file=\nx\n```\n",
            vec![s("malformed_header", "")],
        ),
        case(
            "= inside the path",
            "```py file=a=b.py\nx\n```\n",
            vec![s("malformed_header", "a=b.py")],
        ),
        case(
            "indented opener (1 space)",
            " ```py file=a.py\nx\n```\n",
            vec![s("malformed_header", "a.py")],
        ),
        case(
            "indented opener (3 spaces)",
            "   ```py file=a.py\nx\n   ```\n",
            vec![s("malformed_header", "a.py")],
        ),
        case(
            "4-space indent is indented code, not a fence",
            "    ```py file=a.py\n    x\n\n```py file=b.py\ny\n```\n",
            vec![w("b.py", b"y\n")],
        ),
        case(
            "backtick in a backtick info string: not a fence (CommonMark)",
            "```py file=`a.py`\nx\n```\n```py file=b.py\ny\n```\n",
            vec![],
        ),
        case(
            "plain fence without = is not recorded",
            "```python\nprint(1)\n```\n",
            vec![],
        ),
        case(
            "prose only: nothing to ingest",
            "Please create main.py with a hello world.\n",
            vec![],
        ),
        case(
            "invalid UTF-8 in the header",
            b"```py file=a\xff.py\nx\n```\n".to_vec(),
            vec![s("malformed_header", "a\u{fffd}.py")],
        ),
        // --- closing fences ---
        case(
            "closer with trailing spaces closes",
            "```py file=a.py\nx\n```   \t\ny\n",
            vec![w("a.py", b"x\n")],
        ),
        case(
            "closer with text after is content",
            "```py file=a.py\nx\n``` not a closer\n```\n",
            vec![w("a.py", b"x\n``` not a closer\n")],
        ),
        case(
            "closer indented 3 spaces closes, 4 does not",
            "```py file=a.py\n    ```\nx\n   ```\n",
            vec![w("a.py", b"    ```\nx\n")],
        ),
        case(
            "shorter closer does not close",
            "````py file=a.py\n```\n````\n",
            vec![w("a.py", b"```\n")],
        ),
        case(
            "tilde closer does not close backticks",
            "```py file=a.py\n~~~\n```\n",
            vec![w("a.py", b"~~~\n")],
        ),
        case(
            "longer closer closes",
            "```py file=a.py\nx\n`````\n",
            vec![w("a.py", b"x\n")],
        ),
        // --- bytes ---
        case(
            "CRLF stays CRLF",
            "```py file=a.py\r\nline1\r\nline2\r\n```\r\n",
            vec![w("a.py", b"line1\r\nline2\r\n")],
        ),
        case(
            "leading BOM ignored",
            "\u{feff}```py file=a.py\nx\n```\n",
            vec![w("a.py", b"x\n")],
        ),
        case(
            "BOM inside content kept",
            "```py file=a.py\n\u{feff}x\n```\n",
            vec![w("a.py", "\u{feff}x\n".as_bytes())],
        ),
        case(
            "lone CR kept",
            "```py file=a.py\nx\ry\n```\n",
            vec![w("a.py", b"x\ry\n")],
        ),
        case(
            "empty body = empty file",
            "```py file=empty.py\n```\n",
            vec![w("empty.py", b"")],
        ),
        case(
            "no newline after the closer at EOF",
            "```py file=a.py\nx\n```",
            vec![w("a.py", b"x\n")],
        ),
        case(
            "invalid UTF-8 content is byte-exact",
            b"```bin file=a.bin\n\xff\xfe\x00\x01\n```\n".to_vec(),
            vec![w("a.bin", b"\xff\xfe\x00\x01\n")],
        ),
        // --- unterminated ---
        case(
            "unterminated final block",
            "```py file=a.py\nx\n",
            vec![s("unterminated_fence", "a.py")],
        ),
        case(
            "unterminated without newline",
            "```py file=a.py\nx",
            vec![s("unterminated_fence", "a.py")],
        ),
        case(
            "good block then an unterminated one",
            "```py file=a.py\nx\n```\n```py file=b.py\ny\n",
            vec![w("a.py", b"x\n"), s("unterminated_fence", "b.py")],
        ),
        // --- duplicates ---
        case(
            "same path twice: last wins",
            "```py file=a.py\nfirst\n```\n```py file=a.py\nsecond\n```\n",
            vec![s("superseded", "a.py"), w("a.py", b"second\n")],
        ),
        case(
            "case variant: last wins",
            "```py file=Src/A.py\nfirst\n```\n```py file=src/a.py\nsecond\n```\n",
            vec![s("superseded", "Src/A.py"), w("src/a.py", b"second\n")],
        ),
        case(
            "NFD then NFC: the NFD one keeps its refusal, the NFC one is written",
            format!("```py file={nfd}\nfirst\n```\n```py file={nfc}\nsecond\n```\n"),
            vec![r("not_normalized", nfd), w(nfc, b"second\n")],
        ),
        // Only blocks that would be written compete for a path: a refused or skipped later
        // block never supersedes a valid earlier one.
        case(
            "NFC then NFD: the NFD one is not_normalized and the NFC one is written",
            format!("```py file={nfc}\nfirst\n```\n```py file={nfd}\nsecond\n```\n"),
            vec![w(nfc, b"first\n"), r("not_normalized", nfd)],
        ),
        case(
            "valid then a case variant that is too large: the valid one is written",
            format!(
                "```py file=a.py\nfirst\n```\n{}",
                block("```py file=A.py", &big)
            ),
            vec![w("a.py", b"first\n"), r("too_large", "A.py")],
        ),
        case(
            "valid then the same path unterminated: the valid one is written",
            "```py file=a.py\nfirst\n```\n```py file=a.py\nsecond\n",
            vec![w("a.py", b"first\n"), s("unterminated_fence", "a.py")],
        ),
        case(
            "two valid around a refused one: the last valid one wins",
            format!(
                "```py file={nfc}\nfirst\n```\n```py file={nfd}\nbad\n```\n```py file={nfc}\nthird\n```\n"
            ),
            vec![
                s("superseded", nfc),
                r("not_normalized", nfd),
                w(nfc, b"third\n"),
            ],
        ),
        // --- path rules, in DESIGN.md's order ---
        case(
            "control character",
            "```py file=a\u{1}.py\nx\n```\n",
            vec![r("invalid_char", "a\u{1}.py")],
        ),
        case(
            "absolute path",
            "```py file=/etc/passwd\nx\n```\n",
            vec![r("absolute_path", "/etc/passwd")],
        ),
        case(
            "drive letter",
            "```py file=C:/x.py\nx\n```\n",
            vec![r("drive_letter", "C:/x.py")],
        ),
        case(
            "drive letter before backslash",
            "```py file=C:\\x.py\nx\n```\n",
            vec![r("drive_letter", "C:\\x.py")],
        ),
        case(
            "backslash",
            "```py file=src\\a.py\nx\n```\n",
            vec![r("backslash", "src\\a.py")],
        ),
        case(
            "windows-forbidden character",
            "```py file=a?.py\nx\n```\n",
            vec![r("invalid_char", "a?.py")],
        ),
        case(
            "format character",
            "```py file=a\u{200b}.py\nx\n```\n",
            vec![r("invalid_char", "a\u{200b}.py")],
        ),
        case(
            "traversal",
            "```py file=../evil.py\nx\n```\n",
            vec![r("traversal", "../evil.py")],
        ),
        case(
            "traversal inside",
            "```py file=a/../../evil.py\nx\n```\n",
            vec![r("traversal", "a/../../evil.py")],
        ),
        case(
            "directory path",
            "```py file=src/\nx\n```\n",
            vec![r("directory_path", "src/")],
        ),
        case(
            "empty component",
            "```py file=a//b.py\nx\n```\n",
            vec![r("empty_component", "a//b.py")],
        ),
        case(
            "dot component",
            "```py file=./a.py\nx\n```\n",
            vec![r("dot_component", "./a.py")],
        ),
        case(
            "component too long",
            format!("```py file={long}\nx\n```\n"),
            vec![r("path_too_long", &long)],
        ),
        case(
            "reserved device name",
            "```txt file=CON.txt\nx\n```\n",
            vec![r("reserved_name", "CON.txt")],
        ),
        case(
            "trailing dot",
            "```py file=a.py.\nx\n```\n",
            vec![r("reserved_name", "a.py.")],
        ),
        case(
            "denylist",
            "```txt file=.ssh/authorized_keys\nx\n```\n",
            vec![r("denied", ".ssh/authorized_keys")],
        ),
        case(
            "denylist case-folded",
            "```txt file=app/.ENV\nx\n```\n",
            vec![r("denied", "app/.ENV")],
        ),
        case(
            "denylist .git",
            "```sh file=.git/hooks/pre-commit\nx\n```\n",
            vec![r("denied", ".git/hooks/pre-commit")],
        ),
        // --- limits ---
        case(
            "block over max_block_bytes",
            block("```txt file=big.txt", &big) + &block("```py file=small.py", "x\n"),
            vec![r("too_large", "big.txt"), w("small.py", b"x\n")],
        ),
        case("more blocks than max_blocks", many, many_expect),
        case(
            "document over max_document_bytes",
            huge_doc,
            vec![r("too_large", "")],
        ),
    ];

    // --- what the store finds ---
    cases.push(Case {
        prepare: Prepare::File("a.py", b"old\n"),
        ..case(
            "existing file a person wrote, no overwrite: kept",
            "```py file=a.py\nnew\n```\n",
            vec![r("kept", "a.py")],
        )
    });
    cases.push(Case {
        prepare: Prepare::File("a.py", b"same\n"),
        ..case(
            "existing identical file: written (unchanged)",
            "```py file=a.py\nsame\n```\n",
            vec![w("a.py", b"same\n")],
        )
    });
    cases.push(Case {
        prepare: Prepare::File("a.py", b"old\n"),
        overwrite: true,
        ..case(
            "existing file, overwrite=true: replaced",
            "```py file=a.py\nnew\n```\n",
            vec![w("a.py", b"new\n")],
        )
    });
    cases.push(Case {
        prepare: Prepare::SymlinkToOutsideDir("link"),
        ..case(
            "symlink planted on the way",
            "```py file=link/evil.py\nx\n```\n```py file=ok.py\ny\n```\n",
            vec![r("symlink_in_path", "link/evil.py"), w("ok.py", b"y\n")],
        )
    });
    cases.push(Case {
        prepare: Prepare::SymlinkToOutsideFile("target.py"),
        ..case(
            "symlink planted at the target",
            "```py file=target.py\nx\n```\n",
            vec![r("symlink_in_path", "target.py")],
        )
    });
    cases.push(Case {
        prepare: Prepare::Dir("dir.py"),
        ..case(
            "directory at the target",
            "```py file=dir.py\nx\n```\n",
            vec![r("not_a_file", "dir.py")],
        )
    });
    cases.push(case(
        "a file where a later block needs a directory",
        "```txt file=a\nx\n```\n```txt file=a/b.txt\ny\n```\n",
        vec![w("a", b"x\n"), r("not_a_file", "a/b.txt")],
    ));
    cases
}

fn prepare(
    store: &Store,
    project: &str,
    prep: &Prepare,
    outside: &Path,
) -> BTreeMap<String, Vec<u8>> {
    let ws = store.workspace(project);
    std::fs::create_dir_all(&ws).unwrap();
    let mut expected = BTreeMap::new();
    match prep {
        Prepare::Nothing => {}
        Prepare::File(path, bytes) => {
            std::fs::write(ws.join(path), bytes).unwrap();
            expected.insert((*path).to_owned(), bytes.to_vec());
        }
        Prepare::Dir(path) => std::fs::create_dir_all(ws.join(path)).unwrap(),
        Prepare::SymlinkToOutsideDir(path) => {
            std::os::unix::fs::symlink(outside, ws.join(path)).unwrap();
            expected.insert(
                (*path).to_owned(),
                format!("-> {}", outside.display()).into_bytes(),
            );
        }
        Prepare::SymlinkToOutsideFile(path) => {
            let target = outside.join("outside.py");
            std::fs::write(&target, b"outside\n").unwrap();
            std::os::unix::fs::symlink(&target, ws.join(path)).unwrap();
            expected.insert(
                (*path).to_owned(),
                format!("-> {}", target.display()).into_bytes(),
            );
        }
    }
    expected
}

/// (status, reason, declared) of a manifest's artifacts.
fn triples(manifest: &serde_json::Value) -> Vec<(String, String, String)> {
    manifest["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["status"].as_str().unwrap().to_owned(),
                a["reason"].as_str().unwrap().to_owned(),
                a["declared_file"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn expected_triples(expect: &[E], dry_run: bool) -> Vec<(String, String, String)> {
    expect
        .iter()
        .map(|e| {
            if dry_run && STORE_SIDE.contains(&e.reason) {
                ("written".to_owned(), String::new(), e.declared.clone())
            } else {
                (e.status.to_owned(), e.reason.to_owned(), e.declared.clone())
            }
        })
        .collect()
}

#[test]
fn the_table_has_at_least_forty_documents() {
    assert!(cases().len() >= 40, "{} cases", cases().len());
}

#[test]
fn pure_parser_matches_the_table() {
    let config = cairn_ingest::Config::default();
    for c in cases() {
        let blocks = cairn_ingest::parse(&c.doc, &limits(), &config.policy());
        let got: Vec<_> = blocks
            .iter()
            .map(|b| {
                (
                    b.status.as_str().to_owned(),
                    b.reason.clone(),
                    b.declared_file.clone(),
                )
            })
            .collect();
        assert_eq!(got, expected_triples(&c.expect, true), "case {:?}", c.name);
        for (b, e) in blocks.iter().zip(&c.expect) {
            let content = b.content_of(&c.doc);
            assert_eq!(b.sha256, sha256_hex(content), "case {:?}", c.name);
            assert_eq!(b.bytes, content.len() as u64, "case {:?}", c.name);
            if let Some((path, bytes)) = &e.written {
                assert_eq!(content, &bytes[..], "case {:?}", c.name);
                assert_eq!(
                    b.workspace_path,
                    format!("workspace/{path}"),
                    "case {:?}",
                    c.name
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_over_grpc_against_a_real_store() {
    let store = Store::start().await;
    let outside = tempfile::tempdir().unwrap();
    let mut config = common::config(&store.addr());
    let l = limits();
    (
        config.max_block_bytes,
        config.max_blocks,
        config.max_document_bytes,
    ) = (l.max_block_bytes, l.max_blocks, l.max_document_bytes);
    let mut ingest = Ingest::start(config).await;

    for (i, c) in cases().into_iter().enumerate() {
        let project = format!("p{i}");
        let run = format!("run-{i}");
        let mut expected_files = prepare(&store, &project, &c.prepare, outside.path());
        let mut req = request(&project, &run, &c.doc);
        req.overwrite = c.overwrite;

        // Dry run first: nothing may change.
        let dry = ingest.client.parse(req.clone()).await.unwrap().into_inner();
        let dry_manifest: serde_json::Value = serde_json::from_str(&dry.manifest_json).unwrap();
        assert_eq!(
            triples(&dry_manifest),
            expected_triples(&c.expect, true),
            "dry run of {:?}",
            c.name
        );
        assert_eq!(dry.manifest_path, "", "case {:?}", c.name);
        assert_eq!(
            store.workspace_files(&project),
            expected_files,
            "dry run wrote something: {:?}",
            c.name
        );

        let reply = ingest.client.ingest(req).await.unwrap().into_inner();
        assert!(reply.enabled);
        let manifest: serde_json::Value = serde_json::from_str(&reply.manifest_json).unwrap();
        assert_eq!(
            triples(&manifest),
            expected_triples(&c.expect, false),
            "case {:?}: {:#?}",
            c.name,
            reply.errors
        );

        // Every written block: bytes on disk = expected bytes, sha256 = their digest.
        for (a, e) in manifest["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .zip(&c.expect)
        {
            if let Some((path, bytes)) = &e.written {
                let on_disk = std::fs::read(store.workspace(&project).join(path)).unwrap();
                assert_eq!(&on_disk, bytes, "case {:?}: {path}", c.name);
                assert_eq!(a["sha256"], sha256_hex(&on_disk), "case {:?}", c.name);
                assert_eq!(a["bytes"], on_disk.len() as u64, "case {:?}", c.name);
                assert_eq!(
                    a["workspace_path"],
                    format!("workspace/{path}"),
                    "case {:?}",
                    c.name
                );
                expected_files.insert(path.clone(), bytes.clone());
            }
        }
        // ... and nothing else appeared in the workspace, nothing escaped through a symlink.
        assert_eq!(
            store.workspace_files(&project),
            expected_files,
            "case {:?}",
            c.name
        );
        assert!(
            files_under(outside.path())
                .keys()
                .all(|k| k == "outside.py"),
            "case {:?} wrote outside",
            c.name
        );

        // Summary = per-status counts; level by the counts.
        let count = |st: &str| c.expect.iter().filter(|e| e.status == st).count() as u64;
        assert_eq!(manifest["summary"]["total_blocks"], c.expect.len() as u64);
        assert_eq!(
            manifest["summary"]["written"],
            count("written"),
            "case {:?}",
            c.name
        );
        assert_eq!(
            manifest["summary"]["skipped"],
            count("skipped"),
            "case {:?}",
            c.name
        );
        assert_eq!(
            manifest["summary"]["rejected"],
            count("rejected"),
            "case {:?}",
            c.name
        );
        let level = if count("rejected") > 0 {
            Level::Error
        } else if count("written") == 0
            || c.expect
                .iter()
                .any(|e| e.reason == "malformed_header" || e.reason == "unterminated_fence")
        {
            Level::Warning
        } else {
            Level::Info
        };
        assert_eq!(
            reply.level(),
            level,
            "case {:?}: {:?}",
            c.name,
            reply.errors
        );

        // The stored manifest is the reply's manifest.
        assert_eq!(
            reply.manifest_path,
            format!(".cairn/runs/{run}/ingest/n1.json")
        );
        let stored =
            std::fs::read_to_string(store.project(&project).join(&reply.manifest_path)).unwrap();
        assert_eq!(stored, reply.manifest_json, "case {:?}", c.name);

        // Events: started, one per block, then completed (failed only for the oversized document).
        let events = store.events(&project, &run);
        let kinds: Vec<&str> = events
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .filter(|t| t.starts_with("ingest."))
            .collect();
        let mut expected_kinds = vec!["ingest.started".to_owned()];
        expected_kinds.extend(
            c.expect
                .iter()
                .map(|e| format!("ingest.block.{}", e.status)),
        );
        expected_kinds.push(
            if c.name == "document over max_document_bytes" {
                "ingest.failed"
            } else {
                "ingest.completed"
            }
            .to_owned(),
        );
        assert_eq!(kinds, expected_kinds, "case {:?}", c.name);
        // Never content in events.
        let text = String::from_utf8_lossy(&store.events_text(&project, &run)).into_owned();
        for e in &c.expect {
            if let Some((_, bytes)) = &e.written {
                if bytes.len() >= 8 {
                    assert!(
                        !text.contains(String::from_utf8_lossy(bytes).trim()),
                        "content in events: {:?}",
                        c.name
                    );
                }
            }
        }
    }
    ingest.server.stop().await;
}
