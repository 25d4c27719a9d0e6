//! The state the operation modules share: the config, the data root's [`Layout`], the digest
//! cache, the slots of paths being published, the small-Put journal, this boot's publication tokens, the key of
//! ingest claims and the bounds on background work. The run logs and document locks are not here: they belong to the
//! modules above (`events`, `document`), and the `Store` composes all three.
//!
//! May depend on: config, error, layout, temp, digest, slots, publication, claim, quota,
//! cairn-durable (the journal); never
//! on an operation module (files, project, events, write, read, document) or on `store`.

use std::os::fd::AsFd;
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::claim::ClaimKey;
use crate::config::Config;
use crate::digest::DigestCache;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::publication::Boot;
use crate::slots::Slots;
use crate::temp;
use cairn_durable::journal::{Journal, Recovered};

/// Most Puts published in the background at once (each holds two fds until it is done).
const PUBLICATIONS_IN_FLIGHT: usize = 256;
/// Most large Puts written with O_DIRECT at once (each holds three 4 MiB buffers and two
/// threads); the others go through the page cache.
const DIRECT_WRITERS: usize = 16;

/// What every request shares below the store.
#[derive(Debug)]
pub struct State {
    pub(crate) config: Config,
    pub(crate) layout: Layout,
    pub(crate) digests: DigestCache,
    /// This boot of the process: the publication tokens of deferred Puts are bound to it.
    pub(crate) boot: Boot,
    /// The key ingest claims are made and checked with (kept beneath the data root).
    pub(crate) claims: ClaimKey,
    /// Writes stage into unnamed O_TMPFILE inodes (probed at open; else `.cairn-tmp-*` names).
    pub(crate) unnamed_temps: bool,
    /// The paths being published now.
    pub(crate) slots: Arc<Slots>,
    /// Bounds the Puts published after their reply; beyond it a Put waits.
    pub(crate) publish_permits: Arc<Semaphore>,
    /// Bounds the large Puts written with O_DIRECT; beyond it a Put uses the page cache.
    pub(crate) direct_writers: Arc<Semaphore>,
    /// The small-Put journal (None when `put_journal` is off).
    pub(crate) journal: Option<Journal>,
    /// Writes the journal held at opening, until `files::restore_journaled` makes them durable.
    pub(crate) recovered: parking_lot::Mutex<Vec<Recovered>>,
    /// Admissions of snapshot Puts under the projects' quotas.
    pub(crate) snapshot_quota: crate::quota::Quota,
    /// Tests hold this to keep background publications from starting.
    #[cfg(test)]
    pub(crate) hold_publications: std::sync::Mutex<()>,
}

impl State {
    /// Opens (creating when missing) the data root. Does not sweep; see `sweep::remove_temp_files`.
    pub fn open(config: Config) -> Result<State> {
        config.check()?;
        let layout = Layout::open(&config)?;
        let unnamed_temps = temp::unnamed_temps_work(layout.projects.as_fd());
        let claims = ClaimKey::load_or_create(&config.data_root)?;
        let (journal, recovered) = match config.put_journal {
            true => match Journal::open(&config.data_root) {
                Ok((journal, recovered)) => (Some(journal), recovered),
                // A journal that could not be made (a full disk) holds nothing to lose.
                Err(e)
                    if !config
                        .data_root
                        .join(cairn_durable::journal::FILE_NAME)
                        .exists() =>
                {
                    tracing::warn!(error = %e, "no Put journal: small synchronous Puts fsync their file and directory");
                    (None, Vec::new())
                }
                Err(e) => return Err(e.into()),
            },
            false => (None, Vec::new()),
        };
        Ok(State {
            journal,
            recovered: parking_lot::Mutex::new(recovered),
            claims,
            unnamed_temps,
            layout,
            digests: DigestCache::default(),
            boot: Boot::new(),
            slots: Default::default(),
            publish_permits: Arc::new(Semaphore::new(PUBLICATIONS_IN_FLIGHT)),
            direct_writers: Arc::new(Semaphore::new(DIRECT_WRITERS)),
            snapshot_quota: Default::default(),
            #[cfg(test)]
            hold_publications: std::sync::Mutex::new(()),
            config,
        })
    }
}

impl State {
    /// Before a write that is not journaled changes `path` of `project` ("" = anything in
    /// it): a checkpoint of the Put journal when it holds a record there (see `journal`).
    pub(crate) fn settle_journal(&self, project: &str, path: &str) -> Result<()> {
        match &self.journal {
            Some(journal) => Ok(journal.settle(project, path)?),
            None => Ok(()),
        }
    }
}

/// Runs blocking filesystem work off the async threads.
pub(crate) async fn blocking<T, F>(work: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) if e.is_cancelled() => Err(Error::Unavailable),
        Err(e) => Err(Error::io(
            "a store task failed",
            std::io::Error::other(e.to_string()),
        )),
    }
}
