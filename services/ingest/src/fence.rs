//! Fence mechanics and the strict header (grammar).
//!
//! One pass over the document's lines (memchr for the line breaks, a few byte compares per
//! line, no regex). Every CommonMark fenced code block is tracked, so text inside any fence is
//! content and never opens a block. Only fences whose info string contains `=` are reported:
//! the strict `` ```lang file=path `` form as a file block, anything else as a malformed
//! header. This module owns the grammar only; it never looks at paths beyond the header form.

use std::ops::Range;

/// A UTF-8 byte order mark; ignored at the very start of a document.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One recorded fence, in document order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced {
    /// What the opening line says.
    pub header: Header,
    /// Byte range of the content in the document: the lines between the fences, each with its
    /// own line ending. For an unterminated fence: everything after the opening line.
    pub content: Range<usize>,
    /// False when the document ended before a closing fence.
    pub terminated: bool,
}

/// The opening line of a recorded fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header {
    /// The strict form `` ```<lang> file=<path> ``.
    File { lang: String, declared_file: String },
    /// A fence with `=` in its info string that is not exactly the strict form. `lang` and
    /// `declared_file` are best-effort readings for the manifest (see [`malformed_fields`]).
    Malformed {
        lang: String,
        declared_file: String,
        problem: &'static str,
    },
}

/// A fence opening or closing line: its character, run length, indentation and the rest.
struct FenceLine<'a> {
    ch: u8,
    len: usize,
    indent: usize,
    /// The bytes after the fence characters, line ending removed.
    rest: &'a [u8],
}

/// Scans `doc` and returns every recorded fence (info string containing `=`) in order.
///
/// Only lines that start (after at most 3 spaces) with a fence character can open or close a
/// fence, so the scan jumps with memchr from one such character to the next (inside a fence:
/// only its own character) and looks back at most 3 bytes for the line start. Content without
/// fence characters is crossed at memchr speed; every other line is never looked at.
pub fn scan(doc: &[u8]) -> Vec<Fenced> {
    scan_at_most(doc, usize::MAX)
}

/// [`scan`], stopping once `most` fences are recorded and the last of them is closed (or the
/// document ends).
pub fn scan_at_most(doc: &[u8], most: usize) -> Vec<Fenced> {
    let mut found: Vec<Fenced> = Vec::new();
    let start = if doc.starts_with(BOM) { BOM.len() } else { 0 };
    // The fence we are inside, if any: (char, length, recorded entry index or None).
    let mut open: Option<(u8, usize, Option<usize>)> = None;
    let mut from = start;
    while let Some(pos) = next_candidate_line(doc, start, from, open.map(|o| o.0)) {
        let end = match memchr::memchr(b'\n', &doc[pos..]) {
            Some(i) => pos + i + 1,
            None => doc.len(),
        };
        let line = &doc[pos..end];
        match open {
            Some((ch, len, entry)) => {
                if is_closing(line, ch, len) {
                    if let Some(f) = entry.and_then(|i| found.get_mut(i)) {
                        f.content.end = pos;
                        f.terminated = true;
                    }
                    open = None;
                }
            }
            None => {
                if let Some(fence) = opening(line) {
                    let entry = if fence.rest.contains(&b'=') {
                        found.push(Fenced {
                            header: header_of(line, &fence),
                            content: end..doc.len(),
                            terminated: false,
                        });
                        Some(found.len() - 1)
                    } else {
                        None
                    };
                    open = Some((fence.ch, fence.len, entry));
                }
            }
        }
        from = end;
        if found.len() >= most && open.is_none() {
            break;
        }
    }
    found
}

/// The start of the next line at or after `from` whose first byte after 0-3 spaces is `ch`
/// (or a backtick or tilde when `ch` is None). `start` is where the first line begins.
fn next_candidate_line(doc: &[u8], start: usize, mut from: usize, ch: Option<u8>) -> Option<usize> {
    while from < doc.len() {
        let rest = &doc[from..];
        let hit = from
            + match ch {
                Some(c) => memchr::memchr(c, rest)?,
                None => memchr::memchr2(b'`', b'~', rest)?,
            };
        let mut line_start = hit;
        while line_start > start && hit - line_start < 3 && doc[line_start - 1] == b' ' {
            line_start -= 1;
        }
        if line_start == start || doc[line_start - 1] == b'\n' {
            return Some(line_start);
        }
        from = hit + 1;
    }
    None
}

/// The line without its ending (`\n`, and a `\r` before it).
fn strip_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Reads a fence line: 0-3 spaces, then 3+ backticks or tildes (CommonMark).
fn fence_line(line: &[u8]) -> Option<FenceLine<'_>> {
    let indent = line.iter().take(4).take_while(|&&b| b == b' ').count();
    if indent > 3 {
        return None;
    }
    let ch = *line.get(indent)?;
    if ch != b'`' && ch != b'~' {
        return None;
    }
    let len = line[indent..].iter().take_while(|&&b| b == ch).count();
    if len < 3 {
        return None;
    }
    Some(FenceLine {
        ch,
        len,
        indent,
        rest: strip_eol(&line[indent + len..]),
    })
}

/// An opening fence. CommonMark: a backtick fence's info string may not contain backticks
/// (such a line is paragraph text, not a fence).
fn opening(line: &[u8]) -> Option<FenceLine<'_>> {
    let fence = fence_line(line)?;
    if fence.ch == b'`' && fence.rest.contains(&b'`') {
        return None;
    }
    Some(fence)
}

/// A closing fence for an opener of `ch` x `len`: same char, at least as long, 0-3 spaces of
/// indentation, then only spaces/tabs (a CR before the line break is part of the ending).
fn is_closing(line: &[u8], ch: u8, len: usize) -> bool {
    // Fast path: most content lines start with neither a space nor the fence char.
    match line.first() {
        Some(&b) if b == ch || b == b' ' => {}
        _ => return false,
    }
    match fence_line(line) {
        Some(f) => f.ch == ch && f.len >= len && only_blank(f.rest),
        None => false,
    }
}

/// True when `bytes` holds nothing but spaces, tabs and CRs.
fn only_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| matches!(b, b' ' | b'\t' | b'\r'))
}

/// `[A-Za-z0-9_+.-]`: the characters of a lang token.
fn is_lang_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'.' | b'-')
}

/// Quotation marks a path token may not contain: ASCII and the common typographic ones
/// (`file=“a.py”` must not create a file named `“a.py”`).
fn is_quote(c: char) -> bool {
    matches!(
        c,
        '"' | '\''
            | '\u{00AB}'
            | '\u{00BB}'
            | '\u{2018}'..='\u{201F}'
            | '\u{2039}'
            | '\u{203A}'
            | '\u{300C}'..='\u{300F}'
            | '\u{FF02}'
            | '\u{FF07}'
    )
}

/// A character that may not appear in the path token.
fn is_token_breaker(c: char) -> bool {
    c.is_whitespace() || is_quote(c) || c == '`' || c == '='
}

/// The header of a recorded fence (its info string contains `=`).
fn header_of(line: &[u8], fence: &FenceLine<'_>) -> Header {
    match strict_header(line, fence) {
        Ok((lang, declared_file)) => Header::File {
            lang,
            declared_file,
        },
        Err(problem) => {
            let (lang, declared_file) = malformed_fields(fence.rest);
            Header::Malformed {
                lang,
                declared_file,
                problem,
            }
        }
    }
}

/// The tiny matcher for the one accepted form: at column 0, 3+ backticks, then
/// `<lang>`, exactly one space, `file=`, one path token, then only spaces/tabs/CR. The line
/// must be valid UTF-8. Returns (lang, path) or what is wrong.
fn strict_header(line: &[u8], fence: &FenceLine<'_>) -> Result<(String, String), &'static str> {
    if fence.ch != b'`' {
        return Err("a tilde fence cannot declare a file; use backticks");
    }
    if fence.indent != 0 {
        return Err("an indented fence cannot declare a file; start the fence at column 0");
    }
    let line = std::str::from_utf8(strip_eol(line)).map_err(|_| "the header is not valid UTF-8")?;
    let rest = &line[fence.len..];
    let lang_len = rest.bytes().take_while(|&b| is_lang_byte(b)).count();
    if lang_len == 0 {
        return Err("missing language: write ```<lang> file=<path>");
    }
    let (lang, rest) = rest.split_at(lang_len);
    let Some(rest) = rest.strip_prefix(' ') else {
        return Err("the language must be followed by exactly one space and file=<path>");
    };
    if rest.starts_with([' ', '\t']) {
        return Err("exactly one space is allowed between the language and file=");
    }
    let Some(rest) = rest.strip_prefix("file=") else {
        return Err(
            "the only accepted attribute is file=<path> (not path=, filename=, output=, ...)",
        );
    };
    let token_len = rest.find(is_token_breaker).unwrap_or(rest.len());
    if token_len == 0 {
        return Err("file= needs one unquoted path token");
    }
    let (path, tail) = rest.split_at(token_len);
    if !tail.bytes().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
        return Err(
            "only one unquoted path token may follow file= (no quotes, no other attributes)",
        );
    }
    Ok((lang.to_owned(), path.to_owned()))
}

/// Best-effort (lang, declared_file) of a malformed header for the manifest: the leading
/// lang-like word of the info string (unless it is a `key=value`), and the value of `file=` if
/// present, else of the first `key=` attribute, as written up to the next whitespace.
fn malformed_fields(info: &[u8]) -> (String, String) {
    let info = String::from_utf8_lossy(info);
    let info = info.trim_start();
    let first = info.split_whitespace().next().unwrap_or("");
    let lang = if !first.is_empty() && first.bytes().all(is_lang_byte) {
        first.to_owned()
    } else {
        String::new()
    };
    let value_after = |key_end: usize| -> String {
        let v = &info[key_end..];
        v.split(char::is_whitespace).next().unwrap_or("").to_owned()
    };
    let declared = match info.find("file=") {
        Some(i) => value_after(i + "file=".len()),
        None => info
            .find('=')
            .map(|i| value_after(i + 1))
            .unwrap_or_default(),
    };
    (lang, declared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The straightforward line-by-line scan, the reference the fast scan is checked against.
    fn scan_by_lines(doc: &[u8]) -> Vec<Fenced> {
        let mut found: Vec<Fenced> = Vec::new();
        let start = if doc.starts_with(BOM) { BOM.len() } else { 0 };
        // The fence we are inside, if any: (char, length, recorded entry index or None).
        let mut open: Option<(u8, usize, Option<usize>)> = None;
        let mut pos = start;
        while pos < doc.len() {
            let end = match memchr::memchr(b'\n', &doc[pos..]) {
                Some(i) => pos + i + 1,
                None => doc.len(),
            };
            let line = &doc[pos..end];
            match open {
                Some((ch, len, entry)) => {
                    if is_closing(line, ch, len) {
                        if let Some(f) = entry.and_then(|i| found.get_mut(i)) {
                            f.content.end = pos;
                            f.terminated = true;
                        }
                        open = None;
                    }
                }
                None => {
                    if let Some(fence) = opening(line) {
                        let entry = if fence.rest.contains(&b'=') {
                            found.push(Fenced {
                                header: header_of(line, &fence),
                                content: end..doc.len(),
                                terminated: false,
                            });
                            Some(found.len() - 1)
                        } else {
                            None
                        };
                        open = Some((fence.ch, fence.len, entry));
                    }
                }
            }
            pos = end;
        }
        found
    }

    fn fence_heavy() -> impl Strategy<Value = Vec<u8>> {
        let line = prop_oneof![
            Just("```".to_owned()),
            Just("````".to_owned()),
            Just("~~~".to_owned()),
            Just(" ```".to_owned()),
            Just("   ~~~~".to_owned()),
            Just("    ```".to_owned()),
            Just("```py file=a.py".to_owned()),
            Just("  ```py file=a.py".to_owned()),
            Just("~~~ a=b".to_owned()),
            Just("x `y` ```".to_owned()),
            Just(String::new()),
            "[ a`~=\r]{0,8}",
        ];
        (prop::collection::vec(line, 0..40), any::<bool>()).prop_map(|(lines, bom)| {
            let mut doc = if bom {
                "\u{feff}".to_owned()
            } else {
                String::new()
            };
            doc.push_str(&lines.join("\n"));
            doc.into_bytes()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]
        #[test]
        fn fast_scan_equals_the_line_by_line_reference(doc in fence_heavy()) {
            prop_assert_eq!(scan(&doc), scan_by_lines(&doc));
        }

        #[test]
        fn fast_scan_equals_the_reference_on_bytes(doc in prop::collection::vec(prop::sample::select(b" `~\n=ab\r".to_vec()), 0..300)) {
            prop_assert_eq!(scan(&doc), scan_by_lines(&doc));
        }
    }

    fn file(lang: &str, path: &str) -> Header {
        Header::File {
            lang: lang.into(),
            declared_file: path.into(),
        }
    }

    fn contents(doc: &[u8]) -> Vec<&[u8]> {
        scan(doc).iter().map(|f| &doc[f.content.clone()]).collect()
    }

    #[test]
    fn strict_block_is_found_with_exact_content() {
        let doc = b"intro\n```python file=src/a.py\nprint(1)\n```\ntail\n";
        let found = scan(doc);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].header, file("python", "src/a.py"));
        assert!(found[0].terminated);
        assert_eq!(&doc[found[0].content.clone()], b"print(1)\n");
    }

    #[test]
    fn plain_fences_are_tracked_but_not_recorded() {
        let doc = b"```\n```py file=a.py\nx\n```\n";
        assert!(
            scan(doc).is_empty(),
            "a header inside a plain fence is content"
        );
    }

    #[test]
    fn longer_fence_carries_shorter_fences() {
        let doc = b"````md file=README.md\n```sh\nls\n```\n````\n";
        assert_eq!(contents(doc), vec![&b"```sh\nls\n```\n"[..]]);
    }

    #[test]
    fn closing_fence_rules() {
        // Text after the closer: not a closer.
        let doc = b"```py file=a.py\nx\n``` not\n```  \t\ny\n";
        let found = scan(doc);
        assert_eq!(&doc[found[0].content.clone()], b"x\n``` not\n");
        // Indented 3 spaces closes; 4 does not.
        let doc = b"```py file=a.py\n    ```\n   ```\n";
        assert_eq!(contents(doc), vec![&b"    ```\n"[..]]);
        // Tilde does not close backticks; shorter does not close longer.
        let doc = b"````py file=a.py\n~~~~\n```\n`````\n";
        assert_eq!(contents(doc), vec![&b"~~~~\n```\n"[..]]);
    }

    #[test]
    fn malformed_headers_are_recorded() {
        for header in [
            "```python file=\"a.py\"",
            "```python path=a.py",
            "```python filename=a.py",
            "```python output=a.py",
            "```python file=a.py mode=755",
            "``` file=a.py",
            "```file=a.py",
            "```python  file=a.py",
            "```python\tfile=a.py",
            "~~~python file=a.py",
            " ```python file=a.py",
            "```python file=",
            "```python file='a.py'",
            "```python file=\u{201C}a.py\u{201D}",
            "```python file=a=b.py",
        ] {
            let doc = format!("{header}\nx\n```\n~~~\n");
            let found = scan(doc.as_bytes());
            assert_eq!(found.len(), 1, "{header:?}");
            assert!(
                matches!(found[0].header, Header::Malformed { .. }),
                "{header:?} gave {:?}",
                found[0].header
            );
        }
    }

    #[test]
    fn info_with_backtick_is_not_a_fence() {
        // CommonMark: a backtick fence's info string cannot contain a backtick.
        assert!(scan(b"```py file=`a.py`\nx\n").is_empty());
    }

    #[test]
    fn unterminated_block_runs_to_the_end() {
        let doc = b"```py file=a.py\nx\ny";
        let found = scan(doc);
        assert!(!found[0].terminated);
        assert_eq!(&doc[found[0].content.clone()], b"x\ny");
    }

    #[test]
    fn crlf_bom_and_eof_without_newline() {
        let doc = b"\xEF\xBB\xBF```py file=a.py\r\nx\r\n```";
        let found = scan(doc);
        assert_eq!(found[0].header, file("py", "a.py"));
        assert_eq!(&doc[found[0].content.clone()], b"x\r\n");
        assert!(found[0].terminated);
    }

    #[test]
    fn trailing_blanks_after_header_are_allowed() {
        let found = scan(b"```c++ file=a.cc \t\r\n```\n");
        assert_eq!(found[0].header, file("c++", "a.cc"));
        assert_eq!(found[0].content.len(), 0);
    }

    #[test]
    fn invalid_utf8_header_is_malformed_but_content_is_bytes() {
        let doc = b"```py file=a\xFF.py\nx\n```\n```py file=b.py\n\xFE\xFF\n```\n";
        let found = scan(doc);
        assert!(matches!(found[0].header, Header::Malformed { .. }));
        assert_eq!(found[1].header, file("py", "b.py"));
        assert_eq!(&doc[found[1].content.clone()], b"\xFE\xFF\n");
    }

    #[test]
    fn malformed_fields_are_readable() {
        assert_eq!(
            malformed_fields(b"python path=src/a.py"),
            ("python".into(), "src/a.py".into())
        );
        assert_eq!(
            malformed_fields(b"python file=\"a b.py\""),
            ("python".into(), "\"a".into())
        );
        assert_eq!(
            malformed_fields(b" file=a.py"),
            (String::new(), "a.py".into())
        );
    }
}
