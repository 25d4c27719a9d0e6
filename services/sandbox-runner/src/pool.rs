//! The warm pool (docker backend). Filled in below.

use std::sync::Arc;

use crate::backend::docker::LiveSet;
use crate::backend::Live;
use crate::config::Config;
use crate::error::Result;
use crate::job::{Job, Outcome};

pub struct Pool {}

pub struct Warm {}

impl Pool {
    pub fn new(_client: bollard::Docker, _config: Arc<Config>, _live: LiveSet) -> Pool {
        Pool {}
    }
    pub fn fill(self: Arc<Self>) {}
    pub fn fits(&self, _job: &Job) -> bool {
        false
    }
    pub async fn take(&self) -> Option<Warm> {
        None
    }
    pub async fn close(&self) {}
}

impl Warm {
    pub async fn run(self, _job: &Job, _live: Option<&Live>, _grace_ms: u64) -> Result<Outcome> {
        Err(crate::error::Error::Sandbox("no warm pool".into()))
    }
}
