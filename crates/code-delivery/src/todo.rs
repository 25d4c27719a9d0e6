//! The `todo` tool's board: the agent's to-do items with their status, kept as
//! `todo.json` in the agent's directory of the run (`.cairn/runs/<run_id>/agents/<instance>/`)
//! so a human sees the progress while the task runs. This module is the board's logic; the
//! tool loop writes it through the store after every change.

use serde::{Deserialize, Serialize};

use crate::tools::{TodoAction, TodoArgs, TodoStatus};

/// Most items on one board.
pub const MAX_ITEMS: usize = 200;
/// Longest item text, in characters.
pub const MAX_CONTENT_CHARS: usize = 2000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TodoItem {
    pub id: u64,
    pub content: String,
    pub status: TodoStatus,
    pub updated_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TodoBoard {
    pub version: u32,
    /// Id of the next item added (ids are never reused within a board).
    pub next_id: u64,
    pub items: Vec<TodoItem>,
}

impl Default for TodoBoard {
    fn default() -> Self {
        TodoBoard {
            version: 1,
            next_id: 1,
            items: Vec::new(),
        }
    }
}

/// What one action did: the text for the model, and whether the board changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TodoOutcome {
    pub message: String,
    pub changed: bool,
}

impl TodoBoard {
    /// Applies `args` at time `now`; Err is a message for the model (nothing changed).
    pub fn apply(&mut self, args: &TodoArgs, now: &str) -> Result<TodoOutcome, String> {
        let content = |c: &Option<String>| -> Result<Option<String>, String> {
            match c.as_deref().map(str::trim) {
                None => Ok(None),
                Some("") => Err("`content` is empty".into()),
                Some(t) if t.chars().count() > MAX_CONTENT_CHARS => Err(format!(
                    "`content` is longer than {MAX_CONTENT_CHARS} characters; keep items short"
                )),
                Some(t) => Ok(Some(t.to_owned())),
            }
        };
        let message = match args.action {
            TodoAction::List => {
                return Ok(TodoOutcome {
                    message: self.render(),
                    changed: false,
                })
            }
            TodoAction::Add => {
                let text =
                    content(&args.content)?.ok_or("`add` needs `content` (the item's text)")?;
                if self.items.len() >= MAX_ITEMS {
                    return Err(format!(
                        "the board already has {MAX_ITEMS} items; remove or clear some first"
                    ));
                }
                let id = self.next_id;
                self.next_id += 1;
                self.items.push(TodoItem {
                    id,
                    content: text,
                    status: args.status.unwrap_or(TodoStatus::Pending),
                    updated_at: now.to_owned(),
                });
                format!("added #{id}")
            }
            TodoAction::Update => {
                let id = args.item_id.ok_or("`update` needs `item_id`")?;
                let text = content(&args.content)?;
                if text.is_none() && args.status.is_none() {
                    return Err("`update` needs `status` or `content` (or both)".into());
                }
                let item = self.find(id)?;
                if let Some(t) = text {
                    item.content = t;
                }
                if let Some(s) = args.status {
                    item.status = s;
                }
                item.updated_at = now.to_owned();
                format!("updated #{id}")
            }
            TodoAction::Remove => {
                let id = args.item_id.ok_or("`remove` needs `item_id`")?;
                self.find(id)?;
                self.items.retain(|i| i.id != id);
                format!("removed #{id}")
            }
            TodoAction::Clear => {
                let n = self.items.len();
                self.items.clear();
                format!("cleared {n} items")
            }
        };
        Ok(TodoOutcome {
            message: format!("{message}\n{}", self.render()),
            changed: true,
        })
    }

    fn find(&mut self, id: u64) -> Result<&mut TodoItem, String> {
        let known: Vec<String> = self.items.iter().map(|i| format!("#{}", i.id)).collect();
        self.items.iter_mut().find(|i| i.id == id).ok_or_else(|| {
            if known.is_empty() {
                format!("there is no item #{id}: the board is empty")
            } else {
                format!("there is no item #{id}; the items are {}", known.join(", "))
            }
        })
    }

    /// The board as the model reads it: one line per item.
    pub fn render(&self) -> String {
        if self.items.is_empty() {
            return "the to-do board is empty".into();
        }
        let done = self
            .items
            .iter()
            .filter(|i| i.status == TodoStatus::Completed)
            .count();
        let mut out = format!("to-do board ({done}/{} completed):", self.items.len());
        for i in &self.items {
            out.push_str(&format!(
                "\n#{} [{}] {}",
                i.id,
                i.status.as_str(),
                i.content
            ));
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn args(
        action: TodoAction,
        id: Option<u64>,
        content: Option<&str>,
        status: Option<TodoStatus>,
    ) -> TodoArgs {
        TodoArgs {
            action,
            item_id: id,
            content: content.map(str::to_owned),
            status,
        }
    }

    #[test]
    fn add_list_update_remove_clear() {
        let mut b = TodoBoard::default();
        let out = b
            .apply(
                &args(TodoAction::Add, None, Some("write README"), None),
                "t1",
            )
            .unwrap();
        assert!(
            out.changed && out.message.starts_with("added #1"),
            "{}",
            out.message
        );
        b.apply(
            &args(
                TodoAction::Add,
                None,
                Some("tests"),
                Some(TodoStatus::InProgress),
            ),
            "t1",
        )
        .unwrap();
        let list = b
            .apply(&args(TodoAction::List, None, None, None), "t2")
            .unwrap();
        assert!(!list.changed);
        assert_eq!(
            list.message,
            "to-do board (0/2 completed):\n#1 [pending] write README\n#2 [in_progress] tests"
        );
        b.apply(
            &args(
                TodoAction::Update,
                Some(1),
                None,
                Some(TodoStatus::Completed),
            ),
            "t3",
        )
        .unwrap();
        assert_eq!(b.items[0].status, TodoStatus::Completed);
        assert_eq!(b.items[0].updated_at, "t3");
        b.apply(&args(TodoAction::Remove, Some(2), None, None), "t4")
            .unwrap();
        assert_eq!(b.items.len(), 1);
        // Ids are not reused.
        b.apply(&args(TodoAction::Add, None, Some("docs"), None), "t5")
            .unwrap();
        assert_eq!(b.items[1].id, 3);
        let out = b
            .apply(&args(TodoAction::Clear, None, None, None), "t6")
            .unwrap();
        assert!(out.message.contains("cleared 2 items"));
        assert!(b.items.is_empty());
        let json = serde_json::to_string(&b).unwrap();
        assert_eq!(serde_json::from_str::<TodoBoard>(&json).unwrap(), b);
    }

    #[test]
    fn bad_actions_are_messages_and_change_nothing() {
        let mut b = TodoBoard::default();
        b.apply(&args(TodoAction::Add, None, Some("x"), None), "t")
            .unwrap();
        let before = b.clone();
        for (a, want) in [
            (args(TodoAction::Add, None, None, None), "needs `content`"),
            (args(TodoAction::Add, None, Some("  "), None), "empty"),
            (
                args(TodoAction::Update, None, None, Some(TodoStatus::Completed)),
                "needs `item_id`",
            ),
            (
                args(TodoAction::Update, Some(1), None, None),
                "needs `status` or `content`",
            ),
            (
                args(TodoAction::Update, Some(9), Some("y"), None),
                "no item #9; the items are #1",
            ),
            (
                args(TodoAction::Remove, None, None, None),
                "needs `item_id`",
            ),
        ] {
            let e = b.apply(&a, "t2").unwrap_err();
            assert!(e.contains(want), "{a:?}: {e}");
            assert_eq!(b, before);
        }
        let long = "x".repeat(MAX_CONTENT_CHARS + 1);
        assert!(b
            .apply(&args(TodoAction::Add, None, Some(&long), None), "t")
            .is_err());
    }
}
