//! Prefetching of guest buffers, for both directions, on split and packed rings: a burst starts
//! loading the descriptors and first lines of all its chains at once, and a large packet's copy
//! overlaps the loading of the next chain's buffer. Only hints: a wrong guess costs a few
//! useless loads, never a wrong result, and addresses are translated (checked) before anything
//! is touched; on a packed ring only descriptors the driver made available are looked at.
//!
//! Thread-safety: reads the ring of a queue its caller holds locked; `FERROVS_NO_PREFETCH` is
//! read once per process.

use ferrovs_sys::guest::packed::PackedRing;
use ferrovs_sys::guest::vring::SplitRing;

use super::packed::{Pos, Slot};
use super::BURST;

/// How many receive buffers a guest-RX burst of `pkts` prefetches: one per packet, at most a
/// burst (split and packed rings alike).
#[inline(always)]
pub(super) fn rx_prefetch_len<I: Iterator>(pkts: &I) -> usize {
    pkts.size_hint().1.unwrap_or(BURST).min(BURST)
}

/// Whether burst prefetching is on (`FERROVS_NO_PREFETCH` turns it off, for A/B benches).
fn prefetch_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FERROVS_NO_PREFETCH").is_none())
}

/// Starts loading the descriptors and first buffers of the next `n` chains, so that the
/// copies that follow overlap their cross-core cache misses instead of taking them one by
/// one (the guest just wrote all of these lines on another core). Returns the longest first
/// buffer seen.
#[inline(always)]
pub(super) fn prefetch_burst(ring: &SplitRing, from: u16, n: usize, write: bool) -> u32 {
    if !prefetch_on() {
        return 0;
    }
    let mem = ring.mem();
    let mut longest = 0;
    for i in 0..n {
        let head = ring.avail_entry(from.wrapping_add(i as u16));
        if let Some(d) = ring.desc(head) {
            // Header and the start of the packet: two lines (a 64-byte frame and its
            // 12-byte header span two); the rest of a large packet is prefetched one
            // packet ahead of its copy (`prefetch_ahead`).
            mem.prefetch_head(d.addr, u64::from(d.len), write);
            longest = longest.max(d.len);
        }
    }
    longest
}

/// [`prefetch_burst`] for a packed ring: from position `from`, the buffers of up to `n`
/// descriptors the driver made available (stopping at the first that is not), in ring order
/// (a chain of several descriptors has each of its buffers prefetched, the chain counted as
/// several). The descriptors themselves are consecutive 16-byte entries (four a line), which
/// the walk loads anyway. Returns the longest buffer seen.
#[inline(always)]
pub(super) fn prefetch_burst_packed(ring: &PackedRing, from: Pos, n: usize, write: bool) -> u32 {
    if !prefetch_on() {
        return 0;
    }
    let (mem, size) = (ring.mem(), ring.size());
    let mut pos = from;
    let mut longest = 0;
    for _ in 0..n.min(usize::from(size)) {
        let Some(d) = ring.desc(pos.slot) else { break };
        if Slot::of(d.flags, pos.wrap) != Slot::Available {
            break;
        }
        mem.prefetch_head(d.addr, u64::from(d.len), write);
        longest = longest.max(d.len);
        pos = pos.advance(1, size);
    }
    longest
}

/// [`prefetch_ahead`] for a packed ring: the rest of the buffer at position `pos` (guessed to
/// be the next chain's first), if the driver made it available.
#[inline(always)]
pub(super) fn prefetch_ahead_packed(ring: &PackedRing, pos: Pos, len: u64, write: bool) {
    if len <= BURST_PREFETCH_BYTES || !prefetch_on() {
        return;
    }
    if let Some(d) = ring.desc(pos.slot) {
        if Slot::of(d.flags, pos.wrap) != Slot::Available {
            return;
        }
        let len = len.min(u64::from(d.len)).min(AHEAD_PREFETCH_BYTES);
        if len > BURST_PREFETCH_BYTES {
            ring.mem().prefetch_range(
                d.addr.saturating_add(BURST_PREFETCH_BYTES),
                len - BURST_PREFETCH_BYTES,
                AHEAD_PREFETCH_BYTES / 64,
                write,
            );
        }
    }
}

/// Bytes of a chain's first buffer the burst prefetch covers (two lines).
pub(super) const BURST_PREFETCH_BYTES: u64 = 128;

/// Most of a large packet prefetched ahead of its copy (a 1518-byte frame and its header).
const AHEAD_PREFETCH_BYTES: u64 = 1536;

/// Software pipelining for large packets: while one packet is copied, starts loading the
/// rest (past what the burst prefetch took) of the next chain's first buffer, `len` bytes
/// of it: a 1518-byte frame is 24 lines, and a copy that finds them cold waits for each
/// (guest TX: loads of lines the guest just wrote on another core; guest RX: stores that
/// first need the lines owned, `write`). Chain `slot` is only guessed to be the next one
/// used (mergeable buffers may take more): a wrong guess costs a few useless prefetches.
#[inline(always)]
pub(super) fn prefetch_ahead(ring: &SplitRing, slot: u16, len: u64, write: bool) {
    if len <= BURST_PREFETCH_BYTES || !prefetch_on() {
        return;
    }
    let head = ring.avail_entry(slot);
    if let Some(d) = ring.desc(head) {
        let len = len.min(u64::from(d.len)).min(AHEAD_PREFETCH_BYTES);
        if len > BURST_PREFETCH_BYTES {
            ring.mem().prefetch_range(
                d.addr.saturating_add(BURST_PREFETCH_BYTES),
                len - BURST_PREFETCH_BYTES,
                AHEAD_PREFETCH_BYTES / 64,
                write,
            );
        }
    }
}
