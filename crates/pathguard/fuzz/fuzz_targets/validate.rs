//! Fuzzes `validate`, `fold_key` and `Policy::check` with arbitrary bytes and asserts what an
//! accepted path can never be (docs/paths.md).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pathguard::{fold_key, validate, Policy, Reason, SafePath, DEFAULT_DENYLIST};
use unicode_normalization::is_nfc;

fn assert_safe(safe: &SafePath, input: &str) {
    let s = safe.as_str();
    assert_eq!(s, input, "accepted paths are never rewritten");
    assert!(!s.starts_with('/'));
    assert!(!s.contains('\\'));
    let b = s.as_bytes();
    assert!(!(b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':'));
    for c in s.split('/') {
        assert!(!c.is_empty() && c != "." && c != "..", "component {c:?}");
        assert!(c.len() <= 255);
    }
    assert!(s.len() <= 1024);
    assert!(!s
        .chars()
        .any(|c| c.is_control() || pathguard::is_format_char(c)));
    assert!(is_nfc(s));
}

fuzz_target!(|data: &[u8]| {
    let (selector, rest) = match data.split_first() {
        Some((first, rest)) => (*first, rest),
        None => (0, data),
    };
    let input = String::from_utf8_lossy(rest);

    let first = validate(&input);
    assert_eq!(first, validate(&input), "validate is deterministic");
    if let Ok(safe) = &first {
        assert_safe(safe, &input);
        assert_eq!(
            validate(safe.as_str()).as_ref(),
            Ok(safe),
            "validate is idempotent"
        );
    }

    let key = fold_key(&input);
    assert_eq!(fold_key(&key), key, "fold_key is idempotent");

    let prefixes: &[&str] = match selector % 4 {
        0 => &[],
        1 => &["docs"],
        2 => &["docs/", "workspace"],
        _ => &["a/b"],
    };
    let Ok(policy) = Policy::from_strings(DEFAULT_DENYLIST, prefixes) else {
        panic!("fixed prefixes are valid");
    };
    match policy.check(&input) {
        Ok(safe) => {
            assert_safe(&safe, &input);
            assert!(
                policy.allowed_prefixes().is_empty()
                    || policy
                        .allowed_prefixes()
                        .iter()
                        .any(|p| safe.starts_with(p))
            );
            for c in safe.components() {
                assert!(!DEFAULT_DENYLIST.iter().any(|d| fold_key(d) == fold_key(c)));
            }
        }
        Err(r) => match &first {
            Err(v) => assert_eq!(&r, v, "check refuses what validate refuses"),
            Ok(_) => assert!(matches!(
                r.reason,
                Reason::Denied | Reason::PrefixNotAllowed
            )),
        },
    }
});
