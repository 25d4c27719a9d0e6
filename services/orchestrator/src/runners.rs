//! The sandbox runners this orchestrator may use (DESIGN.md "Scale-out": many runners behind
//! one orchestrator). Requests go round-robin; a runner that answers Unavailable (down,
//! shutting down) is skipped and the request goes to the next one. Cancelling a run drops the
//! call, which resets the HTTP/2 stream so the runner stops the job.

use std::sync::atomic::{AtomicUsize, Ordering};

use cairn_proto::v1::sandbox_runner_client::SandboxRunnerClient;
use cairn_proto::v1::{RunRequest, RunResult};
use cairn_telemetry::TracedChannel;
use tonic::{Code, Status};

pub struct Runners {
    clients: Vec<(String, SandboxRunnerClient<TracedChannel>)>,
    next: AtomicUsize,
}

impl Runners {
    pub fn connect(addrs: &[String]) -> Result<Runners, cairn_server::Error> {
        let mut clients = Vec::new();
        for addr in addrs.iter().filter(|a| !a.trim().is_empty()) {
            let channel = cairn_server::connect(addr)?;
            let client = SandboxRunnerClient::new(cairn_telemetry::traced(channel))
                .max_decoding_message_size(cairn_server::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(cairn_server::MAX_MESSAGE_BYTES);
            clients.push((addr.clone(), client));
        }
        Ok(Runners {
            clients,
            next: AtomicUsize::new(0),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// Runs `req` on the next runner, moving on while runners are Unavailable. Returns the
    /// result and the address of the runner that produced it.
    pub async fn run(&self, req: RunRequest) -> Result<(RunResult, String), Status> {
        if self.clients.is_empty() {
            return Err(Status::failed_precondition(
                "no sandbox runner configured: set sandbox_addrs (CAIRN_ORCHESTRATOR_SANDBOX_ADDRS) to run sandbox_run nodes",
            ));
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last = None;
        for k in 0..self.clients.len() {
            let (addr, client) = &self.clients[(start + k) % self.clients.len()];
            match client.clone().run(req.clone()).await {
                Ok(r) => return Ok((r.into_inner(), addr.clone())),
                Err(s) if s.code() == Code::Unavailable => {
                    tracing::warn!(runner = %addr, error = %s.message(), "sandbox runner unavailable; trying the next one");
                    last = Some(s);
                }
                Err(s) => return Err(s),
            }
        }
        Err(last.unwrap_or_else(|| Status::unavailable("no sandbox runner answered")))
    }
}
