//! Properties of the path rules over generated input: what an accepted path can never
//! contain, determinism, idempotence, NFC, and prefix containment of `Policy::check`.

#![allow(clippy::unwrap_used)] // tests may unwrap

use pathguard::{fold_key, validate, Policy, Reason, SafePath, DEFAULT_DENYLIST};
use proptest::prelude::*;
use unicode_normalization::is_nfc;

/// Pieces that hit every rule: separators, dots, drive and UNC shapes, forbidden and
/// invisible characters, device names, denied names, decomposed accents, plain text.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z]{1,6}",
        2 => Just("/".to_owned()),
        2 => Just(".".to_owned()),
        1 => Just("..".to_owned()),
        1 => Just("\\".to_owned()),
        1 => Just("C:".to_owned()),
        1 => Just(":".to_owned()),
        1 => Just(" ".to_owned()),
        1 => Just("~1".to_owned()),
        1 => Just("%2e".to_owned()),
        1 => Just("\0".to_owned()),
        1 => Just("\u{200B}".to_owned()),
        1 => Just("\u{FEFF}".to_owned()),
        1 => Just("e\u{301}".to_owned()),
        1 => Just("\u{E9}".to_owned()),
        1 => Just("nul".to_owned()),
        1 => Just("COM1".to_owned()),
        1 => Just(".ssh".to_owned()),
        1 => Just(".Git".to_owned()),
        1 => Just("SSH".to_owned()),
        1 => Just("docs".to_owned()),
        1 => any::<char>().prop_map(String::from),
    ]
}

fn tricky_path() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::collection::vec(piece(), 0..12).prop_map(|p| p.concat()),
        1 => any::<String>(),
        1 => prop::collection::vec("[a-z]{200,260}", 1..6).prop_map(|c| c.join("/")),
    ]
}

/// Paths every rule accepts: components start with `x`, so none is a device name.
fn plain_path() -> impl Strategy<Value = String> {
    prop::collection::vec("x[a-z0-9_-]{0,10}(\\.[a-z]{1,4})?", 1..8).prop_map(|c| c.join("/"))
}

fn assert_safe(path: &SafePath) {
    let s = path.as_str();
    assert!(!s.starts_with('/'), "{s:?} leading /");
    assert!(!s.contains('\\'), "{s:?} backslash");
    let b = s.as_bytes();
    assert!(
        !(b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':'),
        "{s:?} drive prefix"
    );
    for c in s.split('/') {
        assert!(
            !c.is_empty() && c != "." && c != "..",
            "{s:?} has component {c:?}"
        );
    }
    assert!(s.len() <= 1024, "{s:?} too long");
    assert!(!s.chars().any(char::is_control), "{s:?} control char");
    assert!(is_nfc(s), "{s:?} not NFC");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn accepted_paths_hold_every_invariant(path in tricky_path()) {
        let first = validate(&path);
        // Deterministic.
        prop_assert_eq!(&first, &validate(&path));
        if let Ok(safe) = first {
            assert_safe(&safe);
            // Never rewritten, and idempotent.
            prop_assert_eq!(safe.as_str(), path.as_str());
            prop_assert_eq!(validate(safe.as_str()), Ok(safe.clone()));
        }
    }

    #[test]
    fn plain_paths_are_accepted_and_a_dot_dot_anywhere_is_traversal(
        path in plain_path(),
        at in any::<prop::sample::Index>(),
    ) {
        prop_assert_eq!(validate(&path).map(SafePath::into_string), Ok(path.clone()));
        let mut parts: Vec<&str> = path.split('/').collect();
        parts.insert(at.index(parts.len() + 1), "..");
        prop_assert_eq!(validate(&parts.join("/")).unwrap_err().reason, Reason::Traversal);
    }

    #[test]
    fn check_accepts_only_paths_beneath_the_prefixes(
        path in prop_oneof![tricky_path(), plain_path(), plain_path().prop_map(|p| format!("docs/{p}"))],
        prefixes in prop::collection::vec(prop_oneof![Just("docs"), Just("docs/"), Just("xa"), Just("xa/xb")], 0..3),
    ) {
        let policy = Policy::from_strings(DEFAULT_DENYLIST, &prefixes).unwrap();
        let checked = policy.check(&path);
        prop_assert_eq!(&checked, &policy.check(&path));
        match checked {
            Ok(safe) => {
                assert_safe(&safe);
                prop_assert!(
                    policy.allowed_prefixes().is_empty()
                        || policy.allowed_prefixes().iter().any(|p| {
                            safe.as_str() == p.as_str() || safe.as_str().starts_with(&format!("{}/", p.as_str()))
                        }),
                    "{:?} accepted outside {:?}", safe, prefixes
                );
                for c in safe.components() {
                    prop_assert!(!DEFAULT_DENYLIST.iter().any(|d| fold_key(d) == fold_key(c)), "{:?} denied", c);
                }
            }
            Err(r) => {
                // check refuses what validate refuses, with the same reason.
                if let Err(v) = validate(&path) {
                    prop_assert_eq!(r, v);
                } else {
                    prop_assert!(matches!(r.reason, Reason::Denied | Reason::PrefixNotAllowed), "{:?}", r);
                }
            }
        }
    }

    #[test]
    fn narrowing_never_widens(
        requested in prop::collection::vec(prop_oneof![plain_path(), plain_path().prop_map(|p| format!("docs/{p}/"))], 1..3),
        path in plain_path().prop_map(|p| format!("docs/{p}")),
    ) {
        let server = Policy::from_strings(DEFAULT_DENYLIST, ["docs"]).unwrap();
        if let Ok(narrow) = server.narrow(&requested) {
            if narrow.check(&path).is_ok() {
                prop_assert!(server.check(&path).is_ok());
            }
        } else {
            prop_assert!(requested.iter().any(|r| !r.starts_with("docs/")));
        }
    }

    #[test]
    fn fold_key_ignores_case_and_normalisation(path in tricky_path()) {
        let key = fold_key(&path);
        prop_assert_eq!(fold_key(&key), key.clone());
        prop_assert_eq!(fold_key(&path.to_uppercase()), fold_key(&path.to_lowercase()));
        prop_assert!(is_nfc(&key));
    }
}
