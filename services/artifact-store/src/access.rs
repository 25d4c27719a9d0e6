//! What each identity may write, enforced here whatever the caller sends: the access table in
//! front of the service decides which RPCs an identity may call; this decides where its writes
//! may land. A caller's own `allowed_prefixes` can only narrow these scopes further.
//!
//! - `orchestrator`, `cli` (the operator's admin tool) and plaintext callers (`local`, the
//!   single-user loopback default): anywhere.
//! - `ingest`: only under an ingest claim (GrantIngestClaim, verified by the store), and only
//!   under the claim's prefixes (`workspace/…`, that run's `.cairn/runs/<run>/ingest/…`); its
//!   events only with a claim on their run, and only `ingest.*` types.
//! - a write under a claim, whoever sends it, lands only under the claim's prefixes.
//! - any other identity an operator grants writes to: never under `.cairn/`.
//!
//! Every refusal is logged at warn with the identity, the peer and what was refused.

use cairn_server::Caller;

use crate::claim::Claim;
use crate::error::{Error, Result};

const RECORDS: &str = ".cairn/";

fn trusted(caller: &Caller) -> bool {
    caller.is_local() || caller.is("orchestrator") || caller.is("cli")
}

fn refuse(caller: &Caller, rpc: &str, action: String, rule: &'static str) -> Error {
    cairn_server::access::audit_refusal(caller.name(), &caller.peer_text(), rpc, rule);
    Error::NotPermitted {
        identity: caller.name().to_owned(),
        action,
        rule,
    }
}

/// May `caller` write `path` (Put, Delete, UpdateJson)? `fence`: the run claim it presented.
pub fn check_write(
    caller: &Caller,
    rpc: &str,
    path: &str,
    fence: Option<&(String, u64)>,
) -> Result<()> {
    if trusted(caller) {
        return Ok(());
    }
    let action = || format!("write {path:?}");
    if caller.is("ingest") {
        let Some((run, _)) = fence else {
            return Err(refuse(
                caller,
                rpc,
                action(),
                "ingest writes only under an ingest claim on the run (send the claim the run's driver passed on)",
            ));
        };
        let manifests = format!("{RECORDS}runs/{run}/ingest/");
        if path.starts_with("workspace/") || path.starts_with(&manifests) {
            return Ok(());
        }
        return Err(refuse(
            caller,
            rpc,
            action(),
            "ingest writes only workspace/ and the claimed run's .cairn/runs/<run>/ingest/",
        ));
    }
    if path.starts_with(RECORDS) || path == ".cairn" {
        return Err(refuse(
            caller,
            rpc,
            action(),
            "only the orchestrator writes run records under .cairn/",
        ));
    }
    Ok(())
}

/// May `caller` write `path` with this claim, as far as run records go? The orchestrator
/// writes a run's records (`.cairn/runs/<run>/…`) only under its claim on that very run
/// (the fence; its epoch is checked against the run's current one when the write lands), so
/// a node of one run, or a driver whose claim was taken over, never writes another run's
/// records. Delete and UpdateJson carry no claim: the orchestrator may not use them there.
pub fn check_record_claim(
    caller: &Caller,
    rpc: &str,
    path: &str,
    fence: Option<&(String, u64)>,
) -> Result<()> {
    if !caller.is("orchestrator") {
        return Ok(());
    }
    let Some(run) = pathguard::records::run_of(path) else {
        return Ok(());
    };
    match fence {
        Some((claimed, _)) if claimed == run => Ok(()),
        Some((claimed, _)) => Err(refuse(
            caller,
            rpc,
            format!("write {path:?} under its claim on run {claimed:?}"),
            "a run's records are written only under a claim on that run",
        )),
        None => Err(refuse(
            caller,
            rpc,
            format!("write {path:?} without a claim on run {run:?}"),
            "a run's records are written only by its driver, with the fence of its current claim (ClaimRun)",
        )),
    }
}

/// May `caller` append events to a run with this `epoch` (0 = unfenced)?
pub fn check_append(caller: &Caller, run: &str, epoch: u64) -> Result<()> {
    if trusted(caller) || (caller.is("ingest") && epoch > 0) {
        return Ok(());
    }
    Err(refuse(
        caller,
        "cairn.v1.ArtifactStore/AppendEvents",
        format!("append events to run {run:?}"),
        if caller.is("ingest") {
            "ingest appends only with an ingest claim on the run"
        } else {
            "only the orchestrator appends run events"
        },
    ))
}

/// A write under an ingest claim lands only under the claim's prefixes.
pub fn check_claim(caller: &Caller, rpc: &str, path: &str, claim: Option<&Claim>) -> Result<()> {
    match claim {
        Some(c) if !c.allows(path) => Err(refuse(
            caller,
            rpc,
            format!("write {path:?}"),
            "a write under an ingest claim lands only under the claim's prefixes (workspace/ and its run's .cairn/runs/<run>/ingest/)",
        )),
        _ => Ok(()),
    }
}

/// May `caller` append events of these `types` (the event table of `cairn_server::events`)?
/// One type it may not emit refuses the whole batch.
pub fn check_event_types<'a>(
    caller: &Caller,
    run: &str,
    types: impl IntoIterator<Item = &'a str>,
) -> Result<()> {
    if caller.is_local() {
        return Ok(());
    }
    let identity = caller.name();
    match types
        .into_iter()
        .find(|t| !cairn_server::events::may_emit(Some(identity), t))
    {
        Some(kind) => {
            cairn_server::access::audit_refusal(
                identity,
                &caller.peer_text(),
                "cairn.v1.ArtifactStore/AppendEvents",
                "event_not_permitted",
            );
            Err(Error::EventNotPermitted {
                identity: identity.to_owned(),
                run: run.to_owned(),
                kind: kind.to_owned(),
                rule: cairn_server::events::rule(identity),
            })
        }
        None => Ok(()),
    }
}

/// May `caller` be granted ingest claims? Only a run's driver: the orchestrator, the cli, a
/// plaintext caller.
pub fn check_grant(caller: &Caller, run: &str) -> Result<()> {
    if trusted(caller) {
        return Ok(());
    }
    Err(refuse(
        caller,
        "cairn.v1.ArtifactStore/GrantIngestClaim",
        format!("be granted an ingest claim on run {run:?}"),
        "only a run's driver (the orchestrator or the cli) is granted ingest claims",
    ))
}

#[cfg(test)]
mod tests {
    use cairn_server::caller::Principal;

    use super::*;

    fn caller(id: &str) -> Caller {
        Caller {
            principal: Principal::Service(id.to_owned()),
            peer: None,
        }
    }

    #[test]
    fn ingest_writes_only_its_scopes_and_only_under_a_claim() {
        let ingest = caller("ingest");
        let fence = ("r1".to_owned(), 3);
        assert!(check_write(&ingest, "Put", "workspace/a.py", Some(&fence)).is_ok());
        assert!(check_write(&ingest, "Put", ".cairn/runs/r1/ingest/n.json", Some(&fence)).is_ok());
        assert!(check_write(&ingest, "Put", "workspace/a.py", None).is_err());
        assert!(check_write(&ingest, "Put", ".cairn/runs/r2/ingest/n.json", Some(&fence)).is_err());
        assert!(check_write(&ingest, "Put", ".cairn/runs/r1/task.yaml", Some(&fence)).is_err());
        assert!(check_write(&ingest, "Put", "docs/x.md", Some(&fence)).is_err());
        assert!(check_append(&ingest, "r1", 0).is_err());
        assert!(check_append(&ingest, "r1", 3).is_ok());
    }

    #[test]
    fn the_orchestrator_writes_a_runs_records_only_under_its_claim_on_that_run() {
        let orch = caller("orchestrator");
        let r1 = ("r1".to_owned(), 2);
        let put = |path: &str, fence: Option<&(String, u64)>| {
            check_record_claim(&orch, "Put", path, fence).is_ok()
        };
        assert!(put(".cairn/runs/r1/task.yaml", Some(&r1)));
        assert!(!put(".cairn/runs/r1/task.yaml", None));
        assert!(!put(".cairn/runs/r2/graph.resolved.json", Some(&r1)));
        assert!(!put(".CAIRN/runs/r2/task.yaml", Some(&r1)));
        assert!(put("docs/a.md", None));
        assert!(put(".cairn/project.json", None));
        // People's tools keep their own rules (task.yaml edits are validated).
        assert!(
            check_record_claim(&caller("cli"), "Put", ".cairn/runs/r1/task.yaml", None).is_ok()
        );
    }

    #[test]
    fn records_are_the_orchestrators() {
        assert!(check_write(
            &caller("orchestrator"),
            "Put",
            ".cairn/runs/r/task.yaml",
            None
        )
        .is_ok());
        assert!(check_write(&caller("console"), "Put", ".cairn/runs/r/task.yaml", None).is_err());
        assert!(check_write(&caller("reporter"), "Put", "docs/r.md", None).is_ok());
        assert!(check_append(&caller("console"), "r", 0).is_err());
    }

    #[test]
    fn a_write_under_a_claim_lands_only_under_its_prefixes_whoever_sends_it() {
        let key = crate::claim::ClaimKey::ephemeral();
        let text = key.issue(
            "p",
            "r1",
            3,
            vec!["workspace/".into(), ".cairn/runs/r1/ingest/".into()],
            u64::MAX,
        );
        let Ok(claim) = key.verify(&text, 0) else {
            panic!("a claim this key issued is refused")
        };
        for who in ["ingest", "orchestrator"] {
            let c = caller(who);
            assert!(check_claim(&c, "Put", "workspace/a.py", Some(&claim)).is_ok());
            assert!(check_claim(&c, "Put", ".cairn/runs/r1/ingest/n.json", Some(&claim)).is_ok());
            let refused = check_claim(&c, "Put", "docs/a.md", Some(&claim)).err();
            assert_eq!(refused.map(|e| e.reason()), Some("identity"), "{who}");
            assert!(check_claim(&c, "Put", ".cairn/runs/r2/ingest/n.json", Some(&claim)).is_err());
        }
        // Without a claim the other rules decide.
        assert!(check_claim(&caller("ingest"), "Put", "docs/a.md", None).is_ok());
    }

    #[test]
    fn ingest_appends_only_its_own_event_types() {
        let ingest = caller("ingest");
        assert!(check_event_types(&ingest, "r", ["ingest.started", "ingest.completed"]).is_ok());
        for forged in [
            "gate.approved",
            "node.completed",
            "task.working",
            "store.deleted",
        ] {
            let e = check_event_types(&ingest, "r", ["ingest.started", forged]).unwrap_err();
            assert_eq!(e.reason(), "event_not_permitted", "{forged}");
        }
        assert!(check_event_types(&caller("orchestrator"), "r", ["gate.approved"]).is_ok());
        assert!(check_grant(&caller("ingest"), "r").is_err());
        assert!(check_grant(&caller("orchestrator"), "r").is_ok());
    }
}
