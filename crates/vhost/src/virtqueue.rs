//! One virtqueue of a vhost-user net device, backend side: the packet path over guest rings.
//!
//! Invariants:
//! * Every value read from guest memory is untrusted. A descriptor index past the table, a
//!   chain longer than the ring (a loop), a nested or malformed indirect table, a buffer
//!   outside guest memory or a descriptor of the wrong direction marks the queue *broken*: the
//!   offending chain is returned to the guest with length 0 (it leaks no descriptor), the
//!   reason is counted, one log line (`log::warn!`) is written, and the queue is not polled again until the
//!   frontend re-initialises it. Other queues and ports are unaffected.
//! * Used entries are written in a burst and published with one Release store of `used.idx`;
//!   the guest is notified at most once per burst, and only if it asked (EVENT_IDX
//!   `used_event`, or the NO_INTERRUPT flag). With coalescing ([`Coalesce`]) a burst's
//!   notification may be deferred: it is made when `frames` packets are waiting or `usecs`
//!   have passed since the first of them, whichever comes first; the PMD's timer
//!   ([`VirtQueue::flush_due`]) makes the late ones, so none waits longer than `usecs`.
//! * The queue's plain state ([`VringState`]) is all another process needs to resume it.
//! * Live migration, source side: while the frontend logs dirty pages (`VHOST_F_LOG_ALL` and
//!   a log from SET_LOG_BASE), every byte a burst writes into guest memory (packet data,
//!   headers, used-ring entries and index, `avail_event`, used flags) has its page marked,
//!   after the write, through a per-burst [`LogBatch`]. The copy routines are generic over a
//!   [`Marker`]; with logging off they run with [`NoLog`], whose marks compile to nothing.
//!   `LOG_ALL` without a usable log makes the queue not ready: we never write guest memory
//!   the frontend cannot see us write.
//! * Live migration, postcopy destination: in a memory mapped while pages were still arriving
//!   ([`GuestMemory::in_postcopy`]), a burst first checks the ring's pages are present; a copy
//!   that meets a missing page stops the burst without consuming the chain (guest TX) or
//!   drops the packet (guest RX, `postcopy_page_pending`), and the page is fetched by the
//!   memory's fault thread: a PMD never stops on a page fault.
//!
//! Thread-safety: a `VirtQueue` sits in a `Mutex` ([`crate::device::Queue`]); the PMD that
//! polls it takes the lock with `try_lock` once per burst, the control thread takes it to
//! change the queue, so configuration never races a burst.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use ferrovs_sys::guest::dirty_log::{DirtyLog, LogBatch};
use ferrovs_sys::guest::memory::{AccessError, GuestMemory};
use ferrovs_sys::guest::vring::{
    self, Descriptor, RingAddrs, RingError, SplitRing, VRING_AVAIL_F_NO_INTERRUPT,
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_USED_F_NO_NOTIFY,
};
use ferrovs_sys::kernel::vnet::{self, caps, VnetHdr};
use ferrovs_sys::os;
use ferrovs_sys::pool::{Mbuf, Pool};

use crate::features;
use crate::stats::{DropReason, QueueStats};

/// Most packets one burst moves.
pub const BURST: usize = 32;

/// Plain, exportable state of a vring (what `GET_VRING_BASE` and a hot upgrade need).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VringState {
    pub size: u32,
    pub addrs: Option<RingAddrs>,
    pub last_avail: u16,
    pub used_idx: u16,
    pub enabled: bool,
    /// A kick fd (or NOFD) was received: the ring is started.
    pub kicked: bool,
    /// Guest-physical address of the used ring for the dirty log (SET_VRING_ADDR with
    /// VHOST_VRING_F_LOG); only meaningful while the frontend logs.
    pub log_addr: Option<u64>,
}

/// A guest error found while walking a descriptor chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("descriptor index out of range")]
    BadIndex,
    #[error("descriptor chain loops or exceeds the ring size")]
    Loop,
    #[error("malformed or nested indirect descriptor table")]
    BadIndirect,
    #[error("buffer outside guest memory")]
    OutOfMemory,
    #[error("descriptor direction does not match the queue")]
    WrongDirection,
    #[error("available index moved by more than the ring size")]
    BadAvailIdx,
    #[error("guest memory file shrank under the mapping (SIGBUS)")]
    MemoryFault,
    #[error("dirty log file shrank under the mapping (SIGBUS): the migration lost marks")]
    LogFault,
    /// Postcopy: a page the chain needs has not arrived yet. Not the guest's error: the page
    /// is being fetched and the chain is tried again; never breaks a queue.
    #[error("guest page not arrived yet (postcopy)")]
    NotArrived,
}

impl ChainError {
    pub fn reason(self) -> DropReason {
        match self {
            ChainError::BadIndex => DropReason::BadDescIndex,
            ChainError::Loop => DropReason::ChainLoop,
            ChainError::BadIndirect => DropReason::BadIndirect,
            ChainError::OutOfMemory => DropReason::OutOfGuestMemory,
            ChainError::WrongDirection => DropReason::WrongDirection,
            ChainError::BadAvailIdx => DropReason::BadAvailIdx,
            ChainError::MemoryFault => DropReason::GuestMemoryFault,
            ChainError::LogFault => DropReason::DirtyLogFault,
            ChainError::NotArrived => DropReason::PostcopyPending,
        }
    }
}

impl ChainError {
    /// Every error that breaks a queue, for mapping to and from plain data (hot upgrade).
    pub const ALL: [ChainError; 8] = [
        ChainError::BadIndex,
        ChainError::Loop,
        ChainError::BadIndirect,
        ChainError::OutOfMemory,
        ChainError::WrongDirection,
        ChainError::BadAvailIdx,
        ChainError::MemoryFault,
        ChainError::LogFault,
    ];

    /// Stable name (the drop reason's name).
    pub fn name(self) -> &'static str {
        self.reason().name()
    }

    pub fn from_name(n: &str) -> Option<ChainError> {
        Self::ALL.into_iter().find(|e| e.name() == n)
    }

    /// Like [`ChainError::from_name`], also for [`ChainError::NotArrived`] (which breaks no
    /// queue: restoring a state that says so is refused with its own error).
    pub fn from_any_name(n: &str) -> Option<ChainError> {
        Self::from_name(n)
            .or((n == ChainError::NotArrived.name()).then_some(ChainError::NotArrived))
    }
}

impl From<ferrovs_sys::guest::memory::OutOfBounds> for ChainError {
    fn from(_: ferrovs_sys::guest::memory::OutOfBounds) -> Self {
        ChainError::OutOfMemory
    }
}

impl From<AccessError> for ChainError {
    fn from(e: AccessError) -> Self {
        match e {
            AccessError::OutOfBounds(_) => ChainError::OutOfMemory,
            AccessError::NotResident { .. } => ChainError::NotArrived,
        }
    }
}

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
    fn new(log: &'a DirtyLog, used: Option<u64>, stats: Option<&'a QueueStats>) -> Logging<'a> {
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
fn mark_used_entries<M: Marker>(m: &mut M, size: u16, old: u16, new: u16) {
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

/// Walks one descriptor chain, direct or through one indirect table, with a budget that
/// bounds it however the guest links descriptors.
struct Chain<'a> {
    ring: &'a SplitRing,
    mem: &'a GuestMemory,
    indirect: Option<(u64, u32)>,
    next: Option<u16>,
    budget: u32,
    first: bool,
    indirect_ok: bool,
}

impl<'a> Chain<'a> {
    fn new(ring: &'a SplitRing, head: u16, indirect_ok: bool) -> Chain<'a> {
        Chain {
            ring,
            mem: ring.mem(),
            indirect: None,
            next: Some(head),
            budget: ring.size() as u32,
            first: true,
            indirect_ok,
        }
    }

    #[inline(always)]
    fn next(&mut self) -> Result<Option<Descriptor>, ChainError> {
        let Some(i) = self.next else { return Ok(None) };
        if self.budget == 0 {
            return Err(ChainError::Loop);
        }
        self.budget -= 1;
        let d = match self.indirect {
            None => self.ring.desc(i).ok_or(ChainError::BadIndex)?,
            Some((table, count)) => {
                if i as u32 >= count {
                    return Err(ChainError::BadIndex);
                }
                Descriptor::from_bytes(&self.mem.read_obj::<16>(table + 16 * i as u64)?)
            }
        };
        let first = std::mem::replace(&mut self.first, false);
        if d.flags & VRING_DESC_F_INDIRECT != 0 {
            let count = d.len / 16;
            if !first
                || !self.indirect_ok
                || self.indirect.is_some()
                || d.flags & VRING_DESC_F_NEXT != 0
                || d.len % 16 != 0
                || count == 0
                || count > 65536
            {
                return Err(ChainError::BadIndirect);
            }
            self.mem.check_range(d.addr, d.len as u64)?;
            self.indirect = Some((d.addr, count));
            self.budget = count;
            self.next = Some(0);
            return self.next();
        }
        self.next = (d.flags & VRING_DESC_F_NEXT != 0).then_some(d.next);
        Ok(Some(d))
    }
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
fn prefetch_burst(ring: &SplitRing, from: u16, n: usize, write: bool) -> u32 {
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
            mem.prefetch_range(d.addr, u64::from(d.len), BURST_PREFETCH_BYTES / 64, write);
            longest = longest.max(d.len);
        }
    }
    longest
}

/// Bytes of a chain's first buffer the burst prefetch covers (two lines).
const BURST_PREFETCH_BYTES: u64 = 128;

/// Most of a large packet prefetched ahead of its copy (a 1518-byte frame and its header).
const AHEAD_PREFETCH_BYTES: u64 = 1536;

/// Software pipelining for large packets: while one packet is copied, starts loading the
/// rest (past what the burst prefetch took) of the next chain's first buffer, `len` bytes
/// of it: a 1518-byte frame is 24 lines, and a copy that finds them cold waits for each
/// (guest TX: loads of lines the guest just wrote on another core; guest RX: stores that
/// first need the lines owned, `write`). Chain `slot` is only guessed to be the next one
/// used (mergeable buffers may take more): a wrong guess costs a few useless prefetches.
#[inline(always)]
fn prefetch_ahead(ring: &SplitRing, slot: u16, len: u64, write: bool) {
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

/// Guest notification coalescing of one queue (as `ethtool -C` `rx-usecs`/`rx-frames`):
/// notify the guest at most once per `frames` packets or `usecs` microseconds, whichever
/// comes first. `usecs == 0`: off (one notification per burst, if the guest asked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Coalesce {
    pub usecs: u32,
    /// 0: no packet limit (time only).
    pub frames: u32,
}

impl Coalesce {
    pub fn is_on(&self) -> bool {
        self.usecs > 0
    }
}

/// One virtqueue.
#[derive(Debug, Default)]
pub struct VirtQueue {
    pub(crate) state: VringState,
    ring: Option<SplitRing>,
    pub(crate) kick: Option<OwnedFd>,
    pub(crate) call: Option<OwnedFd>,
    pub(crate) err: Option<OwnedFd>,
    /// Set when the guest broke the ring; cleared when the frontend re-initialises it.
    pub(crate) broken: Option<ChainError>,
    features: u64,
    hdr_len: usize,
    /// What the guest may ask of us in the headers of the packets it sends (`vnet::caps`).
    tx_caps: u8,
    /// What the guest accepts in the headers of the packets it receives (`vnet::caps`).
    rx_caps: u8,
    /// Cached `avail.idx` (re-read only when exhausted).
    avail_cache: u16,
    coalesce: Coalesce,
    /// `coalesce.usecs` in TSC cycles.
    coalesce_tsc: u64,
    /// `used.idx` when the guest was last considered for a notification (the `old` of the
    /// EVENT_IDX test, as DPDK's `signalled_used`): a deferred notification covers every
    /// entry since.
    signalled_used: u16,
    /// TSC of the first used entry whose notification is deferred; 0: none deferred.
    deferred_since: u64,
    /// Packets whose notification is deferred.
    deferred_pkts: u32,
    /// The frontend's dirty log (SET_LOG_BASE); used while `log_all`.
    log: Option<Arc<DirtyLog>>,
    /// VHOST_F_LOG_ALL negotiated: the frontend is migrating the VM.
    log_all: bool,
    /// Guest-physical address of the used ring when the frontend gave none for the log.
    used_gpa: Option<u64>,
    /// Postcopy: the ring was placed in a memory whose pages may be missing; its first burst
    /// reads `used.idx` once the ring's pages are there (the control thread never touches it).
    pending_sync: bool,
    /// Why the last [`VirtQueue::enqueue`] placed fewer packets than it was given.
    shortfall: Option<DropReason>,
}

/// What became of one chain the guest sent.
enum Taken {
    /// A packet of this many bytes is in the buffer.
    Packet(usize),
    /// Larger than the buffer can hold.
    TooBig,
    /// Its virtio-net header asks for what was not negotiated or does not fit the packet.
    BadOffload,
    /// A TSO packet and no large buffer left.
    NoLargeBuffer,
}

impl VirtQueue {
    /// The ring's plain state (configuration and position).
    pub fn state(&self) -> VringState {
        self.state
    }

    /// Configures a stopped ring from plain state (a mock guest's or a fuzzer's ring; the
    /// device configures its queues through vhost-user requests or [`crate::state`]).
    /// [`VirtQueue::start`] places it.
    pub fn configure(&mut self, state: VringState) {
        self.state = state;
    }

    /// Why the guest broke the ring, if it did.
    pub fn broken(&self) -> Option<ChainError> {
        self.broken
    }

    /// The kick eventfd (None: the frontend polls, or the ring is stopped).
    pub fn kick(&self) -> Option<BorrowedFd<'_>> {
        self.kick.as_ref().map(|f| f.as_fd())
    }

    /// The kick, call and err fds (for handing them over).
    pub fn fds(&self) -> [Option<BorrowedFd<'_>>; 3] {
        [&self.kick, &self.call, &self.err].map(|f| f.as_ref().map(|f| f.as_fd()))
    }

    /// Applies negotiated features (header length, mergeable buffers, EVENT_IDX).
    pub fn set_features(&mut self, f: u64) {
        self.features = f;
        self.log_all = f & features::VHOST_F_LOG_ALL != 0;
        self.hdr_len = features::net_hdr_len(f);
        self.tx_caps = features::guest_tx_caps(f);
        self.rx_caps = features::guest_rx_caps(f);
    }

    /// What the guest accepts on this (receive) queue: `vnet::caps` bits.
    pub fn rx_caps(&self) -> u8 {
        self.rx_caps
    }

    fn event_idx(&self) -> bool {
        self.features & features::VIRTIO_RING_F_EVENT_IDX != 0
    }

    fn mrg(&self) -> bool {
        self.features & features::VIRTIO_NET_F_MRG_RXBUF != 0
    }

    fn indirect_ok(&self) -> bool {
        self.features & features::VIRTIO_RING_F_INDIRECT_DESC != 0
    }

    /// Whether the datapath may use the ring. While the frontend logs (`LOG_ALL`) it must have
    /// given us a usable log.
    #[inline]
    pub fn ready(&self) -> bool {
        self.ring.is_some()
            && self.state.enabled
            && self.broken.is_none()
            && (!self.log_all || self.log.is_some())
    }

    /// Sets (or removes) the frontend's dirty log.
    pub fn set_log(&mut self, log: Option<Arc<DirtyLog>>) {
        self.log = log;
    }

    /// The log to mark while the frontend logs.
    #[inline]
    fn logging(&self) -> Option<&Arc<DirtyLog>> {
        if self.log_all {
            self.log.as_ref()
        } else {
            None
        }
    }

    /// Guest-physical address of the used ring for the log.
    fn used_log_addr(&self) -> Option<u64> {
        self.state.log_addr.or(self.used_gpa)
    }

    /// Logs a write to bytes `[off, off + len)` of the used ring made outside a burst.
    fn log_used_now(&self, off: u64, len: u64) {
        if let Some(log) = self.logging() {
            Logging::new(log, self.used_log_addr(), None).mark_used(off, len);
        }
    }

    /// Why the last enqueue placed fewer packets than given (`guest_no_rx_buffers` unless it
    /// was something else).
    pub fn shortfall(&self) -> DropReason {
        self.shortfall.unwrap_or(DropReason::GuestNoBuffers)
    }

    /// Places the ring in `mem` if it is configured and started. Called when the kick fd
    /// arrives and when the memory table changes.
    pub fn start(&mut self, mem: Option<&Arc<GuestMemory>>) -> Result<(), RingError> {
        self.ring = None;
        let (Some(mem), Some(addrs), true) = (mem, self.state.addrs, self.state.kicked) else {
            return Ok(());
        };
        let ring = SplitRing::new(mem.clone(), addrs, self.state.size)?;
        self.used_gpa = mem.uaddr_to_gpa(addrs.used);
        self.deferred_since = 0;
        self.deferred_pkts = 0;
        self.avail_cache = self.state.last_avail;
        self.broken = None;
        self.pending_sync = mem.in_postcopy();
        if !self.pending_sync {
            self.sync(&ring);
        }
        self.ring = Some(ring);
        Ok(())
    }

    /// Takes the ring's position from guest memory when it starts.
    fn sync(&mut self, ring: &SplitRing) {
        // Start from the guest's view of the used ring (as DPDK does): after a reconnect the
        // frontend restores last_avail from GET_VRING_BASE and used.idx is in guest memory.
        self.state.used_idx = ring.used_idx();
        self.signalled_used = self.state.used_idx;
        if self.event_idx() {
            // We poll: place avail_event just behind us once. The guest kicks only when its
            // index crosses it (once per 65536 buffers); rewriting it every burst would bounce
            // its cache line between the cores for nothing.
            ring.set_avail_event(self.state.last_avail.wrapping_sub(1));
            self.log_used_now(4 + 8 * u64::from(ring.size()), 2);
        } else {
            // We poll: ask the guest not to kick.
            ring.set_used_flags(VRING_USED_F_NO_NOTIFY);
            self.log_used_now(0, 2);
        }
        self.pending_sync = false;
    }

    /// Postcopy: whether the ring's own pages are present (asking for those that are not),
    /// and its deferred start done. Free outside postcopy.
    #[inline]
    fn ring_usable(&mut self, ring: &SplitRing) -> bool {
        let mem = ring.mem();
        if !self.pending_sync && !mem.in_postcopy() {
            return true;
        }
        let (Some(a), n) = (self.state.addrs, u64::from(ring.size())) else {
            return false;
        };
        let present = mem.check_resident_uaddr(a.desc, 16 * n).is_ok()
            && mem.check_resident_uaddr(a.avail, 6 + 2 * n).is_ok()
            && mem.check_resident_uaddr(a.used, 6 + 8 * n).is_ok();
        if !present {
            return false;
        }
        if self.pending_sync {
            self.sync(ring);
        }
        true
    }

    /// Re-reads the ring position from guest memory: `used.idx` is authoritative, and at a
    /// burst boundary every available entry we consumed has its used entry (we complete in
    /// order, one used element per chain), so `last_avail == used.idx`. Used after a hot
    /// upgrade rolled back, when another process may have moved the ring on.
    pub fn resync(&mut self) {
        if self.pending_sync {
            return;
        }
        if let Some(ring) = &self.ring {
            let u = ring.used_idx();
            self.state.used_idx = u;
            self.state.last_avail = u;
            self.avail_cache = u;
            self.signalled_used = u;
            self.deferred_since = 0;
            self.deferred_pkts = 0;
        }
    }

    /// Asks the guest to kick on its next available buffer (interrupt mode, before the PMD
    /// sleeps): `avail_event = last_avail` with EVENT_IDX, else clear NO_NOTIFY. The caller
    /// must then fence and re-check [`VirtQueue::has_pending`]: a buffer published before the
    /// guest saw this request would otherwise never be kicked (the guest writes its index,
    /// fences, reads our request; we write the request, fence, read its index: one of the two
    /// sees the other's write).
    pub fn enable_kicks(&self) -> bool {
        let Some(ring) = &self.ring else { return false };
        if self.pending_sync {
            // Postcopy, ring pages not seen yet: keep polling (`has_pending` says so).
            return false;
        }
        if self.event_idx() {
            ring.set_avail_event(self.state.last_avail);
            self.log_used_now(4 + 8 * u64::from(ring.size()), 2);
        } else {
            ring.set_used_flags(0);
            self.log_used_now(0, 2);
        }
        true
    }

    /// Back to polling: no kicks wanted.
    pub fn disable_kicks(&self) {
        if let Some(ring) = &self.ring {
            if self.pending_sync {
                return;
            }
            if self.event_idx() {
                ring.set_avail_event(self.state.last_avail.wrapping_sub(1));
                self.log_used_now(4 + 8 * u64::from(ring.size()), 2);
            } else {
                ring.set_used_flags(VRING_USED_F_NO_NOTIFY);
                self.log_used_now(0, 2);
            }
        }
    }

    /// Whether the guest made buffers available that we have not consumed (or, in postcopy,
    /// the ring's pages have not been seen yet: it must be polled, not slept on).
    pub fn has_pending(&self) -> bool {
        self.ring
            .as_ref()
            .is_some_and(|r| self.pending_sync || r.avail_idx() != self.state.last_avail)
    }

    /// Whether the ring is placed (started) in guest memory.
    pub fn started(&self) -> bool {
        self.ring.is_some()
    }

    /// Stops the ring (GET_VRING_BASE, reset, disconnect) and returns its plain state.
    pub fn stop(&mut self, stats: &QueueStats) -> VringState {
        // A deferred notification is made now: the guest must not wait for a timer that
        // will no longer run for this ring.
        self.flush(stats);
        self.ring = None;
        self.kick = None;
        self.state.kicked = false;
        self.broken = None;
        self.state
    }

    /// Marks the ring broken by a guest error (once) and counts it.
    #[cold]
    fn mark_broken(&mut self, e: ChainError, stats: &QueueStats, name: &str) {
        stats.drop(e.reason(), 1);
        if self.broken.is_none() {
            log::warn!(
                "{name}: queue {}: guest error: {e}; queue disabled until reset",
                self.index_hint()
            );
        }
        self.broken = Some(e);
    }

    fn index_hint(&self) -> String {
        self.state
            .addrs
            .map(|a| format!("ring@{:#x}", a.desc))
            .unwrap_or_default()
    }

    /// After a burst: if an access hit a truncated guest memory file (SIGBUS, survived on a
    /// zero page by `ferrovs_sys::guest::sigbus`), the data of this burst is garbage and the ring
    /// cannot be trusted: break the queue.
    #[inline]
    fn check_fault(&mut self, ring: &SplitRing, stats: &QueueStats, name: &str) {
        if self.broken.is_none() && ring.mem().faulted() {
            self.mark_broken(ChainError::MemoryFault, stats, name);
        }
        if self.broken.is_none() && self.logging().is_some_and(|l| l.faulted()) {
            self.mark_broken(ChainError::LogFault, stats, name);
        }
    }

    /// Sets notification coalescing (control plane; takes effect at the next burst). Turning
    /// it off makes a deferred notification at once.
    pub fn set_coalesce(&mut self, c: Coalesce, stats: &QueueStats) {
        self.coalesce = c;
        self.coalesce_tsc = u64::from(c.usecs) * os::tsc_hz() / 1_000_000;
        if !c.is_on() {
            self.flush(stats);
        }
    }

    pub fn coalesce(&self) -> Coalesce {
        self.coalesce
    }

    /// After a burst moved the used index from `old`: notify the guest now, or defer (when
    /// coalescing and neither bound is reached yet).
    #[inline]
    fn notify(&mut self, ring: &SplitRing, old: u16, stats: &QueueStats) {
        let new = self.state.used_idx;
        if old == new {
            return;
        }
        if self.coalesce.is_on() {
            let now = os::rdtsc();
            if self.deferred_since == 0 {
                self.deferred_since = now.max(1);
            }
            self.deferred_pkts = self
                .deferred_pkts
                .saturating_add(u32::from(new.wrapping_sub(old)));
            let frames_due =
                self.coalesce.frames != 0 && self.deferred_pkts >= self.coalesce.frames;
            if !frames_due && now.wrapping_sub(self.deferred_since) < self.coalesce_tsc {
                stats
                    .calls_coalesced
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return;
            }
        }
        self.signal(ring, stats);
    }

    /// Notifies the guest of every used entry since the last notification decision, if it
    /// asked for that (EVENT_IDX `used_event`, else the NO_INTERRUPT flag).
    fn signal(&mut self, ring: &SplitRing, stats: &QueueStats) {
        use std::sync::atomic::Ordering::Relaxed;
        let (old, new) = (self.signalled_used, self.state.used_idx);
        self.signalled_used = new;
        self.deferred_since = 0;
        self.deferred_pkts = 0;
        if old == new {
            return;
        }
        vring::fence();
        let want = if self.event_idx() {
            vring::need_event(ring.used_event(), new, old)
        } else {
            ring.avail_flags() & VRING_AVAIL_F_NO_INTERRUPT == 0
        };
        match &self.call {
            Some(call) if want => {
                // A full pipe or a closed peer only loses this notification.
                let _ = os::notify(call.as_fd());
                stats.calls.fetch_add(1, Relaxed);
            }
            _ => {
                stats.calls_suppressed.fetch_add(1, Relaxed);
            }
        }
    }

    /// TSC by which the deferred notification is due; `None` if none is deferred.
    #[inline]
    pub fn deferred_until(&self) -> Option<u64> {
        (self.deferred_since != 0).then(|| self.deferred_since.wrapping_add(self.coalesce_tsc))
    }

    /// Makes the deferred notification if it is due at TSC `now` (the PMD's timer). Returns
    /// whether one is still deferred.
    #[inline]
    pub fn flush_due(&mut self, now: u64, stats: &QueueStats) -> bool {
        match self.deferred_until() {
            None => false,
            Some(t) if now.wrapping_sub(t) as i64 >= 0 => {
                self.flush(stats);
                false
            }
            Some(_) => true,
        }
    }

    /// Makes a deferred notification now (before a PMD sleeps, when the ring stops).
    pub fn flush(&mut self, stats: &QueueStats) {
        if self.deferred_since != 0 {
            if let Some(ring) = self.ring.take() {
                self.signal(&ring, stats);
                self.ring = Some(ring);
            }
            self.deferred_since = 0;
            self.deferred_pkts = 0;
        }
    }

    /// Number of available entries not yet consumed, validated against the ring size.
    #[inline]
    fn pending(&mut self, ring: &SplitRing) -> Result<u16, ChainError> {
        let mut n = self.avail_cache.wrapping_sub(self.state.last_avail);
        if n == 0 {
            self.avail_cache = ring.avail_idx();
            n = self.avail_cache.wrapping_sub(self.state.last_avail);
        }
        if n > ring.size() {
            return Err(ChainError::BadAvailIdx);
        }
        Ok(n)
    }

    /// Guest TX: moves up to `max` packets from the ring into buffers from `pool`, appended
    /// to `out` (which must have room). Returns how many were added.
    pub fn dequeue<'p>(
        &mut self,
        pool: &'p Pool,
        out: &mut Vec<Mbuf<'p>>,
        max: usize,
        stats: &QueueStats,
        name: &str,
    ) -> usize {
        let Some(ring) = self.ring.take() else {
            return 0;
        };
        let r = if !self.ring_usable(&ring) {
            0
        } else if let Some(log) = self.logging().cloned() {
            let mut m = Logging::new(&log, self.used_log_addr(), Some(stats));
            self.dequeue_ring(&ring, pool, out, max, stats, name, &mut m)
        } else {
            self.dequeue_ring(&ring, pool, out, max, stats, name, &mut NoLog)
        };
        self.check_fault(&ring, stats, name);
        self.ring = Some(ring);
        r
    }

    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn dequeue_ring<'p, M: Marker>(
        &mut self,
        ring: &SplitRing,
        pool: &'p Pool,
        out: &mut Vec<Mbuf<'p>>,
        max: usize,
        stats: &QueueStats,
        name: &str,
        marker: &mut M,
    ) -> usize {
        if self.broken.is_some() {
            return 0;
        }
        let avail = match self.pending(ring) {
            Ok(n) => n as usize,
            Err(e) => {
                self.mark_broken(e, stats, name);
                return 0;
            }
        };
        let n = avail.min(max).min(out.capacity() - out.len());
        let ahead =
            prefetch_burst(ring, self.state.last_avail, n, false) as u64 > BURST_PREFETCH_BYTES;
        let old_used = self.state.used_idx;
        let (mut pkts, mut bytes, mut oversize, mut runts) = (0u64, 0u64, 0u64, 0u64);
        let (mut bad_offload, mut no_large) = (0u64, 0u64);
        for _ in 0..n {
            let Some(mut m) = pool.alloc() else {
                stats.drop(DropReason::NoMbuf, 1);
                break;
            };
            let head = ring.avail_entry(self.state.last_avail);
            if ahead {
                prefetch_ahead(ring, self.state.last_avail.wrapping_add(1), u64::MAX, false);
            }
            let res = self.copy_chain_out(ring, head, pool, &mut m);
            if matches!(res, Err(ChainError::NotArrived)) {
                // Postcopy: the chain stays available; its page is being fetched.
                break;
            }
            ring.write_used(self.state.used_idx, head, 0);
            self.state.used_idx = self.state.used_idx.wrapping_add(1);
            self.state.last_avail = self.state.last_avail.wrapping_add(1);
            match res {
                Ok(Taken::Packet(len)) if len >= 14 => {
                    m.truncate(len);
                    pkts += 1;
                    bytes += len as u64;
                    out.push(m);
                }
                Ok(Taken::Packet(_)) => runts += 1,
                Ok(Taken::TooBig) => oversize += 1,
                Ok(Taken::BadOffload) => bad_offload += 1,
                Ok(Taken::NoLargeBuffer) => no_large += 1,
                Err(e) => {
                    self.mark_broken(e, stats, name);
                    break;
                }
            }
        }
        stats.drop(DropReason::BadOffload, bad_offload);
        stats.drop(DropReason::NoMbuf, no_large);
        ring.publish_used(self.state.used_idx);
        mark_used_entries(marker, ring.size(), old_used, self.state.used_idx);
        self.notify(ring, old_used, stats);
        stats.add(pkts, bytes);
        stats.drop(DropReason::Oversize, oversize);
        stats.drop(DropReason::Runt, runts);
        pkts as usize
    }

    /// Reads the virtio-net header of chain `head` (its first bytes, usually all in the first
    /// descriptor). Errors are left to the copy that follows, which walks the same chain.
    #[inline(always)]
    fn peek_header(&self, ring: &SplitRing, head: u16) -> Option<VnetHdr> {
        let mem = ring.mem();
        let mut chain = Chain::new(ring, head, self.indirect_ok());
        let mut b = [0u8; vnet::HDR_LEN];
        let mut got = 0;
        while got < vnet::HDR_LEN {
            let d = chain.next().ok()??;
            let n = (d.len as usize).min(vnet::HDR_LEN - got);
            mem.read(d.addr, &mut b[got..got + n]).ok()?;
            got += n;
        }
        Some(VnetHdr::from_bytes(&b))
    }

    /// Checks a header the guest sent against what was negotiated: `None` if it asks for
    /// something else. Flags not negotiated are ignored (a driver may leave stale bits).
    #[inline(always)]
    fn accept_header(&self, h: VnetHdr) -> Option<VnetHdr> {
        let mut h = h;
        if self.tx_caps & caps::CSUM == 0 {
            return Some(VnetHdr::default());
        }
        h.flags &= vnet::F_NEEDS_CSUM;
        if h.gso() == vnet::GSO_NONE {
            h.gso_type = vnet::GSO_NONE;
            h.gso_size = 0;
            return Some(h);
        }
        // Segmentation needs the partial checksum (the segments' checksums are recomputed).
        (h.needs_csum() && h.gso_size != 0 && caps::accepts(self.tx_caps, &h)).then_some(h)
    }

    /// Copies the packet of chain `head` (after the virtio-net header) into `m`, with the
    /// offload metadata of its header; a TSO packet goes into a large buffer instead.
    #[inline(always)]
    fn copy_chain_out<'p>(
        &self,
        ring: &SplitRing,
        head: u16,
        pool: &'p Pool,
        m: &mut Mbuf<'p>,
    ) -> Result<Taken, ChainError> {
        let mem = ring.mem();
        let mut hdr = VnetHdr::default();
        let mut refused = false;
        if self.tx_caps != 0 {
            match self.peek_header(ring, head).map(|h| self.accept_header(h)) {
                Some(Some(h)) => hdr = h,
                Some(None) => refused = true,
                None => {}
            }
            if hdr.gso() != vnet::GSO_NONE {
                match pool.alloc_large() {
                    Some(l) => *m = l,
                    None => refused = true,
                }
            }
        }
        let max = m.max_data();
        let buf = m.fill(max).ok_or(ChainError::BadIndex)?;
        let mut chain = Chain::new(ring, head, self.indirect_ok());
        let mut skip = self.hdr_len as u64;
        let mut len = 0usize;
        let mut too_big = false;
        while let Some(d) = chain.next()? {
            if d.flags & VRING_DESC_F_WRITE != 0 {
                return Err(ChainError::WrongDirection);
            }
            let s = skip.min(d.len as u64);
            skip -= s;
            let (addr, dlen) = (d.addr.wrapping_add(s), (d.len as u64 - s) as usize);
            if dlen == 0 {
                mem.check_range(d.addr, d.len as u64)?;
                continue;
            }
            if refused || too_big || len + dlen > max {
                too_big = !refused;
                mem.check_range(addr, dlen as u64)?;
                continue;
            }
            mem.read(addr, &mut buf[len..len + dlen])?;
            len += dlen;
        }
        if refused {
            let gso = hdr.gso() != vnet::GSO_NONE;
            return Ok(
                if gso && !m.is_large() && self.accept_header(hdr).is_some() {
                    Taken::NoLargeBuffer
                } else {
                    Taken::BadOffload
                },
            );
        }
        if too_big {
            return Ok(Taken::TooBig);
        }
        if hdr.needs_csum() && usize::from(hdr.csum_start) + usize::from(hdr.csum_offset) + 2 > len
        {
            return Ok(Taken::BadOffload);
        }
        m.vnet = hdr;
        Ok(Taken::Packet(len))
    }

    /// Guest RX: copies packets into the guest's receive buffers (mergeable when negotiated).
    /// Returns how many packets were delivered; the caller counts the rest as dropped.
    ///
    /// Each packet comes with its offload metadata, which must be what the guest accepts
    /// ([`VirtQueue::rx_caps`]: the caller did the rest in software); a packet whose metadata
    /// the guest does not take (its features changed under the caller) stops the burst there
    /// and is refused, like one for which the guest has no buffers.
    pub fn enqueue<'a, I>(&mut self, pkts: I, stats: &QueueStats, name: &str) -> usize
    where
        I: IntoIterator<Item = (&'a [u8], VnetHdr)>,
    {
        self.shortfall = None;
        let Some(ring) = self.ring.take() else {
            return 0;
        };
        let r = if !self.ring_usable(&ring) {
            self.shortfall = Some(DropReason::PostcopyPending);
            0
        } else if let Some(log) = self.logging().cloned() {
            let mut m = Logging::new(&log, self.used_log_addr(), Some(stats));
            self.enqueue_ring(&ring, pkts, stats, name, &mut m)
        } else {
            self.enqueue_ring(&ring, pkts, stats, name, &mut NoLog)
        };
        self.check_fault(&ring, stats, name);
        self.ring = Some(ring);
        r
    }

    #[inline]
    fn enqueue_ring<'a, I, M: Marker>(
        &mut self,
        ring: &SplitRing,
        pkts: I,
        stats: &QueueStats,
        name: &str,
        marker: &mut M,
    ) -> usize
    where
        I: IntoIterator<Item = (&'a [u8], VnetHdr)>,
    {
        if self.broken.is_some() {
            return 0;
        }
        let old_used = self.state.used_idx;
        let (mut sent, mut bytes) = (0u64, 0u64);
        if let Ok(avail) = self.pending(ring) {
            prefetch_burst(
                ring,
                self.state.last_avail,
                (avail as usize).min(BURST),
                true,
            );
        }
        let mut pkts = pkts.into_iter().peekable();
        // Large packets (judged by the first) are prefetched one ahead of their copy.
        let ahead = pkts
            .peek()
            .is_some_and(|(p, _)| (self.hdr_len + p.len()) as u64 > BURST_PREFETCH_BYTES);
        while let Some((pkt, hdr)) = pkts.next() {
            if ahead {
                if let Some((next, _)) = pkts.peek() {
                    let len = (self.hdr_len + next.len()) as u64;
                    prefetch_ahead(ring, self.state.last_avail.wrapping_add(1), len, true);
                }
            }
            if hdr.is_offload() && !caps::accepts(self.rx_caps, &hdr) {
                stats.drop(DropReason::OffloadRefused, 1);
                break;
            }
            match self.enqueue_one(ring, pkt, &hdr, marker) {
                Ok(true) => {
                    sent += 1;
                    bytes += pkt.len() as u64;
                }
                Ok(false) => break,
                Err(ChainError::NotArrived) => {
                    self.shortfall = Some(DropReason::PostcopyPending);
                    break;
                }
                Err(e) => {
                    self.mark_broken(e, stats, name);
                    break;
                }
            }
        }
        ring.publish_used(self.state.used_idx);
        mark_used_entries(marker, ring.size(), old_used, self.state.used_idx);
        self.notify(ring, old_used, stats);
        stats.add(sent, bytes);
        sent as usize
    }

    /// Places one packet; `Ok(false)` when the guest has too few buffers (nothing consumed).
    #[inline(always)]
    fn enqueue_one<M: Marker>(
        &mut self,
        ring: &SplitRing,
        pkt: &[u8],
        vnet: &VnetHdr,
        marker: &mut M,
    ) -> Result<bool, ChainError> {
        let (saved_avail, saved_used) = (self.state.last_avail, self.state.used_idx);
        let r = self.place_one(ring, pkt, vnet, marker);
        if matches!(r, Err(ChainError::NotArrived)) {
            // Postcopy: nothing was handed to the guest; the buffers stay available.
            self.roll_back(ring, saved_avail, saved_used, marker);
        }
        r
    }

    /// Takes back a packet placed in part: its buffers stay available and `used.idx` never
    /// covered it. The used entries already written for its first buffers stay in guest
    /// memory (beyond `used.idx`, unread) and are logged like every other write: the
    /// destination's copy of the ring must be the same bytes.
    #[inline]
    fn roll_back<M: Marker>(
        &mut self,
        ring: &SplitRing,
        saved_avail: u16,
        saved_used: u16,
        marker: &mut M,
    ) {
        mark_used_entries(marker, ring.size(), saved_used, self.state.used_idx);
        self.state.last_avail = saved_avail;
        self.state.used_idx = saved_used;
    }

    #[inline(always)]
    fn place_one<M: Marker>(
        &mut self,
        ring: &SplitRing,
        pkt: &[u8],
        vnet: &VnetHdr,
        marker: &mut M,
    ) -> Result<bool, ChainError> {
        let mem = ring.mem();
        let mrg = self.mrg();
        let hdr_len = self.hdr_len;
        let total = hdr_len + pkt.len();
        let (saved_avail, saved_used) = (self.state.last_avail, self.state.used_idx);
        let mut hdr = [0u8; 12];
        if vnet.is_offload() {
            hdr[..vnet::HDR_LEN].copy_from_slice(&vnet.to_bytes());
        }
        let mut single = false;
        let mut written = 0usize;
        let mut nbufs = 0u16;
        let mut hdr_addr = None;
        while written < total {
            if self.pending(ring)? == 0 {
                self.roll_back(ring, saved_avail, saved_used, marker);
                return Ok(false);
            }
            let head = ring.avail_entry(self.state.last_avail);
            self.state.last_avail = self.state.last_avail.wrapping_add(1);
            let mut chain = Chain::new(ring, head, self.indirect_ok());
            let mut in_buf = 0usize;
            while let Some(d) = chain.next()? {
                if d.flags & VRING_DESC_F_WRITE == 0 {
                    return Err(ChainError::WrongDirection);
                }
                let mut addr = d.addr;
                let mut room = d.len as usize;
                if hdr_addr.is_none() {
                    if room < hdr_len {
                        return Err(ChainError::OutOfMemory);
                    }
                    if mrg && room >= total {
                        // The common case: one buffer; num_buffers = 1 goes out with the header.
                        hdr[10] = 1;
                        single = true;
                    }
                    hdr_addr = Some(addr);
                }
                if written == 0 && room >= total {
                    // The common case: header and packet in one buffer, one translation.
                    mem.write_pair(addr, &hdr[..hdr_len], pkt)?;
                    marker.mark(addr, total as u64);
                    written = total;
                    in_buf = total;
                    room = 0;
                }
                while room > 0 && written < total {
                    let n = if written < hdr_len {
                        let n = (hdr_len - written).min(room);
                        mem.write(addr, &hdr[written..written + n])?;
                        n
                    } else {
                        let off = written - hdr_len;
                        let n = (pkt.len() - off).min(room);
                        mem.write(addr, &pkt[off..off + n])?;
                        n
                    };
                    marker.mark(addr, n as u64);
                    written += n;
                    in_buf += n;
                    room -= n;
                    addr += n as u64;
                }
                if written == total && mrg {
                    break;
                }
            }
            if !mrg && written < total {
                // One chain must hold the whole packet without mergeable buffers.
                self.roll_back(ring, saved_avail, saved_used, marker);
                return Ok(false);
            }
            ring.write_used(self.state.used_idx, head, in_buf as u32);
            self.state.used_idx = self.state.used_idx.wrapping_add(1);
            nbufs += 1;
        }
        if mrg && !single {
            if let Some(a) = hdr_addr {
                mem.write(a + 10, &nbufs.to_le_bytes())?;
                marker.mark(a + 10, 2);
            }
        }
        Ok(true)
    }

    /// Drains the kick eventfd (interrupt mode, later) and reports whether it fired.
    pub fn drain_kick(&self) -> bool {
        self.kick
            .as_ref()
            .is_some_and(|k| os::drain(k.as_fd()).is_ok())
    }

    /// The guest-memory the ring lives in.
    pub fn mem(&self) -> Option<&Arc<GuestMemory>> {
        self.ring.as_ref().map(|r| r.mem())
    }
}

#[cfg(test)]
mod tests {
    //! Randomised hostile rings (a deterministic fuzz pass that runs in every test run):
    //! whatever the guest writes into its descriptor table and rings, the queue never panics,
    //! never moves the used index by more than the ring holds, and either works or breaks.
    use super::*;
    use ferrovs_sys::guest::dirty_log::PAGE_SIZE;
    use ferrovs_sys::guest::memory::RegionDesc;
    use ferrovs_sys::os::memfd;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    const SIZE: u32 = 16;
    const MEM: u64 = 64 * 1024;
    const BASE: u64 = 0x1000_0000;

    fn queue(features: u64) -> (VirtQueue, Arc<GuestMemory>) {
        let fd = memfd("fuzz", MEM, false).unwrap();
        let r = RegionDesc {
            gpa: 0,
            size: MEM,
            uaddr: BASE,
            mmap_offset: 0,
        };
        let mem = Arc::new(GuestMemory::map(vec![(r, fd)]).unwrap());
        let mut vq = VirtQueue::default();
        vq.set_features(features);
        vq.state.size = SIZE;
        vq.state.addrs = Some(RingAddrs {
            desc: BASE,
            avail: BASE + 4096,
            used: BASE + 8192,
        });
        vq.state.kicked = true;
        vq.state.enabled = true;
        vq.start(Some(&mem)).unwrap();
        (vq, mem)
    }

    fn scribble(mem: &GuestMemory, rng: &mut Rng) {
        // Random descriptors: addresses mostly inside memory, sometimes anywhere.
        for i in 0..SIZE as u64 {
            let addr = match rng.next() % 4 {
                0 => rng.next(),
                _ => rng.next() % (MEM + 256),
            };
            let len = match rng.next() % 4 {
                0 => rng.next() as u32,
                _ => (rng.next() % 3000) as u32,
            };
            let flags = (rng.next() % 8) as u16;
            let next = (rng.next() % (SIZE as u64 + 2)) as u16;
            mem.write(
                16 * i,
                &Descriptor {
                    addr,
                    len,
                    flags,
                    next,
                }
                .to_bytes(),
            )
            .unwrap();
        }
        // Random avail ring entries and index; random indirect tables in the data area.
        for i in 0..SIZE as u64 {
            mem.write(
                4096 + 4 + 2 * i,
                &((rng.next() % (SIZE as u64 + 3)) as u16).to_le_bytes(),
            )
            .unwrap();
        }
        let idx = (rng.next() % 40) as u16;
        mem.write(4096 + 2, &idx.to_le_bytes()).unwrap();
        for _ in 0..32 {
            let at = 16384 + (rng.next() % 4096) * 8;
            mem.write(at, &rng.next().to_le_bytes()).unwrap();
        }
    }

    #[test]
    fn random_rings_never_panic_or_overrun() {
        let pool = Pool::new(64).unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let stats = QueueStats::default();
        let mut broken = 0;
        for round in 0..3000 {
            let features = match round % 3 {
                0 => {
                    features::VIRTIO_F_VERSION_1
                        | features::VIRTIO_NET_F_MRG_RXBUF
                        | features::VIRTIO_RING_F_INDIRECT_DESC
                }
                1 => features::VIRTIO_F_VERSION_1 | features::VIRTIO_RING_F_EVENT_IDX,
                _ => features::VIRTIO_F_VERSION_1 | features::VIRTIO_RING_F_INDIRECT_DESC,
            };
            let (mut vq, mem) = queue(features);
            scribble(&mem, &mut rng);
            let before = vq.state.used_idx;
            let mut out = Vec::with_capacity(BURST);
            if round % 2 == 0 {
                vq.dequeue(&pool, &mut out, BURST, &stats, "fuzz");
            } else {
                let pkt = vec![0xabu8; (rng.next() % 1600) as usize + 14];
                vq.enqueue(
                    (0..8).map(|_| (pkt.as_slice(), VnetHdr::default())),
                    &stats,
                    "fuzz",
                );
            }
            let moved = vq.state.used_idx.wrapping_sub(before);
            assert!(
                moved as u32 <= SIZE,
                "round {round}: used index moved by {moved}"
            );
            assert!(out.len() <= BURST);
            broken += usize::from(vq.broken.is_some());
            drop(out);
            assert_eq!(pool.available(), 64, "every buffer returned");
        }
        // The generator produces both usable and hostile rings.
        assert!(broken > 100 && broken < 3000, "broken {broken} of 3000");
    }

    /// A receive ring of `SIZE` posted 2 KiB buffers, a call eventfd, and its counters.
    fn rx_queue_with_buffers(features: u64) -> (VirtQueue, Arc<GuestMemory>, OwnedFd) {
        let (mut vq, mem) = queue(features);
        for i in 0..SIZE as u64 {
            let d = Descriptor {
                addr: 16384 + 2048 * i,
                len: 2048,
                flags: VRING_DESC_F_WRITE,
                next: 0,
            };
            mem.write(16 * i, &d.to_bytes()).unwrap();
            mem.write(4096 + 4 + 2 * i, &(i as u16).to_le_bytes())
                .unwrap();
        }
        mem.write(4096 + 2, &(SIZE as u16).to_le_bytes()).unwrap();
        let call = os::eventfd().unwrap();
        vq.call = Some(call.try_clone().unwrap());
        (vq, mem, call)
    }

    fn calls_seen(call: &OwnedFd) -> u64 {
        let mut b = [0u8; 8];
        match read_counter(call, &mut b) {
            true => u64::from_ne_bytes(b),
            false => 0,
        }
    }

    fn read_counter(fd: &OwnedFd, b: &mut [u8; 8]) -> bool {
        use std::io::Read;
        let mut f = std::fs::File::from(fd.try_clone().unwrap());
        f.read_exact(b).is_ok()
    }

    #[test]
    fn a_packet_taken_back_for_lack_of_buffers_still_logs_the_used_entries_it_wrote() {
        // Two 2 KiB mergeable buffers posted, a 5000-byte frame needs three: the first two
        // are filled and their used entries written, then the packet is taken back.
        let (mut vq, mem, _call) =
            rx_queue_with_buffers(features::VIRTIO_F_VERSION_1 | features::VIRTIO_NET_F_MRG_RXBUF);
        mem.write(4096 + 2, &2u16.to_le_bytes()).unwrap();
        let log = Arc::new(DirtyLog::map(memfd("log", 4096, false).unwrap(), 64, 0).unwrap());
        vq.set_features(vq.features | features::VHOST_F_LOG_ALL);
        vq.set_log(Some(log.clone()));
        let used_page = 8192 / PAGE_SIZE;
        let _ = log.take_word(0);
        let stats = QueueStats::default();
        let before = u64::from_le_bytes(mem.read_obj::<8>(8192 + 4).unwrap());

        let pkt = vec![0x77u8; 5000];
        let sent = vq.enqueue(
            std::iter::once((pkt.as_slice(), VnetHdr::default())),
            &stats,
            "t",
        );
        assert_eq!((sent, vq.state.used_idx, vq.state.last_avail), (0, 0, 0));
        assert_ne!(
            u64::from_le_bytes(mem.read_obj::<8>(8192 + 4).unwrap()),
            before,
            "the first used entry was written"
        );
        assert!(
            log.is_marked(used_page),
            "used entries written, then taken back, are logged"
        );
        for page in [16384 / PAGE_SIZE, (16384 + 2048) / PAGE_SIZE] {
            assert!(log.is_marked(page), "buffer page {page}");
        }
    }

    #[test]
    fn coalescing_defers_until_frames_or_time_and_never_loses_one() {
        let pkt = vec![0x5au8; 60];
        let one = || std::iter::once((pkt.as_slice(), VnetHdr::default()));
        let (mut vq, _mem, call) = rx_queue_with_buffers(features::VIRTIO_F_VERSION_1);
        let stats = QueueStats::default();
        // Off: one notification per burst (the guest asks for every one: no NO_INTERRUPT).
        assert_eq!(vq.enqueue(one(), &stats, "t"), 1);
        assert_eq!(calls_seen(&call), 1);
        // 4 packets or 1 s: three single-packet bursts wait, the fourth notifies.
        vq.set_coalesce(
            Coalesce {
                usecs: 1_000_000,
                frames: 4,
            },
            &stats,
        );
        for _ in 0..3 {
            assert_eq!(vq.enqueue(one(), &stats, "t"), 1);
            assert_eq!(calls_seen(&call), 0);
            assert!(vq.deferred_until().is_some());
        }
        assert_eq!(vq.enqueue(one(), &stats, "t"), 1);
        assert_eq!(calls_seen(&call), 1);
        assert_eq!(vq.deferred_until(), None);
        assert_eq!(
            stats
                .calls_coalesced
                .load(std::sync::atomic::Ordering::Relaxed),
            3
        );
        // Time: not before the bound, at once after it.
        assert_eq!(vq.enqueue(one(), &stats, "t"), 1);
        let due = vq.deferred_until().unwrap();
        assert!(vq.flush_due(due - 1, &stats));
        assert_eq!(calls_seen(&call), 0);
        assert!(!vq.flush_due(due, &stats));
        assert_eq!(calls_seen(&call), 1);
        // Stopping the ring (GET_VRING_BASE) makes a deferred one; so does turning it off.
        assert_eq!(vq.enqueue(one(), &stats, "t"), 1);
        vq.set_coalesce(Coalesce::default(), &stats);
        assert_eq!(calls_seen(&call), 1);
        vq.set_coalesce(
            Coalesce {
                usecs: 1_000_000,
                frames: 0,
            },
            &stats,
        );
        assert_eq!(vq.enqueue(one(), &stats, "t"), 1);
        vq.stop(&stats);
        assert_eq!(calls_seen(&call), 1);
        assert_eq!(stats.calls.load(std::sync::atomic::Ordering::Relaxed), 5);
    }

    #[test]
    fn coalesced_notifications_honour_used_event_and_no_interrupt() {
        let pkt = vec![0x5au8; 60];
        let two = || (0..2).map(|_| (pkt.as_slice(), VnetHdr::default()));
        let c = Coalesce {
            usecs: 1_000_000,
            frames: 4,
        };
        // EVENT_IDX: the guest wants a notification when used.idx passes used_event (here:
        // after entry 2, i.e. within the second burst). The deferred notification covers
        // both bursts, so it is made.
        let (mut vq, mem, call) =
            rx_queue_with_buffers(features::VIRTIO_F_VERSION_1 | features::VIRTIO_RING_F_EVENT_IDX);
        let used_event_at = 8192 + 4 + 8 * SIZE as u64;
        mem.write(used_event_at, &2u16.to_le_bytes()).unwrap();
        let stats = QueueStats::default();
        vq.set_coalesce(c, &stats);
        vq.enqueue(two(), &stats, "t");
        assert_eq!(calls_seen(&call), 0);
        vq.enqueue(two(), &stats, "t");
        assert_eq!(
            calls_seen(&call),
            1,
            "used_event 2 lies in the deferred range 0..4"
        );
        // used_event far ahead: no notification, counted as suppressed.
        mem.write(used_event_at, &100u16.to_le_bytes()).unwrap();
        vq.enqueue(two(), &stats, "t");
        vq.enqueue(two(), &stats, "t");
        assert_eq!(calls_seen(&call), 0);
        assert_eq!(
            stats
                .calls_suppressed
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        // Without EVENT_IDX, NO_INTERRUPT suppresses the deferred one too.
        let (mut vq, mem, call) = rx_queue_with_buffers(features::VIRTIO_F_VERSION_1);
        mem.write(4096, &VRING_AVAIL_F_NO_INTERRUPT.to_le_bytes())
            .unwrap();
        let stats = QueueStats::default();
        vq.set_coalesce(c, &stats);
        vq.enqueue(two(), &stats, "t");
        vq.enqueue(two(), &stats, "t");
        assert_eq!(calls_seen(&call), 0);
        assert_eq!(
            stats
                .calls_suppressed
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }
}
