//! `Policy`: denylist (case-folded, 8.3 aliases), allowed prefixes, narrowing.

#![allow(clippy::unwrap_used)] // tests may unwrap

use pathguard::{
    validate, validate_prefix, Policy, Reason, SafePath, DEFAULT_DENYLIST, MAX_PATH_BYTES,
};

fn policy(prefixes: &[&str]) -> Policy {
    Policy::from_strings(DEFAULT_DENYLIST, prefixes).unwrap()
}

#[track_caller]
fn refused(policy: &Policy, path: &str, reason: Reason) {
    match policy.check(path) {
        Ok(p) => panic!("{path:?} was accepted as {p:?}, expected {reason}"),
        Err(r) => assert_eq!(r.reason, reason, "{path:?}: {}", r.message),
    }
}

#[track_caller]
fn accepted(policy: &Policy, path: &str) {
    match policy.check(path) {
        Ok(p) => assert_eq!(p.as_str(), path),
        Err(r) => panic!("{path:?} refused: {r}"),
    }
}

#[test]
fn denied_names_match_case_folded_in_any_component() {
    let p = Policy::default();
    for path in [
        ".ssh",
        ".ssh/id_rsa",
        ".SSH/id",
        "home/.Ssh/x",
        "x/.Git/config",
        ".git",
        ".env",
        ".ENV",
        "a/.aws/credentials",
        ".gnupg/k",
        ".kube/config",
        ".docker/config.json",
    ] {
        refused(&p, path, Reason::Denied);
    }
    // Only whole components are denied.
    for path in [
        ".sshx",
        "ssh/x",
        ".github/workflows/ci.yml",
        ".gitignore",
        ".env.example",
        "my.git",
        "docs/.environment",
    ] {
        accepted(&p, path);
    }
}

#[test]
fn eight_dot_three_aliases_of_denied_names_are_denied() {
    let p = Policy::default();
    for path in [
        "SSH~1/x",
        "ssh~1",
        "SSH~2/known_hosts",
        "a/GNUPG~1/k",
        "DOCKER~1/config.json",
        "docker~12",
        "DOCKE~12",
        "SSH~123456",
        "GIT~1/config",
        "ENV~1",
        "KUBE~3",
        "AWS~1",
        "DO1A2B~1",
    ] {
        refused(&p, path, Reason::Denied);
    }
    for path in [
        "SSH~/x",
        "SSH~a",
        "SSH~1.TXT",
        "SSHX~1",
        "GNUP~1",
        "S~1",
        "X~1/a",
        "DOCKE~1",
    ] {
        accepted(&p, path);
    }
}

#[test]
fn denied_alias_of_a_name_with_extension_keeps_the_extension() {
    let p = Policy::from_strings([".npmrc.bak"], Vec::<String>::new()).unwrap();
    refused(&p, "NPMRC~1.BAK", Reason::Denied);
    refused(&p, ".NpmRc.Bak", Reason::Denied);
    accepted(&p, "NPMRC~1");
}

#[test]
fn syntax_rules_come_before_the_denylist() {
    let p = Policy::default();
    refused(&p, ".ssh/../x", Reason::Traversal);
    refused(&p, ".ssh/", Reason::DirectoryPath);
    refused(&p, ".git.", Reason::ReservedName);
    refused(&p, ".git:stream", Reason::InvalidChar);
}

#[test]
fn prefixes_match_whole_components() {
    let p = policy(&["docs", "workspace/"]);
    for path in [
        "docs",
        "docs/a.md",
        "docs/sub/b.md",
        "workspace/src/main.rs",
    ] {
        accepted(&p, path);
    }
    for path in [
        "docsx/a",
        "doc/a",
        "workspacex",
        "x/docs/a",
        "Docs/a",
        "README.md",
    ] {
        refused(&p, path, Reason::PrefixNotAllowed);
    }
    let r = p.check("docsx/a").unwrap_err();
    assert!(
        r.message.contains("`docs/`") && r.message.contains("`workspace/`"),
        "{}",
        r.message
    );
}

#[test]
fn denylist_comes_before_prefixes() {
    let p = policy(&["docs"]);
    refused(&p, "other/.git/x", Reason::Denied);
    refused(&p, "docs/.env", Reason::Denied);
}

#[test]
fn no_prefixes_allows_every_valid_path() {
    let p = policy(&[]);
    accepted(&p, "anything/at/all.txt");
    refused(&p, "../x", Reason::Traversal);
}

#[test]
fn prefix_trailing_slash_is_normalised_once() {
    assert_eq!(validate_prefix("docs/").unwrap().as_str(), "docs");
    assert_eq!(validate_prefix("docs/sub/").unwrap().as_str(), "docs/sub");
    assert_eq!(validate_prefix("docs").unwrap().as_str(), "docs");
    assert_eq!(
        validate_prefix("docs//").unwrap_err().reason,
        Reason::DirectoryPath
    );
    assert_eq!(
        validate_prefix("/").unwrap_err().reason,
        Reason::AbsolutePath
    );
    assert_eq!(
        validate_prefix("").unwrap_err().reason,
        Reason::EmptyComponent
    );
    assert_eq!(
        validate_prefix("../x/").unwrap_err().reason,
        Reason::Traversal
    );
    let r = Policy::from_strings(DEFAULT_DENYLIST, ["ok/", "/abs/"]).unwrap_err();
    assert_eq!((r.reason, r.path.as_str()), (Reason::AbsolutePath, "/abs/"));
}

#[test]
fn denylist_entries_must_be_single_valid_names() {
    assert_eq!(
        Policy::from_strings(["a/b"], [""; 0]).unwrap_err().reason,
        Reason::InvalidChar
    );
    assert_eq!(
        Policy::from_strings(["*.pem"], [""; 0]).unwrap_err().reason,
        Reason::InvalidChar
    );
    assert_eq!(
        Policy::from_strings([""], [""; 0]).unwrap_err().reason,
        Reason::EmptyComponent
    );
    let p = Policy::from_strings(["secrets"], [""; 0]).unwrap();
    assert_eq!(p.denylist(), ["secrets".to_owned()]);
    refused(&p, "a/SECRETS/b", Reason::Denied);
    accepted(&p, ".ssh/x"); // the default list is not implied
}

#[test]
fn narrow_accepts_prefixes_inside_the_policy() {
    let p = policy(&["docs", "workspace"]);
    let n = p
        .narrow(&["docs/sub/".to_owned(), "workspace".to_owned()])
        .unwrap();
    let got: Vec<&str> = n.allowed_prefixes().iter().map(SafePath::as_str).collect();
    assert_eq!(got, ["docs/sub", "workspace"]);
    accepted(&n, "docs/sub/a.md");
    refused(&n, "docs/other.md", Reason::PrefixNotAllowed);
    refused(&n, "workspace/.git/config", Reason::Denied); // the denylist is kept
}

#[test]
fn narrow_refuses_widening() {
    let p = policy(&["docs"]);
    for req in ["docsx", "workspace", "doc"] {
        let r = p.narrow(&[req.to_owned()]).unwrap_err();
        assert_eq!(r.reason, Reason::PrefixNotAllowed, "{req}");
        assert_eq!(r.path, req);
    }
    // One bad prefix refuses the whole request.
    assert_eq!(
        p.narrow(&["docs/a".to_owned(), "x".to_owned()])
            .unwrap_err()
            .reason,
        Reason::PrefixNotAllowed
    );
}

#[test]
fn narrow_refuses_invalid_prefixes_with_their_own_reason() {
    let p = policy(&["docs"]);
    assert_eq!(
        p.narrow(&["docs/../x".to_owned()]).unwrap_err().reason,
        Reason::Traversal
    );
    assert_eq!(
        p.narrow(&["/docs".to_owned()]).unwrap_err().reason,
        Reason::AbsolutePath
    );
    assert_eq!(
        p.narrow(&[String::new()]).unwrap_err().reason,
        Reason::EmptyComponent
    );
}

#[test]
fn narrow_on_an_open_policy_takes_any_valid_prefix() {
    let p = policy(&[]);
    let n = p.narrow(&["anything/".to_owned()]).unwrap();
    accepted(&n, "anything/x");
    refused(&n, "else/x", Reason::PrefixNotAllowed);
}

#[test]
fn empty_narrow_request_is_the_same_policy() {
    let p = policy(&["docs"]);
    let n = p.narrow(&[]).unwrap();
    assert_eq!(n.allowed_prefixes(), p.allowed_prefixes());
    assert_eq!(n.denylist(), p.denylist());
    let open = policy(&[]).narrow(&[]).unwrap();
    assert!(open.allowed_prefixes().is_empty());
}

#[test]
fn reason_words_round_trip() {
    assert_eq!(Reason::ALL.len(), 13);
    for r in Reason::ALL {
        assert_eq!(r.as_str().parse::<Reason>().unwrap(), r);
        assert_eq!(Reason::from_str_opt(r.as_str()), Some(r));
        assert_eq!(r.to_string(), r.as_str());
    }
    let words: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        words,
        [
            "invalid_char",
            "absolute_path",
            "drive_letter",
            "backslash",
            "traversal",
            "directory_path",
            "empty_component",
            "dot_component",
            "path_too_long",
            "not_normalized",
            "reserved_name",
            "denied",
            "prefix_not_allowed",
        ]
    );
    assert!("exists".parse::<Reason>().is_err());
    assert_eq!(Reason::from_str_opt("Traversal"), None);
}

#[test]
fn safe_path_helpers() {
    let p = validate("docs/sub/a.md").unwrap();
    assert_eq!(p.file_name(), "a.md");
    assert_eq!(p.parent().unwrap().as_str(), "docs/sub");
    assert_eq!(validate("a").unwrap().parent(), None);
    assert_eq!(p.components().collect::<Vec<_>>(), ["docs", "sub", "a.md"]);
    let long = validate(&"x".repeat(255)).unwrap();
    let mut path = long.clone();
    for _ in 0..3 {
        path = path.checked_join(&long).unwrap();
    }
    assert_eq!(path.as_str().len(), 1023);
    assert_eq!(
        path.checked_join(&long).unwrap_err().reason,
        Reason::PathTooLong
    );
    assert!(p.starts_with(&validate("docs").unwrap()));
    assert!(!validate("docsx/a")
        .unwrap()
        .starts_with(&validate("docs").unwrap()));
    assert_eq!("a/b".parse::<SafePath>().unwrap().as_str(), "a/b");
    assert_eq!(
        "a/../b".parse::<SafePath>().unwrap_err().reason,
        Reason::Traversal
    );
}

#[test]
fn a_hashed_alias_must_start_with_the_denied_names_first_two_characters() {
    let p = Policy::default();
    refused(&p, "SS1A2B~1", Reason::Denied);
    refused(&p, "gn0f3c~2/k", Reason::Denied);
    // Six characters, hex after the first two, but the start of no denied name.
    accepted(&p, "ZZ1A2B~1");
    accepted(&p, "QQ0000~1/x");
}

#[test]
fn aliases_drop_spaces_and_inner_dots_of_the_long_name() {
    let p = Policy::new(vec!["my docs".into(), "a.b.conf".into()], Vec::new());
    refused(&p, "MYDOCS~1", Reason::Denied);
    refused(&p, "AB~1.CON", Reason::Denied);
    accepted(&p, "AB~1");
}

#[test]
fn a_denied_name_with_no_alias_letters_matches_no_tilde_component() {
    // Nothing is left of "..." once dots are dropped: it has no 8.3 alias.
    let p = Policy::new(vec!["...".into()], Vec::new());
    accepted(&p, "~1");
    accepted(&p, "x/~12");
}

#[test]
fn configuration_errors_say_which_setting_is_wrong() {
    let err = Policy::from_strings(["../x"], Vec::<String>::new()).unwrap_err();
    assert!(
        err.message.starts_with("denylist entry: "),
        "{}",
        err.message
    );
    let err = validate_prefix("docs//").unwrap_err();
    assert!(
        err.message.starts_with("allowed prefix: "),
        "{}",
        err.message
    );
}

#[test]
fn a_join_of_exactly_the_limit_is_allowed() {
    let a = validate(&format!("{}/{}", "a".repeat(255), "b".repeat(255))).unwrap();
    let rest = |last: usize| {
        validate(&format!(
            "{}/{}/{}",
            "c".repeat(255),
            "d".repeat(200),
            "e".repeat(last)
        ))
        .unwrap()
    };
    // 511 + 1 + 512 = 1024 bytes: at the limit, allowed; one more byte is not.
    let joined = a.checked_join(&rest(55)).unwrap();
    assert_eq!(joined.as_str().len(), MAX_PATH_BYTES);
    assert_eq!(
        a.checked_join(&rest(56)).unwrap_err().reason,
        Reason::PathTooLong
    );
}

#[test]
fn a_safe_path_converts_to_its_text() {
    let p = validate("docs/a.md").unwrap();
    let as_ref: &str = p.as_ref();
    assert_eq!(as_ref, "docs/a.md");
    assert_eq!(String::from(p), "docs/a.md");
}

#[test]
fn messages_quote_the_offending_name_cut_to_40_characters() {
    let err = validate("docs/CON.txt").unwrap_err();
    assert!(err.message.contains("`CON.txt`"), "{}", err.message);
    let long = "n".repeat(300);
    let err = validate(&format!("d/{long}")).unwrap_err();
    assert!(
        err.message.contains(&format!("`{}…`", "n".repeat(40))),
        "{}",
        err.message
    );
}
