//! Conditions of `when:` and of `condition` nodes: a small expression language over the same
//! references as templates (`nodes.tests.exit_code == 0 && vars.mode != 'draft'`).
//! Operators: `||`, `&&`, `!`, `==`, `!=`, `<`, `<=`, `>`, `>=`, parentheses; literals: true,
//! false, null, numbers, 'text' or "text"; a reference may also be written `{{ ref }}`.

use std::cmp::Ordering;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::template::Ref;

#[derive(Clone, Debug, PartialEq)]
enum Ast {
    Lit(Value),
    Ref(Ref),
    Not(Box<Ast>),
    And(Box<Ast>, Box<Ast>),
    Or(Box<Ast>, Box<Ast>),
    Cmp(CmpOp, Box<Ast>, Box<Ast>),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A parsed expression. Serialises as its source text.
#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    src: String,
    ast: Ast,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    LParen,
    RParen,
    Not,
    And,
    Or,
    Cmp(CmpOp),
    Lit(Value),
    Ref(String),
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let two = if i + 1 < b.len() { &src[i..i + 2] } else { "" };
        match c {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'(' => {
                out.push(Tok::LParen);
                i += 1
            }
            b')' => {
                out.push(Tok::RParen);
                i += 1
            }
            _ if two == "&&" => {
                out.push(Tok::And);
                i += 2
            }
            _ if two == "||" => {
                out.push(Tok::Or);
                i += 2
            }
            _ if two == "==" => {
                out.push(Tok::Cmp(CmpOp::Eq));
                i += 2
            }
            _ if two == "!=" => {
                out.push(Tok::Cmp(CmpOp::Ne));
                i += 2
            }
            _ if two == "<=" => {
                out.push(Tok::Cmp(CmpOp::Le));
                i += 2
            }
            _ if two == ">=" => {
                out.push(Tok::Cmp(CmpOp::Ge));
                i += 2
            }
            _ if two == "{{" => {
                let Some(end) = src[i + 2..].find("}}") else {
                    return Err("unterminated `{{` in expression".into());
                };
                out.push(Tok::Ref(src[i + 2..i + 2 + end].trim().to_owned()));
                i += end + 4;
            }
            b'<' => {
                out.push(Tok::Cmp(CmpOp::Lt));
                i += 1
            }
            b'>' => {
                out.push(Tok::Cmp(CmpOp::Gt));
                i += 1
            }
            b'!' => {
                out.push(Tok::Not);
                i += 1
            }
            b'\'' | b'"' => {
                let Some(end) = src[i + 1..].find(c as char) else {
                    return Err(format!("unterminated text literal starting at byte {i}"));
                };
                out.push(Tok::Lit(Value::String(src[i + 1..i + 1 + end].to_owned())));
                i += end + 2;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                i += 1;
                while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                    i += 1;
                }
                let text = &src[start..i];
                let n: f64 = text
                    .parse()
                    .map_err(|_| format!("`{text}` is not a number"))?;
                let v = if text.contains('.') {
                    serde_json::Number::from_f64(n)
                        .map(Value::Number)
                        .unwrap_or(Value::Null)
                } else {
                    text.parse::<i64>()
                        .map(Value::from)
                        .unwrap_or(Value::from(n))
                };
                out.push(Tok::Lit(v));
            }
            _ if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len()
                    && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'_' | b'-' | b'.'))
                {
                    i += 1;
                }
                let word = &src[start..i];
                out.push(match word {
                    "true" => Tok::Lit(Value::Bool(true)),
                    "false" => Tok::Lit(Value::Bool(false)),
                    "null" => Tok::Lit(Value::Null),
                    _ => Tok::Ref(word.to_owned()),
                });
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(format!("unexpected `{ch}` at byte {i}"));
            }
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<Tok>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }
    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.at).cloned();
        self.at += 1;
        t
    }
    fn or(&mut self, depth: u32) -> Result<Ast, String> {
        let mut left = self.and(depth)?;
        while self.peek() == Some(&Tok::Or) {
            self.at += 1;
            left = Ast::Or(Box::new(left), Box::new(self.and(depth)?));
        }
        Ok(left)
    }
    fn and(&mut self, depth: u32) -> Result<Ast, String> {
        let mut left = self.not(depth)?;
        while self.peek() == Some(&Tok::And) {
            self.at += 1;
            left = Ast::And(Box::new(left), Box::new(self.not(depth)?));
        }
        Ok(left)
    }
    fn not(&mut self, depth: u32) -> Result<Ast, String> {
        if self.peek() == Some(&Tok::Not) {
            self.at += 1;
            return Ok(Ast::Not(Box::new(self.not(depth + 1)?)));
        }
        let left = self.atom(depth)?;
        if let Some(Tok::Cmp(op)) = self.peek().cloned() {
            self.at += 1;
            let right = self.atom(depth)?;
            return Ok(Ast::Cmp(op, Box::new(left), Box::new(right)));
        }
        Ok(left)
    }
    fn atom(&mut self, depth: u32) -> Result<Ast, String> {
        if depth > 64 {
            return Err("expression nests too deeply (more than 64 levels)".into());
        }
        match self.next() {
            Some(Tok::LParen) => {
                let inner = self.or(depth + 1)?;
                match self.next() {
                    Some(Tok::RParen) => Ok(inner),
                    _ => Err("missing `)`".into()),
                }
            }
            Some(Tok::Lit(v)) => Ok(Ast::Lit(v)),
            Some(Tok::Ref(text)) => Ok(Ast::Ref(Ref::parse(&text)?)),
            Some(other) => Err(format!("expected a value, found {other:?}")),
            None => Err("the expression ends too early".into()),
        }
    }
}

impl Expr {
    pub fn parse(src: &str) -> Result<Expr, String> {
        let toks = lex(src)?;
        if toks.is_empty() {
            return Err("empty expression".into());
        }
        let mut p = Parser { toks, at: 0 };
        let ast = p.or(0)?;
        if p.at < p.toks.len() {
            return Err(format!(
                "unexpected {:?} after the expression",
                p.toks[p.at]
            ));
        }
        Ok(Expr {
            src: src.to_owned(),
            ast,
        })
    }

    pub fn source(&self) -> &str {
        &self.src
    }

    /// Every reference, in order.
    pub fn refs(&self) -> Vec<&Ref> {
        fn walk<'a>(a: &'a Ast, out: &mut Vec<&'a Ref>) {
            match a {
                Ast::Lit(_) => {}
                Ast::Ref(r) => out.push(r),
                Ast::Not(x) => walk(x, out),
                Ast::And(x, y) | Ast::Or(x, y) | Ast::Cmp(_, x, y) => {
                    walk(x, out);
                    walk(y, out)
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.ast, &mut out);
        out
    }

    /// Evaluates to true or false; a reference without a value is an error naming it.
    pub fn eval(&self, lookup: &dyn Fn(&Ref) -> Option<Value>) -> Result<bool, String> {
        eval(&self.ast, lookup).map(|v| truthy(&v))
    }
}

fn eval(a: &Ast, lookup: &dyn Fn(&Ref) -> Option<Value>) -> Result<Value, String> {
    Ok(match a {
        Ast::Lit(v) => v.clone(),
        Ast::Ref(r) => lookup(r).ok_or_else(|| format!("`{r}` has no value"))?,
        Ast::Not(x) => Value::Bool(!truthy(&eval(x, lookup)?)),
        Ast::And(x, y) => Value::Bool(truthy(&eval(x, lookup)?) && truthy(&eval(y, lookup)?)),
        Ast::Or(x, y) => Value::Bool(truthy(&eval(x, lookup)?) || truthy(&eval(y, lookup)?)),
        Ast::Cmp(op, x, y) => {
            let (l, r) = (eval(x, lookup)?, eval(y, lookup)?);
            let ord = compare(&l, &r);
            Value::Bool(match op {
                CmpOp::Eq => ord == Some(Ordering::Equal),
                CmpOp::Ne => ord != Some(Ordering::Equal),
                CmpOp::Lt => ord == Some(Ordering::Less),
                CmpOp::Le => matches!(ord, Some(Ordering::Less | Ordering::Equal)),
                CmpOp::Gt => ord == Some(Ordering::Greater),
                CmpOp::Ge => matches!(ord, Some(Ordering::Greater | Ordering::Equal)),
            })
        }
    })
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        _ => None,
    }
}

/// Numbers compare numerically (text that reads as a number too, since vars are text);
/// otherwise equal JSON values are equal and text compares by bytes.
fn compare(l: &Value, r: &Value) -> Option<Ordering> {
    if matches!(l, Value::Number(_)) || matches!(r, Value::Number(_)) {
        if let (Some(a), Some(b)) = (number(l), number(r)) {
            return a.partial_cmp(&b);
        }
    }
    match (l, r) {
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (Value::Bool(a), Value::String(b)) | (Value::String(b), Value::Bool(a)) => {
            (a.to_string() == *b).then_some(Ordering::Equal)
        }
        _ if l == r => Some(Ordering::Equal),
        _ => None,
    }
}

/// false, null, 0, "", "false", "0", "no", empty lists and mappings are false.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !matches!(s.trim(), "" | "false" | "0" | "no"),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

impl Serialize for Expr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.src)
    }
}

impl<'de> Deserialize<'de> for Expr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let text = match v {
            Value::String(s) => s,
            Value::Bool(b) => b.to_string(),
            other => {
                return Err(serde::de::Error::custom(format!(
                    "expected an expression (text), found {}",
                    super::template::kind_of(&other)
                )))
            }
        };
        Expr::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(src: &str) -> bool {
        Expr::parse(src)
            .unwrap()
            .eval(&|r| match r.to_string().as_str() {
                "nodes.t.exit_code" => Some(json!(0)),
                "nodes.t.ok" => Some(json!(true)),
                "vars.mode" => Some(json!("fast")),
                "vars.n" => Some(json!("5")),
                "nodes.l.paths" => Some(json!([])),
                _ => None,
            })
            .unwrap()
    }

    #[test]
    fn evaluates() {
        assert!(ev("nodes.t.exit_code == 0"));
        assert!(ev("{{ nodes.t.exit_code }} == 0 && nodes.t.ok"));
        assert!(!ev("nodes.t.exit_code != 0"));
        assert!(ev("vars.mode == 'fast'"));
        assert!(ev("vars.mode != \"slow\" || false"));
        assert!(ev("vars.n > 3 && vars.n <= 5"));
        assert!(ev("!(vars.n < 3)"));
        assert!(!ev("nodes.l.paths"));
        assert!(ev("true"));
        assert!(!ev("!true"));
        assert!(ev("-1 < 0.5"));
    }

    #[test]
    fn errors() {
        assert!(Expr::parse("").is_err());
        assert!(Expr::parse("a ==").is_err());
        assert!(Expr::parse("(true").is_err());
        assert!(Expr::parse("true true").is_err());
        assert!(Expr::parse("nodes.x == 'a").is_err());
        assert!(Expr::parse("foo.bar")
            .unwrap_err()
            .contains("unknown reference"));
        assert!(Expr::parse("nodes.a.b $ 1").is_err());
        let e = Expr::parse("nodes.missing.x").unwrap();
        assert!(e.eval(&|_| None).unwrap_err().contains("nodes.missing.x"));
        assert_eq!(e.refs().len(), 1);
    }
}
