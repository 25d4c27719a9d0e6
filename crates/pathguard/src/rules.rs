//! The syntax rules of a cairn relative path, checked in a fixed order: each rule runs over the whole path and the first failing rule is the reason.
//! Rejects, never rewrites: the accepted `SafePath` holds exactly the input text.

use unicode_normalization::{is_nfc, UnicodeNormalization};

use crate::{Reason, Rejection, SafePath};

/// Longest component, in UTF-8 bytes (NAME_MAX on Linux and most filesystems).
pub const MAX_COMPONENT_BYTES: usize = 255;
/// Longest path, in UTF-8 bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// Characters Windows forbids in names (besides `\` and `/`, which have their own rules).
const WINDOWS_FORBIDDEN: &[char] = &['<', '>', ':', '"', '|', '?', '*'];

/// Unicode general category Cf (format characters: zero-width, bidi controls, BOM, soft
/// hyphen, tags), Unicode 15.1. They are invisible, so a name could hide what it says.
const FORMAT_CHARS: &[(u32, u32)] = &[
    (0xAD, 0xAD),
    (0x600, 0x605),
    (0x61C, 0x61C),
    (0x6DD, 0x6DD),
    (0x70F, 0x70F),
    (0x890, 0x891),
    (0x8E2, 0x8E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
];

/// True for a Unicode format character (general category Cf).
pub fn is_format_char(c: char) -> bool {
    let c = u32::from(c);
    FORMAT_CHARS.iter().any(|&(lo, hi)| (lo..=hi).contains(&c))
}

/// Checks the syntax rules (everything but denylist and prefixes), in their fixed order.
pub fn validate(path: &str) -> Result<SafePath, Rejection> {
    let reject = |reason, message: String| Err(Rejection::new(reason, path, message));

    // C0, DEL and C1 controls (char::is_control is exactly category Cc).
    if let Some((at, c)) = path.char_indices().find(|(_, c)| c.is_control()) {
        return reject(
            Reason::InvalidChar,
            format!("contains the control character {} at byte {at}; remove it, names are plain printable text", code_point(c)),
        );
    }
    if path.starts_with('/') {
        return reject(
            Reason::AbsolutePath,
            "absolute paths are not allowed; drop the leading `/` and write the path relative to the project root (e.g. `docs/a.md`)".into(),
        );
    }
    if let [letter, b':', ..] = path.as_bytes() {
        if letter.is_ascii_alphabetic() {
            return reject(
                Reason::DriveLetter,
                format!("`{}:` is a drive prefix; write the path relative to the project root with `/` separators", char::from(*letter)),
            );
        }
    }
    if path.contains('\\') {
        let message = if path.starts_with("\\\\") {
            "UNC paths (`\\\\server\\share`) are not allowed; write the path relative to the project root with `/` separators"
        } else {
            "`\\` is not a path separator here; use `/` between components (e.g. `src/main.rs`)"
        };
        return reject(Reason::Backslash, message.into());
    }
    if let Some((at, c)) = path
        .char_indices()
        .find(|(_, c)| WINDOWS_FORBIDDEN.contains(c))
    {
        return reject(
            Reason::InvalidChar,
            format!("contains `{c}` at byte {at}, which is not allowed in file names (`<>:\"|?*` are forbidden on Windows); remove or replace it"),
        );
    }
    if let Some((at, c)) = path.char_indices().find(|(_, c)| is_format_char(*c)) {
        return reject(
            Reason::InvalidChar,
            format!("contains the invisible Unicode format character {} at byte {at}; remove it, it can hide what a name really says", code_point(c)),
        );
    }
    if path.split('/').any(|c| c == "..") {
        return reject(
            Reason::Traversal,
            "`..` components are not allowed; write the path relative to the project root without going up".into(),
        );
    }
    if path.ends_with('/') {
        return reject(
            Reason::DirectoryPath,
            "the path ends with `/`, which names a directory; name a file (e.g. `docs/notes.md`)"
                .into(),
        );
    }
    if path.is_empty() {
        return reject(
            Reason::EmptyComponent,
            "the path is empty; name a file relative to the project root (e.g. `docs/notes.md`)"
                .into(),
        );
    }
    if path.contains("//") {
        return reject(
            Reason::EmptyComponent,
            "contains an empty component (`//`); put a single `/` between names".into(),
        );
    }
    if path.split('/').any(|c| c == ".") {
        return reject(
            Reason::DotComponent,
            "`.` components are not allowed; drop them (write `a/b`, not `./a/b` or `a/./b`)"
                .into(),
        );
    }
    if let Some(long) = path.split('/').find(|c| c.len() > MAX_COMPONENT_BYTES) {
        return reject(
            Reason::PathTooLong,
            format!(
                "the name `{}` is {} bytes; each name may be at most {MAX_COMPONENT_BYTES} bytes (UTF-8), shorten it",
                excerpt(long),
                long.len()
            ),
        );
    }
    if path.len() > MAX_PATH_BYTES {
        return reject(
            Reason::PathTooLong,
            format!("the path is {} bytes; paths may be at most {MAX_PATH_BYTES} bytes (UTF-8), shorten it or nest less deeply", path.len()),
        );
    }
    if !is_nfc(path) {
        return reject(
            Reason::NotNormalized,
            format!(
                "is not in Unicode NFC form; write it NFC-normalised (as `{}`), e.g. `é` as U+00E9 rather than `e` + U+0301",
                excerpt(&path.nfc().collect::<String>())
            ),
        );
    }
    for component in path.split('/') {
        if let Some(device) = device_name(component) {
            return reject(
                Reason::ReservedName,
                format!(
                    "`{}` is the Windows device name `{device}` (reserved with any extension, in any case); rename it, e.g. `{device}_file`",
                    excerpt(component)
                ),
            );
        }
        if component.ends_with('.') || component.ends_with(' ') {
            return reject(
                Reason::ReservedName,
                format!(
                    "the name `{}` ends with a dot or a space, which Windows strips silently; remove the trailing character",
                    excerpt(component)
                ),
            );
        }
    }
    Ok(SafePath(path.to_owned()))
}

/// The Windows device a component names, if any: the part before the first `.`, with
/// trailing spaces ignored (as Windows does), compared case-insensitively.
fn device_name(component: &str) -> Option<String> {
    let stem = component
        .split('.')
        .next()
        .unwrap_or(component)
        .trim_end_matches(' ');
    let upper = stem.to_ascii_uppercase();
    let is_device = match upper.as_str() {
        "CON" | "PRN" | "AUX" | "NUL" | "CONIN$" | "CONOUT$" => true,
        _ => match upper
            .strip_prefix("COM")
            .or_else(|| upper.strip_prefix("LPT"))
        {
            // COM0-9 / LPT0-9, and the superscript digits Windows also maps (¹ ² ³).
            Some(digit) => {
                let mut chars = digit.chars();
                matches!(
                    (chars.next(), chars.next()),
                    (Some('0'..='9' | '¹' | '²' | '³'), None)
                )
            }
            None => false,
        },
    };
    is_device.then_some(upper)
}

/// Key under which two paths are "the same file" (NFC-normalised, case-folded), for
/// duplicate detection.
pub fn fold_key(path: &str) -> String {
    // Upper- then lowercasing approximates Unicode full case folding without a table
    // (`ß`/`SS`/`ss` and `ῲ`/`ὼι` meet); case mapping can produce combining marks
    // (U+0130 -> i + U+0307), so normalise again at the end.
    let nfc: String = path.nfc().collect();
    nfc.to_uppercase().to_lowercase().nfc().collect()
}

fn code_point(c: char) -> String {
    format!("U+{:04X}", u32::from(c))
}

/// At most 40 characters of `text`, for messages.
fn excerpt(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The one pattern of project ids, as users read it in errors and docs.
pub const PROJECT_ID_RULE: &str = "1-128 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit, and not a Windows device name (CON, NUL, COM1, ... with any extension)";

/// Whether `id` may name a project: `[A-Za-z0-9][A-Za-z0-9._-]{0,127}` and no Windows device
/// name. A project id is a directory name on every platform the data may be copied to, and
/// an argument in shells: no leading `.` (hidden, `.cairn`) or `-` (read as an option).
pub fn is_project_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.len() <= 128
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && device_name(id).is_none()
}
