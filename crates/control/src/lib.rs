//! The control plane of ferrovsd.
//!
//! * [`config`]: the configuration model, its validation, the embedded default, and atomic
//!   persistence (write to a temporary file, fsync, rename).
//! * [`options`]: port options (`key=value`) as the control protocol (`ferrovs_proto`)
//!   carries them, parsed into the configuration model.
//! * [`controller`]: OpenFlow controller connections' pure logic (targets, backoff, the
//!   inactivity probe, roles, fail-open), as OVS's `rconn`/`connmgr`/`fail-open`.
//! * [`daemon`]: the control thread: one epoll loop over the control socket, vhost-user
//!   listeners and connections (server and client mode, with reconnect backoff), and the PMD
//!   threads' configuration, published to them RCU-style.
//! * [`flows`]: the OpenFlow-style rules of each bridge as installed (specs, counters,
//!   timeouts), built into the datapath's pipeline on every change.
//! * [`openflow`]: OpenFlow 1.3 FLOW_MOD and flow statistics mapped onto those rules, with
//!   the precise OpenFlow error for what the pipeline cannot do.
//! * [`logging`]: ferrovsd's logger: levels per module changed at run time, text, JSON or
//!   the systemd journal's native protocol.

//! * [`capture`]: `ferrovs capture`'s filter, compiled by libpcap.
//! * [`ratelimit`]: at most a few log lines per port and reason per interval.
//! * [`sdnotify`]: systemd's service notification protocol (`READY=1`, `WATCHDOG=1`...).
//! * [`upgrade`]: the hot-upgrade handover protocol and its versioned state.
//! * [`vswitchdb`]: the `Open_vSwitch` database (as ovs-vsctl writes it) mapped onto the
//!   configuration, for `ferrovsd --ovsdb`.
#![forbid(unsafe_code)]

pub mod capture;
pub mod config;
pub mod controller;
pub mod daemon;
pub mod flows;
pub mod logging;
pub mod openflow;
pub mod options;
pub mod ratelimit;
pub mod sdnotify;
pub mod upgrade;
pub mod vswitchdb;

pub use config::{Config, PortConfig, PortType};
pub use daemon::{Daemon, DaemonOptions};
