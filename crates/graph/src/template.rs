//! Templates in graph fields: `{{run_id}}`, `{{vars.x}}`, `{{nodes.<id>.<field>}}` and, inside a
//! map body, `{{item}}`, `{{item.<field>}}`, `{{index}}`. `\{{` is a literal `{{`.
//! Parsing is syntax only; whether a reference exists is checked by `graph::validate`, so an
//! unknown reference is an error at submit time, never a surprise at run time.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// A reference inside `{{ }}` (and a bare operand of an expression).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ref {
    /// `run_id`
    RunId,
    /// `vars.<name>` or, for a sandbox_run `store_output`, `vars.<name>.<field>...`
    Var { name: String, path: Vec<String> },
    /// `nodes.<id>.<field>[.<sub>...]`
    Node {
        id: String,
        field: String,
        path: Vec<String>,
    },
    /// `item[.<field>...]` (map bodies only)
    Item { path: Vec<String> },
    /// `index` (map bodies only)
    Index,
}

impl fmt::Display for Ref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tail = |path: &[String]| -> String { path.iter().map(|p| format!(".{p}")).collect() };
        match self {
            Ref::RunId => write!(f, "run_id"),
            Ref::Var { name, path } => write!(f, "vars.{name}{}", tail(path)),
            Ref::Node { id, field, path } => write!(f, "nodes.{id}.{field}{}", tail(path)),
            Ref::Item { path } => write!(f, "item{}", tail(path)),
            Ref::Index => write!(f, "index"),
        }
    }
}

fn is_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Ref {
    /// Parses a dotted reference (`nodes.build.path`); the error says what is wrong.
    pub fn parse(text: &str) -> Result<Ref, String> {
        let parts: Vec<&str> = text.split('.').collect();
        if let Some(bad) = parts.iter().find(|p| !is_segment(p)) {
            return Err(format!(
                "`{text}` is not a reference: segment `{bad}` must be letters, digits, `_` or `-` (references look like run_id, vars.x, nodes.<id>.<field>, item, index)"
            ));
        }
        let rest = |from: usize| {
            parts[from..]
                .iter()
                .map(|s| (*s).to_owned())
                .collect::<Vec<_>>()
        };
        match parts[0] {
            "run_id" if parts.len() == 1 => Ok(Ref::RunId),
            "index" if parts.len() == 1 => Ok(Ref::Index),
            "item" => Ok(Ref::Item { path: rest(1) }),
            "vars" if parts.len() >= 2 => Ok(Ref::Var { name: parts[1].to_owned(), path: rest(2) }),
            "nodes" if parts.len() >= 3 => Ok(Ref::Node {
                id: parts[1].to_owned(),
                field: parts[2].to_owned(),
                path: rest(3),
            }),
            "nodes" => Err(format!("`{text}` needs a node and a field: nodes.<id>.<field>")),
            "vars" => Err(format!("`{text}` needs a variable name: vars.<name>")),
            _ => Err(format!(
                "unknown reference `{text}`: references start with run_id, vars., nodes., item or index"
            )),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Part {
    Lit(String),
    Ref(Ref),
}

/// A parsed template string. Serialises as its source text.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    src: String,
    parts: Vec<Part>,
}

impl Template {
    /// Parses `src`; errors name the problem (unterminated `{{`, bad reference).
    pub fn parse(src: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut rest = src;
        while let Some(at) = rest.find("{{") {
            if at > 0 && rest.as_bytes()[at - 1] == b'\\' {
                lit.push_str(&rest[..at - 1]);
                lit.push_str("{{");
                rest = &rest[at + 2..];
                continue;
            }
            lit.push_str(&rest[..at]);
            let after = &rest[at + 2..];
            let Some(end) = after.find("}}") else {
                return Err(format!(
                    "unterminated `{{{{` at byte {}: close it with `}}}}` (write `\\{{{{` for a literal `{{{{`)",
                    src.len() - rest.len() + at
                ));
            };
            let inner = after[..end].trim();
            let r = Ref::parse(inner)?;
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(&mut lit)));
            }
            parts.push(Part::Ref(r));
            rest = &after[end + 2..];
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Ok(Template {
            src: src.to_owned(),
            parts,
        })
    }

    /// A template holding exactly `text` (no references).
    pub fn literal(text: &str) -> Template {
        let src = text.replace("{{", "\\{{");
        let parts = if text.is_empty() {
            vec![]
        } else {
            vec![Part::Lit(text.to_owned())]
        };
        Template { src, parts }
    }

    pub fn source(&self) -> &str {
        &self.src
    }

    /// Every reference in order.
    pub fn refs(&self) -> impl Iterator<Item = &Ref> {
        self.parts.iter().filter_map(|p| match p {
            Part::Ref(r) => Some(r),
            Part::Lit(_) => None,
        })
    }

    /// True when the value is known without running anything (no node/item references).
    pub fn is_static(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Lit(_)))
    }

    /// Replaces the references `bind` returns a value for (run_id, plain vars at submit time),
    /// keeping the others; the result's source text is rebuilt accordingly.
    pub fn bind(&self, bind: &dyn Fn(&Ref) -> Option<String>) -> Template {
        let mut parts: Vec<Part> = Vec::new();
        for part in &self.parts {
            let part = match part {
                Part::Ref(r) => match bind(r) {
                    Some(text) => Part::Lit(text),
                    None => Part::Ref(r.clone()),
                },
                lit => lit.clone(),
            };
            match (parts.last_mut(), part) {
                (Some(Part::Lit(prev)), Part::Lit(text)) => prev.push_str(&text),
                (_, part) => parts.push(part),
            }
        }
        let src = parts
            .iter()
            .map(|p| match p {
                Part::Lit(text) => text.replace("{{", "\\{{"),
                Part::Ref(r) => format!("{{{{{r}}}}}"),
            })
            .collect();
        Template { src, parts }
    }

    /// Renders with `lookup` giving each reference's value; values that are not strings are
    /// written as JSON. A missing value is an error naming the reference.
    pub fn render(&self, lookup: &dyn Fn(&Ref) -> Option<Value>) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Lit(text) => out.push_str(text),
                Part::Ref(r) => match lookup(r) {
                    Some(v) => out.push_str(&value_text(&v)),
                    None => return Err(format!("`{{{{{r}}}}}` has no value yet")),
                },
            }
        }
        Ok(out)
    }

    /// A template that is exactly one reference renders to that value itself (so a list output
    /// can feed a list field); otherwise the rendered string.
    pub fn render_value(&self, lookup: &dyn Fn(&Ref) -> Option<Value>) -> Result<Value, String> {
        if let [Part::Ref(r)] = self.parts.as_slice() {
            return lookup(r).ok_or_else(|| format!("`{{{{{r}}}}}` has no value yet"));
        }
        self.render(lookup).map(Value::String)
    }
}

/// Text of a value in a rendered template.
pub fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

impl Serialize for Template {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.src)
    }
}

impl<'de> Deserialize<'de> for Template {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let text = match v {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            other => {
                return Err(serde::de::Error::custom(format!(
                    "expected text, found {}",
                    kind_of(&other)
                )))
            }
        };
        Template::parse(&text).map_err(serde::de::Error::custom)
    }
}

pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_literals_and_refs() {
        let t = Template::parse("docs/{{ run_id }}/{{vars.name}}-{{nodes.a.path}}.md").unwrap();
        let refs: Vec<_> = t.refs().cloned().collect();
        assert_eq!(
            refs,
            vec![
                Ref::RunId,
                Ref::Var {
                    name: "name".into(),
                    path: vec![]
                },
                Ref::Node {
                    id: "a".into(),
                    field: "path".into(),
                    path: vec![]
                },
            ]
        );
        let out = t
            .render(&|r| match r {
                Ref::RunId => Some(json!("r1")),
                Ref::Var { .. } => Some(json!("x")),
                Ref::Node { .. } => Some(json!("p")),
                _ => None,
            })
            .unwrap();
        assert_eq!(out, "docs/r1/x-p.md");
    }

    #[test]
    fn escapes_and_errors() {
        let t = Template::parse("a \\{{ b }} c").unwrap();
        assert!(t.is_static());
        assert_eq!(t.render(&|_| None).unwrap(), "a {{ b }} c");
        assert!(Template::parse("x {{ run_id")
            .unwrap_err()
            .contains("unterminated"));
        assert!(Template::parse("{{ nodes.a }}")
            .unwrap_err()
            .contains("nodes.<id>.<field>"));
        assert!(Template::parse("{{ foo.bar }}")
            .unwrap_err()
            .contains("unknown reference"));
        assert!(Template::parse("{{ nodes.a b.c }}")
            .unwrap_err()
            .contains("segment"));
        assert!(Template::parse("{{}}").is_err());
    }

    #[test]
    fn bind_keeps_runtime_refs() {
        let t = Template::parse("{{run_id}}/{{nodes.a.path}}/{{vars.v}}").unwrap();
        let b = t.bind(&|r| match r {
            Ref::RunId => Some("R".into()),
            Ref::Var { name, path } if name == "v" && path.is_empty() => Some("{{x".into()),
            _ => None,
        });
        assert_eq!(b.source(), "R/{{nodes.a.path}}/\\{{x");
        let reparsed = Template::parse(b.source()).unwrap();
        assert_eq!(reparsed, b);
        assert_eq!(b.render(&|_| Some(json!("P"))).unwrap(), "R/P/{{x");
    }

    #[test]
    fn single_ref_renders_to_value() {
        let t = Template::parse("{{ nodes.a.paths }}").unwrap();
        let v = t.render_value(&|_| Some(json!(["a", "b"]))).unwrap();
        assert_eq!(v, json!(["a", "b"]));
        let t = Template::parse("n={{ nodes.a.count }}").unwrap();
        assert_eq!(t.render_value(&|_| Some(json!(3))).unwrap(), json!("n=3"));
    }
}
