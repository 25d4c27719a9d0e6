//! Pagination of List and ListProjects: opaque page tokens carrying the last key sent.

use crate::error::{Error, Result};

const DEFAULT_PAGE: usize = 1000;
const MAX_PAGE: usize = 10_000;
const TOKEN_PREFIX: &str = "c1.";

/// One page request: how many entries, after which key (byte order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub size: usize,
    pub after: Option<String>,
}

impl Page {
    /// From the proto's page_size/page_token (0 = 1000, clamped to 10000).
    pub fn parse(page_size: u32, page_token: &str) -> Result<Page> {
        let size = match page_size as usize {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        };
        let after = if page_token.is_empty() {
            None
        } else {
            let bad = || {
                Error::BadRequest(format!(
                    "page_token {page_token:?} was not issued by this store; start again with an empty token"
                ))
            };
            let hex_part = page_token.strip_prefix(TOKEN_PREFIX).ok_or_else(bad)?;
            let bytes = hex::decode(hex_part).map_err(|_| bad())?;
            Some(String::from_utf8(bytes).map_err(|_| bad())?)
        };
        Ok(Page { size, after })
    }

    /// Takes this page out of `keys_sorted` (sorted by byte order, keys unique): the items
    /// and the token of the next page ("" when this was the last).
    pub fn cut<T>(&self, sorted: Vec<T>, key: impl Fn(&T) -> &str) -> (Vec<T>, String) {
        let start = match &self.after {
            Some(after) => sorted.partition_point(|item| key(item).as_bytes() <= after.as_bytes()),
            None => 0,
        };
        let total = sorted.len();
        let end = start.saturating_add(self.size).min(total);
        let page: Vec<T> = sorted.into_iter().skip(start).take(end - start).collect();
        let next = if end < total {
            page.last().map(|last| token(key(last))).unwrap_or_default()
        } else {
            String::new()
        };
        (page, next)
    }
}

pub fn token(last_key: &str) -> String {
    format!("{TOKEN_PREFIX}{}", hex::encode(last_key.as_bytes()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pages_walk_all_items_once() {
        let items: Vec<String> = (0..7).map(|i| format!("k{i}")).collect();
        let mut token = String::new();
        let mut seen = Vec::new();
        loop {
            let page = Page::parse(3, &token).unwrap();
            let (got, next) = page.cut(items.clone(), |s| s.as_str());
            seen.extend(got);
            if next.is_empty() {
                break;
            }
            token = next;
        }
        assert_eq!(seen, items);
        assert!(Page::parse(0, "garbage").is_err());
        assert_eq!(Page::parse(0, "").unwrap().size, 1000);
        assert_eq!(Page::parse(50_000, "").unwrap().size, 10_000);
    }
}
