//! Terminal colours in program output, rendered safely: SGR sequences (`ESC [ … m`) become
//! spans whose classes come from a fixed set (bold, the 8 + 8 foreground colours); every other
//! escape sequence and control character is dropped. The text itself is only ever escaped
//! markup (maud), never HTML.

use maud::{html, Markup};

/// The style a run of text is drawn with.
#[derive(Clone, Copy, Default, PartialEq, Debug)]
pub(super) struct Style {
    /// 0-15: the terminal's colours (8-15 bright); None: the default.
    fg: Option<u8>,
    bold: bool,
}

impl Style {
    /// Classes of the stylesheet, from a fixed set.
    fn class(self) -> String {
        let mut c = String::new();
        if let Some(f) = self.fg {
            c.push_str(FG[usize::from(f.min(15))]);
        }
        if self.bold {
            if !c.is_empty() {
                c.push(' ');
            }
            c.push_str("ansi-b");
        }
        c
    }

    fn apply(&mut self, params: &str) {
        let codes: Vec<u16> = if params.is_empty() {
            vec![0]
        } else {
            params.split(';').map(|p| p.parse().unwrap_or(0)).collect()
        };
        let mut i = 0;
        while i < codes.len() {
            match codes[i] {
                0 => *self = Style::default(),
                1 => self.bold = true,
                22 => self.bold = false,
                c @ 30..=37 => self.fg = Some((c - 30) as u8),
                39 => self.fg = None,
                c @ 90..=97 => self.fg = Some((c - 90 + 8) as u8),
                // 256 colours and true colour: skip their arguments, keep the default.
                38 => {
                    i += if codes.get(i + 1) == Some(&5) { 2 } else { 4 };
                    self.fg = None;
                }
                48 => i += if codes.get(i + 1) == Some(&5) { 2 } else { 4 },
                _ => {}
            }
            i += 1;
        }
    }
}

const FG: [&str; 16] = [
    "ansi-0", "ansi-1", "ansi-2", "ansi-3", "ansi-4", "ansi-5", "ansi-6", "ansi-7", "ansi-8",
    "ansi-9", "ansi-10", "ansi-11", "ansi-12", "ansi-13", "ansi-14", "ansi-15",
];

/// `text` as runs of (style, text); `style` carries over from the previous line and is
/// updated for the next.
pub(super) fn runs(text: &str, style: &mut Style) -> Vec<(Style, String)> {
    let mut out: Vec<(Style, String)> = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            match chars.peek() {
                Some('[') => {
                    chars.next();
                    let mut params = String::new();
                    let mut end = None;
                    for d in chars.by_ref() {
                        if ('\u{40}'..='\u{7e}').contains(&d) {
                            end = Some(d);
                            break;
                        }
                        params.push(d);
                    }
                    if end == Some('m') {
                        if !cur.is_empty() {
                            out.push((*style, std::mem::take(&mut cur)));
                        }
                        style.apply(&params);
                    }
                }
                // OSC (a title, a link): up to BEL or ESC \.
                Some(']') => {
                    while let Some(d) = chars.next() {
                        if d == '\u{7}' || (d == '\u{1b}' && chars.next_if_eq(&'\\').is_some()) {
                            break;
                        }
                    }
                }
                _ => {
                    chars.next();
                }
            }
            continue;
        }
        if c.is_control() && c != '\n' && c != '\t' {
            continue;
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        out.push((*style, cur));
    }
    out
}

/// Text without any escape sequence (search and downloads of plain text).
pub(super) fn strip(text: &str) -> String {
    runs(text, &mut Style::default())
        .into_iter()
        .map(|(_, t)| t)
        .collect()
}

/// `text` as markup: a span per coloured run, plain text otherwise.
pub(super) fn render(text: &str, style: &mut Style) -> Markup {
    let runs = runs(text, style);
    html! {
        @for (s, t) in &runs {
            @if *s == Style::default() { (t) } @else { span class=(s.class()) { (t) } }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn colours_become_classes_and_other_escapes_go() {
        let mut st = Style::default();
        let m = render(
            "\u{1b}[1;31mred <b>\u{1b}[0m plain \u{1b}]0;title\u{7}\u{1b}[2Kend\r",
            &mut st,
        );
        assert_eq!(
            m.into_string(),
            "<span class=\"ansi-1 ansi-b\">red &lt;b&gt;</span> plain end"
        );
        // A colour left open carries over to the next line.
        let mut st = Style::default();
        render("\u{1b}[32mgreen", &mut st);
        assert_eq!(
            render("still", &mut st).into_string(),
            "<span class=\"ansi-2\">still</span>"
        );
        assert_eq!(strip("\u{1b}[38;5;200mx\u{1b}[m"), "x");
    }
}
