//! `validate` and `fold_key`: every reason with several inputs, the order of reasons, and
//! the edge cases docs/paths.md decides.

#![allow(clippy::unwrap_used)] // tests may unwrap

use pathguard::{fold_key, validate, Reason};

#[track_caller]
fn refused(path: &str, reason: Reason) {
    match validate(path) {
        Ok(p) => panic!("{path:?} was accepted as {p:?}, expected {reason}"),
        Err(r) => {
            assert_eq!(r.reason, reason, "{path:?}: {}", r.message);
            assert_eq!(r.path, path);
            assert!(!r.message.is_empty());
        }
    }
}

#[track_caller]
fn accepted(path: &str) {
    match validate(path) {
        Ok(p) => assert_eq!(p.as_str(), path, "accepted paths are never rewritten"),
        Err(r) => panic!("{path:?} refused: {r}"),
    }
}

#[test]
fn plain_relative_paths_are_accepted_unchanged() {
    for p in [
        "a",
        "docs/notes.md",
        "workspace/src/main.rs",
        "a/b/c/d/e.txt",
        ".gitignore",
        "..a",
        "a..b",
        "%2e%2e/x",
        "%2e%2e",
        "x/%2F/y",
        "naïve/café.txt",
        "日本語/ファイル.md",
        "console.log",
        "nullable.rs",
        "com10",
        "lpt",
        "auxiliary/x",
        "con_file",
        "a b/c d",
        " leading-space",
        "~tilde",
        "a~1",
        "line\u{2028}sep",
        "private\u{E000}use",
    ] {
        accepted(p);
    }
}

#[test]
fn control_characters_are_invalid_char() {
    for p in [
        "a\0b",
        "\0",
        "a/\u{1}",
        "tab\there",
        "new\nline",
        "cr\r",
        "del\u{7f}",
        "c1\u{85}x",
        "c1\u{9f}",
    ] {
        refused(p, Reason::InvalidChar);
    }
}

#[test]
fn leading_slash_is_absolute_path() {
    for p in ["/", "/etc/passwd", "/a", "//server/share", "/../x"] {
        refused(p, Reason::AbsolutePath);
    }
}

#[test]
fn drive_prefix_is_drive_letter() {
    for p in ["C:foo", "c:/windows", "C:\\Windows", "z:", "Q:a/b"] {
        refused(p, Reason::DriveLetter);
    }
    // Not a drive: the colon is just a forbidden character.
    refused("1:a", Reason::InvalidChar);
    refused("ab:c", Reason::InvalidChar);
}

#[test]
fn any_backslash_is_backslash() {
    for p in [
        "a\\b",
        "\\\\server\\share",
        "\\a",
        "a\\",
        "..\\x",
        "docs/a\\..\\b",
    ] {
        refused(p, Reason::Backslash);
    }
}

#[test]
fn windows_forbidden_and_format_characters_are_invalid_char() {
    for p in [
        "a<b", "a>b", "ab:c", "a\"b", "a|b", "what?", "*.rs", "x/y:z",
    ] {
        refused(p, Reason::InvalidChar);
    }
    for c in [
        '\u{200B}',
        '\u{200E}',
        '\u{200F}',
        '\u{202A}',
        '\u{202E}',
        '\u{2066}',
        '\u{2069}',
        '\u{FEFF}',
        '\u{AD}',
        '\u{E0041}',
    ] {
        refused(&format!("a{c}b.txt"), Reason::InvalidChar);
    }
    refused("zero\u{200B}width/x", Reason::InvalidChar);
    refused("evil\u{202E}txt.exe", Reason::InvalidChar);
}

#[test]
fn dot_dot_component_is_traversal() {
    for p in ["..", "../x", "a/../b", "a/..", "a/b/../../..", "../"] {
        refused(p, Reason::Traversal);
    }
}

#[test]
fn trailing_slash_is_directory_path() {
    for p in ["a/", "docs/sub/", "./", "a//"] {
        refused(p, Reason::DirectoryPath);
    }
}

#[test]
fn empty_path_or_double_slash_is_empty_component() {
    for p in ["", "a//b", "a///b", "x/y//z.txt"] {
        refused(p, Reason::EmptyComponent);
    }
}

#[test]
fn single_dot_component_is_dot_component() {
    for p in [".", "./a", "a/./b", "a/.", "./.hidden"] {
        refused(p, Reason::DotComponent);
    }
}

#[test]
fn long_component_or_path_is_path_too_long() {
    let name255 = "a".repeat(255);
    accepted(&name255);
    refused(&"a".repeat(256), Reason::PathTooLong);
    refused(&format!("dir/{}/x", "b".repeat(256)), Reason::PathTooLong);
    // 128 x 'é' (2 bytes each) = 256 bytes although only 128 characters.
    refused(&"é".repeat(128), Reason::PathTooLong);

    // 1024 bytes exactly is fine, 1025 is not.
    let path1024 = format!("{0}/{0}/{0}/{0}/{1}", "c".repeat(200), "d".repeat(220));
    assert_eq!(path1024.len(), 1024);
    accepted(&path1024);
    let path1025 = format!("{path1024}e");
    assert_eq!(path1025.len(), 1025);
    refused(&path1025, Reason::PathTooLong);
}

#[test]
fn decomposed_text_is_not_normalized() {
    refused("cafe\u{301}.txt", Reason::NotNormalized); // NFD é
    refused("docs/e\u{301}", Reason::NotNormalized);
    refused("\u{212B}ngstrom", Reason::NotNormalized); // ANGSTROM SIGN, NFC is U+00C5
    refused("\u{212A}elvin", Reason::NotNormalized); // KELVIN SIGN, NFC is K
    accepted("caf\u{e9}.txt");
}

#[test]
fn windows_device_names_are_reserved_name() {
    for p in [
        "nul",
        "NUL",
        "Nul.txt",
        "con",
        "CON.tar.gz",
        "con.tar.gz",
        "prn",
        "aux.c",
        "com1.py",
        "COM9",
        "com0",
        "lpt9",
        "LPT1.txt",
        "com\u{b9}",
        "LPT\u{b2}.log",
        "com\u{b3}",
        "docs/nul",
        "a/Aux/b",
        "nul .txt",
        "conin$",
        "CONOUT$.x",
    ] {
        refused(p, Reason::ReservedName);
    }
}

#[test]
fn trailing_dot_or_space_is_reserved_name() {
    for p in [
        "a.",
        "a ",
        "dir./x",
        "dir /x",
        "x/file.txt.",
        "x/file.txt ",
        "...",
        ".../x",
    ] {
        refused(p, Reason::ReservedName);
    }
}

#[test]
fn earlier_rule_wins_when_two_are_broken() {
    // control char + absolute
    refused("/a\0", Reason::InvalidChar);
    // absolute + backslash + traversal
    refused("/..\\x", Reason::AbsolutePath);
    // drive + backslash
    refused("C:\\x", Reason::DriveLetter);
    // backslash + forbidden char
    refused("a\\b:c", Reason::Backslash);
    // forbidden char + traversal
    refused("../a?", Reason::InvalidChar);
    // format char + traversal
    refused("../\u{200B}", Reason::InvalidChar);
    // traversal + trailing slash + empty component
    refused("a//../", Reason::Traversal);
    // trailing slash + empty component
    refused("a//b/", Reason::DirectoryPath);
    // empty component + dot component
    refused(".//a", Reason::EmptyComponent);
    // dot component + too long
    refused(&format!("./{}", "a".repeat(300)), Reason::DotComponent);
    // too long + not NFC
    refused(&format!("e\u{301}{}", "a".repeat(300)), Reason::PathTooLong);
    // not NFC + reserved
    refused("nul/e\u{301}", Reason::NotNormalized);
    // reserved device in an early component, trailing dot later
    refused("nul/a.", Reason::ReservedName);
}

#[test]
fn messages_say_what_to_fix() {
    let r = validate("a/../b").unwrap_err();
    assert!(
        r.message.contains("`..`") && r.message.contains("relative to the project root"),
        "{}",
        r.message
    );
    let r = validate("a\u{200B}").unwrap_err();
    assert!(r.message.contains("U+200B"), "{}", r.message);
    let r = validate("COM1.py").unwrap_err();
    assert!(r.message.contains("COM1"), "{}", r.message);
    let r = validate(&"x".repeat(300)).unwrap_err();
    assert!(
        r.message.contains("300 bytes") && r.message.contains("255"),
        "{}",
        r.message
    );
    // Display carries reason and an escaped path.
    let shown = validate("a\0").unwrap_err().to_string();
    assert!(
        shown.contains("invalid_char") && shown.contains("\\0"),
        "{shown}"
    );
}

#[test]
fn validate_is_idempotent_on_accepted_paths() {
    for p in ["a", "docs/x.md", "%2e%2e/x", "日本/x"] {
        let once = validate(p).unwrap();
        assert_eq!(validate(once.as_str()).unwrap(), once);
    }
}

#[test]
fn fold_key_equates_case_and_normalisation_forms() {
    assert_eq!(fold_key("Docs/README.md"), fold_key("docs/readme.md"));
    assert_eq!(fold_key("caf\u{e9}"), fold_key("cafe\u{301}"));
    assert_eq!(fold_key("CAF\u{c9}"), fold_key("cafe\u{301}"));
    assert_eq!(fold_key("\u{212A}"), fold_key("k"));
    assert_ne!(fold_key("a/b"), fold_key("a/c"));
    assert_ne!(fold_key("ab"), fold_key("a/b"));
    assert_eq!(fold_key("STRASSE"), fold_key("straße"));
    let k = fold_key("İstanbul/Straße");
    assert_eq!(fold_key(&k), k, "fold_key is idempotent");
}

/// Project ids: a directory name on every platform and a safe shell argument.
#[test]
fn project_ids_follow_their_one_pattern() {
    let longest = format!("a{}", "b".repeat(127));
    for ok in [
        "p",
        "p1",
        "0",
        "My.Project_2-x",
        longest.as_str(),
        "console",
        "CONX",
        "com10",
    ] {
        assert!(pathguard::is_project_id(ok), "{ok:?} is a project id");
    }
    let too_long = format!("a{}", "b".repeat(128));
    for bad in [
        "",
        too_long.as_str(),
        ".cairn",
        "-rf",
        "_p",
        "a/b",
        "a b",
        "a\\b",
        "é",
        "p\u{0}",
        "a:b",
        "CON",
        "nul.txt",
        "com1",
        "LPT9.log",
    ] {
        assert!(
            !pathguard::is_project_id(bad),
            "{bad:?} is not a project id"
        );
    }
}
