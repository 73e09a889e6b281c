//! Dirty-page logging (live migration, source side): where a burst records the guest memory
//! it wrote. The burst code is generic over a [`Marker`]: [`NoLog`] while the frontend does not
//! log (every mark compiles to nothing), [`Logging`] while it does (marks go to a per-burst
//! batch of the frontend's log). Also the queue's own log state: the log
//! ([`super::VirtQueue::set_log`]), whether to mark, the used ring's address for the log, and
//! the marks of ring writes made outside a burst.
//!
//! Invariants: a mark comes after the write it covers, and every write into guest memory
//! (packet data, headers, used entries and index, `avail_event`, used flags) is marked while
//! the frontend logs; a [`Logging`] writes its batch to the log (and counts it) when it drops,
//! so a burst's marks reach the log before the queue's lock is released.
//!
//! Thread-safety: a [`Logging`] lives for one burst of one locked queue; the log it writes
//! to is shared with other queues and the frontend, through atomic updates (`LogBatch`).

use std::sync::Arc;

use ferrovs_sys::guest::dirty_log::{DirtyLog, LogBatch};

use super::VirtQueue;
use crate::stats::QueueStats;

/// Where the guest-memory writes of a burst are recorded: [`NoLog`] (logging off: nothing,
/// at no cost) or [`Logging`] (the frontend's dirty log). Marks come after the writes they
/// cover.
pub trait Marker {
    /// Guest-physical `[gpa, gpa + len)` was written.
    fn mark(&mut self, gpa: u64, len: u64);
    /// Bytes `[off, off + len)` of the used ring were written.
    fn mark_used(&mut self, off: u64, len: u64);
}

/// Logging off.
#[derive(Debug)]
pub struct NoLog;

impl Marker for NoLog {
    #[inline(always)]
    fn mark(&mut self, _gpa: u64, _len: u64) {}
    #[inline(always)]
    fn mark_used(&mut self, _off: u64, _len: u64) {}
}

/// Logging on: marks go to a per-burst batch of the log, written (and counted in the
/// queue's `dirty_pages`) when it drops.
#[derive(Debug)]
pub struct Logging<'a> {
    batch: LogBatch<'a>,
    /// Guest-physical address of the used ring.
    used: Option<u64>,
    stats: Option<&'a QueueStats>,
}

impl<'a> Logging<'a> {
    pub(super) fn new(
        log: &'a DirtyLog,
        used: Option<u64>,
        stats: Option<&'a QueueStats>,
    ) -> Logging<'a> {
        Logging {
            batch: LogBatch::new(log),
            used,
            stats,
        }
    }
}

impl Drop for Logging<'_> {
    fn drop(&mut self) {
        self.batch.flush();
        if let Some(s) = self.stats {
            s.dirty_pages
                .fetch_add(self.batch.marked(), std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Marker for Logging<'_> {
    #[inline]
    fn mark(&mut self, gpa: u64, len: u64) {
        self.batch.mark(gpa, len);
    }
    #[inline]
    fn mark_used(&mut self, off: u64, len: u64) {
        if let Some(u) = self.used {
            self.batch.mark(u.wrapping_add(off), len);
        }
    }
}

/// Marks used entries `[old, new)` and `used.idx` of a ring of `size` entries.
#[inline]
pub(super) fn mark_used_entries<M: Marker>(m: &mut M, size: u16, old: u16, new: u16) {
    let count = u64::from(new.wrapping_sub(old));
    if count == 0 {
        return;
    }
    let start = u64::from(old & (size - 1));
    let first = count.min(u64::from(size) - start);
    m.mark_used(4 + 8 * start, 8 * first);
    if count > first {
        m.mark_used(4, 8 * (count - first));
    }
    m.mark_used(2, 2);
}

impl VirtQueue {
    /// Sets (or removes) the frontend's dirty log.
    pub fn set_log(&mut self, log: Option<Arc<DirtyLog>>) {
        self.log = log;
    }

    /// The log to mark while the frontend logs.
    #[inline]
    pub(super) fn logging(&self) -> Option<&Arc<DirtyLog>> {
        if self.log_all {
            self.log.as_ref()
        } else {
            None
        }
    }

    /// Guest-physical address of the used ring for the log.
    pub(super) fn used_log_addr(&self) -> Option<u64> {
        self.state.log_addr.or(self.used_gpa)
    }

    /// Logs a write to bytes `[off, off + len)` of the used ring made outside a burst.
    pub(super) fn log_used_now(&self, off: u64, len: u64) {
        if let Some(log) = self.logging() {
            Logging::new(log, self.used_log_addr(), None).mark_used(off, len);
        }
    }
}
