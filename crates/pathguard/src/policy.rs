//! `Policy`: the denylist and the allowed prefixes, applied after the syntax rules
//! (denylist case-folded and against 8.3 aliases, then prefixes;
//! request prefixes may only narrow the server's policy).

use crate::rules::{fold_key, validate};
use crate::{Reason, Rejection, SafePath};

/// The default denylist: names no cairn path may contain as any component.
pub const DEFAULT_DENYLIST: &[&str] =
    &[".ssh", ".aws", ".gnupg", ".kube", ".docker", ".git", ".env"];

/// Denylist + allowed prefixes.
#[derive(Debug, Clone)]
pub struct Policy {
    denylist: Vec<String>,
    denied: Vec<DeniedName>,
    allowed_prefixes: Vec<SafePath>,
}

/// One denylist entry in the forms components are compared against.
#[derive(Debug, Clone)]
struct DeniedName {
    name: String,
    folded: String,
    short: ShortName,
}

/// The 8.3 short name Windows may give a denied name (`.ssh` -> `SSH~1`): the long name
/// without leading dots, spaces and inner dots, uppercased; the extension after its last dot.
#[derive(Debug, Clone)]
struct ShortName {
    base: Vec<char>,
    ext: String,
}

impl ShortName {
    fn of(name: &str) -> ShortName {
        let name = name.trim_start_matches('.');
        let (stem, ext) = match name.rsplit_once('.') {
            Some((stem, ext)) => (stem, ext),
            None => (name, ""),
        };
        let short = |s: &str| -> Vec<char> {
            s.chars()
                .filter(|c| *c != ' ' && *c != '.')
                .flat_map(char::to_uppercase)
                .map(|c| if "+,;=[]".contains(c) { '_' } else { c })
                .collect()
        };
        ShortName {
            base: short(stem),
            ext: short(ext).into_iter().take(3).collect(),
        }
    }

    /// True when `component` is `BASE~N` (or `BASE~N.EXT`) for this name: `BASE` is the first
    /// 6 characters, or fewer when `N` has more digits (`SSH~1`, `GNUPG~1`, `DOCKER~12`, `DOCKE~12`), or the
    /// hashed form Windows uses after `~4` (2 characters + 4 hex digits, `DO1A2B~1`).
    fn matches(&self, component: &str) -> bool {
        // Most components have no `~`: answer before allocating anything.
        if self.base.is_empty() || !component.contains('~') {
            return false;
        }
        let upper: Vec<char> = component.chars().flat_map(char::to_uppercase).collect();
        let Some(tilde) = upper.iter().position(|c| *c == '~') else {
            return false;
        };
        let (head, rest) = (&upper[..tilde], &upper[tilde + 1..]);
        let (digits, ext) = match rest.iter().position(|c| *c == '.') {
            Some(dot) => (&rest[..dot], rest[dot + 1..].iter().collect::<String>()),
            None => (rest, String::new()),
        };
        if digits.is_empty()
            || digits.len() > 6
            || !digits.iter().all(char::is_ascii_digit)
            || ext != self.ext
        {
            return false;
        }
        // Windows shortens the base when N has more digits (`DOCKE~12`); accept the 6-character
        // base with any N too (`DOCKER~12`), being strict costs nothing here.
        let short = &self.base[..self.base.len().min(7 - digits.len())];
        let full = &self.base[..self.base.len().min(6)];
        let plain = head == short || head == full;
        let hashed = head.len() == 6
            && self.base.len() >= 2
            && head[..2] == self.base[..2]
            && head[2..].iter().all(char::is_ascii_hexdigit);
        plain || hashed
    }
}

impl Default for Policy {
    /// `DEFAULT_DENYLIST`, every prefix allowed.
    fn default() -> Self {
        Policy::new(
            DEFAULT_DENYLIST.iter().map(|s| (*s).to_owned()).collect(),
            Vec::new(),
        )
    }
}

impl Policy {
    /// `denylist` compared case-folded per component (also 8.3 aliases like `SSH~1`);
    /// empty `allowed_prefixes` = everything allowed.
    pub fn new(denylist: Vec<String>, allowed_prefixes: Vec<SafePath>) -> Self {
        let denied = denylist
            .iter()
            .map(|name| DeniedName {
                name: name.clone(),
                folded: fold_key(name),
                short: ShortName::of(name),
            })
            .collect();
        Policy {
            denylist,
            denied,
            allowed_prefixes,
        }
    }

    /// A policy from configuration text. Each denylist entry must be a valid single name
    /// (no `/`); each prefix must pass `validate_prefix` (one trailing `/` allowed).
    pub fn from_strings<D, P>(denylist: D, allowed_prefixes: P) -> Result<Policy, Rejection>
    where
        D: IntoIterator,
        D::Item: AsRef<str>,
        P: IntoIterator,
        P::Item: AsRef<str>,
    {
        let mut names = Vec::new();
        for name in denylist {
            let name = name.as_ref();
            let valid = validate(name).map_err(|r| Rejection {
                message: format!("denylist entry: {}", r.message),
                ..r
            })?;
            if name.contains('/') {
                return Err(Rejection::new(
                    Reason::InvalidChar,
                    name,
                    "denylist entries are single names matched against every component; remove the `/` (list each name on its own)",
                ));
            }
            names.push(valid.into_string());
        }
        let prefixes = allowed_prefixes
            .into_iter()
            .map(|p| validate_prefix(p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Policy::new(names, prefixes))
    }

    /// Syntax rules, then the denylist, then the allowed prefixes.
    pub fn check(&self, path: &str) -> Result<SafePath, Rejection> {
        let safe = validate(path)?;
        self.check_denylist(&safe)?;
        if !self.allows(&safe) {
            return Err(Rejection::new(
                Reason::PrefixNotAllowed,
                path,
                format!(
                    "the path is outside the allowed prefixes ({}); write it beneath one of them",
                    self.prefix_list()
                ),
            ));
        }
        Ok(safe)
    }

    /// A policy whose prefixes are `requested` (each must lie inside this policy's prefixes:
    /// requests may only narrow). Empty `requested` returns a clone of `self`.
    /// A requested prefix that fails `validate_prefix` is refused with that reason; one outside
    /// this policy's prefixes with `prefix_not_allowed`.
    pub fn narrow(&self, requested: &[String]) -> Result<Policy, Rejection> {
        if requested.is_empty() {
            return Ok(self.clone());
        }
        let mut prefixes = Vec::with_capacity(requested.len());
        for raw in requested {
            let prefix = validate_prefix(raw)?;
            if !self.allows(&prefix) {
                return Err(Rejection::new(
                    Reason::PrefixNotAllowed,
                    raw,
                    format!(
                        "a request may only narrow the server's allowed prefixes ({}); ask for a prefix inside one of them",
                        self.prefix_list()
                    ),
                ));
            }
            prefixes.push(prefix);
        }
        Ok(Policy {
            denylist: self.denylist.clone(),
            denied: self.denied.clone(),
            allowed_prefixes: prefixes,
        })
    }

    pub fn allowed_prefixes(&self) -> &[SafePath] {
        &self.allowed_prefixes
    }

    /// The denylist as given.
    pub fn denylist(&self) -> &[String] {
        &self.denylist
    }

    fn check_denylist(&self, path: &SafePath) -> Result<(), Rejection> {
        for component in path.components() {
            let folded = fold_key(component);
            for denied in &self.denied {
                let message = if denied.folded == folded {
                    format!("the name `{component}` is on the denylist (`{}`, compared case-insensitively); cairn never touches such paths, choose another name", denied.name)
                } else if denied.short.matches(component) {
                    format!("the name `{component}` is a Windows 8.3 short name of the denied `{}`; choose another name", denied.name)
                } else {
                    continue;
                };
                return Err(Rejection::new(Reason::Denied, path.as_str(), message));
            }
        }
        Ok(())
    }

    fn allows(&self, path: &SafePath) -> bool {
        self.allowed_prefixes.is_empty()
            || self.allowed_prefixes.iter().any(|p| path.starts_with(p))
    }

    fn prefix_list(&self) -> String {
        self.allowed_prefixes
            .iter()
            .map(|p| format!("`{p}/`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// An allowed prefix from configuration or a request: `validate`, after dropping ONE trailing
/// `/` (`docs/` and `docs` are the same prefix; `docs//` is still refused).
pub fn validate_prefix(prefix: &str) -> Result<SafePath, Rejection> {
    let trimmed = match prefix.strip_suffix('/') {
        Some(rest) if !rest.is_empty() => rest,
        _ => prefix,
    };
    validate(trimmed).map_err(|r| Rejection {
        path: prefix.to_owned(),
        message: format!("allowed prefix: {}", r.message),
        ..r
    })
}
