//! Per-port packet counters and drop reasons, shared by vhost-user and kernel ports.
#![forbid(unsafe_code)]
