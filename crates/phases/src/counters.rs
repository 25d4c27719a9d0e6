//! The auto-task counters: one versioned JSON document in the project (
//! `context/auto-tasks-today.json` by default), changed only through the store's UpdateJson.
//!
//! ```json
//! {"cursor": 7,
//!  "days": {"2026-02-28": {
//!     "claims":  {"shurangama": {"<run_id>": 1}},
//!     "counts":  {"shurangama": {"<run_id>": 1}},
//!     "settled": {"<run_id>": 1}}},
//!  "write_version": 12}
//! ```
//!
//! Why per-run slots: the rule resolves a `write_version` conflict by merging every counter by
//! maximum. A plain `count: n` would lose increments that way (two runs both write 2 over 1).
//! Each run writes only its own slot, and every slot only grows, so the maximum of two versions
//! of a slot is the later one and a max-merge keeps every run's increments: the day's count of a
//! key is the sum over runs. A run's `claims` are the keys its plan picked; until the run's
//! assemble step settles it they count against the limit too, so concurrent runs do not
//! overshoot a limit; a run that dies before settling holds its claims until the day ends.
//!
//! The plan step's decision (cursor and claims) is a compare-and-swap without merge: a
//! decision made on a stale document must be made again, not merged. Days other than the
//! plan's day are dropped by the plan step (the daily reset).

use std::time::Duration;

use cairn_proto::v1::MergePolicy;
use serde_json::{json, Map, Value};
use tonic::Code;

use cairn_node::NodeError;
use cairn_store_client::Store;

/// The counters document.
pub const DEFAULT_PATH: &str = "context/auto-tasks-today.json";
/// Compare-and-swap attempts of one plan decision.
const MAX_CAS_ATTEMPTS: u32 = 20;

/// A read of the counters document.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    pub version: u64,
    pub doc: Map<String, Value>,
}

fn num(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_u64).unwrap_or(0)
}

impl Counters {
    /// From the stored bytes (None = no document yet).
    pub fn parse(path: &str, bytes: Option<&[u8]>) -> Result<Counters, String> {
        let Some(bytes) = bytes else {
            return Ok(Counters::default());
        };
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(doc)) => Ok(Counters {
                version: num(doc.get("write_version")),
                doc,
            }),
            _ => Err(format!(
                "{path} is not a JSON object; fix or delete it (it holds the auto-task counters)"
            )),
        }
    }

    pub async fn read(store: &Store, project: &str, path: &str) -> Result<Counters, NodeError> {
        let bytes = store
            .get(project, path)
            .await
            .map_err(|s| NodeError::from_status(&format!("reading counters {path}"), &s))?;
        Counters::parse(path, bytes.as_deref()).map_err(NodeError::refused)
    }

    /// Where the round-robin stands (an absolute position: it only grows).
    pub fn cursor(&self) -> u64 {
        num(self.doc.get("cursor"))
    }

    fn day(&self, date: &str) -> Option<&Map<String, Value>> {
        self.doc.get("days")?.get(date)?.as_object()
    }

    /// Today's use of `key`: successes of settled runs, and for unsettled runs the larger of
    /// their successes and their claims.
    pub fn used(&self, date: &str, key: &str) -> u64 {
        let Some(day) = self.day(date) else {
            return 0;
        };
        let slots = |field: &str| day.get(field)?.get(key)?.as_object();
        let settled = day.get("settled").and_then(Value::as_object);
        let counts = slots("counts");
        let claims = slots("claims");
        let mut runs: Vec<&String> = counts
            .iter()
            .chain(claims.iter())
            .flat_map(|m| m.keys())
            .collect();
        runs.sort();
        runs.dedup();
        runs.into_iter()
            .map(|run| {
                let count = num(counts.and_then(|m| m.get(run)));
                let is_settled = settled.is_some_and(|s| num(s.get(run)) > 0);
                if is_settled {
                    count
                } else {
                    count.max(num(claims.and_then(|m| m.get(run))))
                }
            })
            .sum()
    }

    /// The days recorded besides `date` (dropped by the next plan).
    pub fn other_days(&self, date: &str) -> Vec<String> {
        self.doc
            .get("days")
            .and_then(Value::as_object)
            .map(|d| d.keys().filter(|k| *k != date).cloned().collect())
            .unwrap_or_default()
    }
}

/// The plan's patch: the new cursor, this run's claims for `date`, older days dropped.
pub fn claim_patch(c: &Counters, date: &str, run_id: &str, keys: &[String], cursor: u64) -> Value {
    let mut days = Map::new();
    for d in c.other_days(date) {
        days.insert(d, Value::Null);
    }
    let claims: Map<String, Value> = keys
        .iter()
        .map(|k| (k.clone(), json!({ run_id: 1 })))
        .collect();
    days.insert(date.to_owned(), json!({ "claims": claims }));
    json!({ "cursor": cursor, "days": days })
}

/// The assemble step's patch: this run's successes per key, and the run settled.
pub fn record_patch(date: &str, run_id: &str, counted: &[(String, u64)]) -> Value {
    let counts: Map<String, Value> = counted
        .iter()
        .map(|(k, n)| (k.clone(), json!({ run_id: n })))
        .collect();
    json!({ "days": { date: { "counts": counts, "settled": { run_id: 1 } } } })
}

/// Reads the document and writes `decide`'s patch with `expected_version` = what was read and
/// no merge; on a conflict reads again and decides again. Returns the decision and the version
/// written (None when `decide` had nothing to write).
pub async fn compare_and_swap<T>(
    store: &Store,
    project: &str,
    path: &str,
    run_id: &str,
    mut decide: impl FnMut(&Counters) -> (T, Option<Value>),
) -> Result<(T, Counters, Option<u64>), NodeError> {
    for attempt in 1..=MAX_CAS_ATTEMPTS {
        let c = Counters::read(store, project, path).await?;
        let (decision, patch) = decide(&c);
        let Some(patch) = patch else {
            return Ok((decision, c, None));
        };
        match store
            .update_json(project, path, c.version, &patch, MergePolicy::None, run_id)
            .await
        {
            Ok(r) => return Ok((decision, c, Some(r.version))),
            Err(s) if s.code() == Code::Aborted && attempt < MAX_CAS_ATTEMPTS => {
                // Another run changed it since we read it: decide again on the new version.
                tokio::time::sleep(Duration::from_millis(fastrand::u64(
                    2..=20 * attempt as u64,
                )))
                .await;
            }
            Err(s) => {
                return Err(NodeError::from_status(
                    &format!("updating counters {path}"),
                    &s,
                ))
            }
        }
    }
    Err(NodeError::new(
        cairn_graph::ErrorKind::Unavailable,
        format!("counters {path} kept changing under {MAX_CAS_ATTEMPTS} attempts; try again"),
    ))
}

/// What recording successes did.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    pub version: u64,
    pub merged_conflict: bool,
    pub document: Value,
}

/// Adds this run's successes with expected_version + max-merge on conflict:
/// one round trip, correct whatever ran in between (see the module header).
pub async fn record(
    store: &Store,
    project: &str,
    path: &str,
    run_id: &str,
    date: &str,
    counted: &[(String, u64)],
) -> Result<Recorded, NodeError> {
    let c = Counters::read(store, project, path).await?;
    let patch = record_patch(date, run_id, counted);
    let r = store
        .update_json(project, path, c.version, &patch, MergePolicy::Max, run_id)
        .await
        .map_err(|s| NodeError::from_status(&format!("updating counters {path}"), &s))?;
    Ok(Recorded {
        version: r.version,
        merged_conflict: r.merged_conflict,
        document: serde_json::from_str(&r.document_json).unwrap_or(Value::Null),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn counters(v: Value) -> Counters {
        Counters::parse("c.json", Some(v.to_string().as_bytes())).unwrap()
    }

    #[test]
    fn use_is_successes_plus_open_claims() {
        let c = counters(json!({
            "cursor": 4,
            "write_version": 9,
            "days": {
                "2026-02-28": {
                    "claims": {"a": {"r1": 1, "r2": 1, "r3": 1}},
                    "counts": {"a": {"r1": 1, "r4": 2}},
                    "settled": {"r1": 1, "r2": 1}
                },
                "2026-02-27": {"counts": {"a": {"r0": 5}}, "settled": {"r0": 1}}
            }
        }));
        assert_eq!(c.version, 9);
        assert_eq!(c.cursor(), 4);
        // r1 settled with 1 success; r2 settled with none (its claim released); r3 open
        // claim; r4 counted without a claim.
        let (r1, r2, r3, r4) = (1, 0, 1, 2);
        assert_eq!(c.used("2026-02-28", "a"), r1 + r2 + r3 + r4);
        assert_eq!(c.used("2026-02-27", "a"), 5);
        assert_eq!(c.used("2026-03-01", "a"), 0, "a new day starts at zero");
        assert_eq!(c.used("2026-02-28", "b"), 0);
        assert_eq!(c.other_days("2026-02-28"), vec!["2026-02-27".to_owned()]);
    }

    #[test]
    fn absent_and_broken_documents() {
        assert_eq!(
            Counters::parse("c.json", None).unwrap(),
            Counters::default()
        );
        let e = Counters::parse("c.json", Some(b"[1]")).unwrap_err();
        assert!(e.contains("c.json is not a JSON object"), "{e}");
        // Garbage slots count as nothing rather than failing.
        let c = counters(json!({"days": {"d": {"counts": {"a": {"r": "x"}}}}}));
        assert_eq!(c.used("d", "a"), 0);
    }

    #[test]
    fn patches() {
        let c = counters(json!({"days": {"2026-02-27": {}, "2026-02-28": {}}}));
        assert_eq!(
            claim_patch(&c, "2026-02-28", "r9", &["a".into(), "b".into()], 12),
            json!({"cursor": 12, "days": {"2026-02-27": null, "2026-02-28": {"claims": {"a": {"r9": 1}, "b": {"r9": 1}}}}})
        );
        assert_eq!(
            record_patch("2026-02-28", "r9", &[("a".into(), 1)]),
            json!({"days": {"2026-02-28": {"counts": {"a": {"r9": 1}}, "settled": {"r9": 1}}}})
        );
    }
}
