//! Publication tokens: what a deferred Put's reply (`PUT_DURABILITY_WITH_RUN_EVENTS`) hands
//! its writer, and what the writer's AppendEvents presents for the files its events name.
//!
//! A deferred Put replies before its file is published; the run's next commit of events waits
//! for that publication and fsyncs its directory (see `deferred`). That holds only within one
//! life of the store process: after a crash and restart the new process knows nothing of the
//! publications the old one had acknowledged, and a writer's queued events naming such a file
//! would be committed although the file may never have landed. So each deferred Put gets a
//! token bound to this boot of the store and to its run (a keyed sha256 only this boot can
//! make), and a commit is refused (`publication_unproven`) when a token it is shown is of
//! another boot or another run: the store cannot prove that publication durable. The writer
//! then writes those files again and resends its events with the new tokens.
//!
//! A valid token needs no other record: its publication either still belongs to the run's log
//! (the commit waits for it and fsyncs its directory), or the log was closed, which happens
//! only once nothing of it is in flight or pending, i.e. once it is durable.

use cairn_sha256::Sha256;

/// Version prefix of tokens (a later format gets another).
const PREFIX: &str = "p1";
/// Hex digits of the proof kept in a token (128 bits).
const PROOF_HEX: usize = 32;

/// This boot of the store: a random id and the key its tokens are proven with.
#[derive(Debug)]
pub struct Boot {
    id: u64,
    key: [u8; 32],
    next: std::sync::atomic::AtomicU64,
}

/// Why a token does not prove its publication durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unproven {
    /// Not a token this store makes.
    Malformed,
    /// Made by an earlier (or another) boot of the store.
    OtherBoot,
    /// Made by this boot, but for a Put of another project or run.
    OtherRun,
}

impl Unproven {
    pub fn describe(&self) -> &'static str {
        match self {
            Unproven::Malformed => "is not a publication token of this store",
            Unproven::OtherBoot => "was issued before the store restarted, and the store cannot prove that write was published",
            Unproven::OtherRun => "was issued for a Put of another project or run, whose publication this run's events do not wait for",
        }
    }
}

impl Default for Boot {
    fn default() -> Self {
        Boot::new()
    }
}

impl Boot {
    /// A new boot with a random id and key.
    pub fn new() -> Boot {
        let (id, _) = uuid::Uuid::new_v4().as_u64_pair();
        let mut key = [0u8; 32];
        key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        Boot {
            id,
            key,
            next: Default::default(),
        }
    }

    /// A token for a publication deferred to `run` of `project`.
    pub fn issue(&self, project: &str, run: &str) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!(
            "{PREFIX}.{:016x}.{n:x}.{}",
            self.id,
            self.proof(project, run, self.id, n)
        )
    }

    /// Checks that `token` was issued by this boot for `run` of `project`.
    pub fn verify(&self, project: &str, run: &str, token: &str) -> Result<(), Unproven> {
        let mut parts = token.split('.');
        let (Some(PREFIX), Some(boot), Some(n), Some(proof), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(Unproven::Malformed);
        };
        let (Ok(boot), Ok(n)) = (u64::from_str_radix(boot, 16), u64::from_str_radix(n, 16)) else {
            return Err(Unproven::Malformed);
        };
        if proof.len() != PROOF_HEX {
            return Err(Unproven::Malformed);
        }
        if boot != self.id {
            return Err(Unproven::OtherBoot);
        }
        if proof != self.proof(project, run, boot, n) {
            return Err(Unproven::OtherRun);
        }
        Ok(())
    }

    fn proof(&self, project: &str, run: &str, boot: u64, n: u64) -> String {
        let mut h = Sha256::new();
        h.update(&self.key);
        h.update(project.as_bytes());
        h.update(&[0]);
        h.update(run.as_bytes());
        h.update(&[0]);
        h.update(&boot.to_le_bytes());
        h.update(&n.to_le_bytes());
        let mut hex = h.finish_hex();
        hex.truncate(PROOF_HEX);
        hex
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_proves_only_its_own_boot_and_run() {
        let boot = Boot::new();
        let t = boot.issue("p", "r1");
        assert_eq!(boot.verify("p", "r1", &t), Ok(()));
        assert_ne!(t, boot.issue("p", "r1"), "every token is distinct");
        assert_eq!(boot.verify("p", "r2", &t), Err(Unproven::OtherRun));
        assert_eq!(boot.verify("q", "r1", &t), Err(Unproven::OtherRun));
        // The same store restarted: a new boot refuses the old tokens.
        let restarted = Boot::new();
        assert_eq!(restarted.verify("p", "r1", &t), Err(Unproven::OtherBoot));
        // A forged token with the new boot's id but the old proof.
        let forged = t.replacen(&t[3..19], &format!("{:016x}", restarted.id), 1);
        assert_eq!(
            restarted.verify("p", "r1", &forged),
            Err(Unproven::OtherRun)
        );
        for bad in ["", "p1", "p1.x.1.00", "p2.0.0.0", &format!("{t}.x")] {
            assert_eq!(
                boot.verify("p", "r1", bad),
                Err(Unproven::Malformed),
                "{bad}"
            );
        }
    }
}
