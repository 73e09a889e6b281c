//! ferrovsd's Prometheus exporter (`ferrovsd --metrics ADDR:PORT`).
//!
//! * [`exposition`]: a [`Scrape`] (the daemon's own reports) rendered in the Prometheus text
//!   exposition format with the official client crate, `prometheus-client`.
//! * [`http`]: a small HTTP server for `GET /metrics`, bounded in time, size and
//!   connections, so a slow or hostile scraper holds a bounded slot and nothing else.
//! * [`collect`]: one scrape read over the control socket with the requests `ferrovs show`,
//!   `port-stats`, `pmd-stats`, `upgrade-history` and `conntrack-stats` make:
//!   the daemon's existing snapshots, no new counter anywhere, nothing on the PMD threads.
//!
//! Thread-safety: the exporter runs on threads of its own (an accept thread and one per
//! connection); it shares nothing with the daemon but the control socket.
#![forbid(unsafe_code)]

pub mod exposition;
pub mod http;

use std::net::SocketAddr;
use std::sync::Arc;

use ferrovs_proto::reply::{ConntrackStats, PmdStats, PortStats, Show, UpgradeReport};
use ferrovs_proto::{Client, ClientError, Request};

pub use exposition::{render, Scrape};
pub use http::{Limits, Server};

/// Reads one scrape from the daemon behind `client`.
pub fn collect(client: &Client) -> Result<Scrape, ClientError> {
    let show: Show = client.call(&Request::Show)?;
    let ports: Vec<PortStats> = client.call(&Request::PortStats { port: None })?;
    let pmds: Vec<PmdStats> = client.call(&Request::PmdStats)?;
    let last_upgrade = client
        .call::<Vec<UpgradeReport>>(&Request::UpgradeHistory { last: Some(1) })?
        .pop();
    // A daemon without connection tracking still answers; one that refuses is left out.
    let conntrack = client.call::<ConntrackStats>(&Request::ConntrackStats).ok();
    // Counted by the daemon (`show`): a scrape never formats the rules themselves.
    let flows = show
        .bridges
        .iter()
        .flat_map(|br| {
            br.rules_per_table
                .iter()
                .map(|&(t, n)| ((br.name.clone(), u64::from(t)), n))
        })
        .collect();
    Ok(Scrape {
        show,
        ports,
        pmds,
        last_upgrade,
        conntrack,
        flows,
    })
}

/// Serves the metrics of the daemon whose run directory is `run_dir` on `addr`.
pub fn serve(addr: SocketAddr, run_dir: impl Into<std::path::PathBuf>) -> std::io::Result<Server> {
    let client = Client::new(run_dir);
    let source: Arc<http::Source> = Arc::new(move || {
        collect(&client)
            .map(|s| render(&s))
            .map_err(|e| e.message())
    });
    Server::start(addr, Limits::default(), source)
}
