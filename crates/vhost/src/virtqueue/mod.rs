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
//!   after the write, through a per-burst
//!   [`LogBatch`](ferrovs_sys::guest::dirty_log::LogBatch). The copy routines are generic
//!   over a [`Marker`]; with logging off they run with [`NoLog`], whose marks compile to
//!   nothing.
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
//!
//! The queue's code, by seam (each file opens with what it owns):
//! * this file: [`VirtQueue`] and its plain state [`VringState`], placing the ring in guest
//!   memory (start, postcopy start, resync, stop), breaking it on a guest error;
//! * `chain`: [`ChainError`] and the bounded walk of one descriptor chain;
//! * `dirty_log`: the [`Marker`]s ([`NoLog`], [`Logging`]) and the queue's dirty-log writes;
//! * `prefetch`: burst and one-ahead prefetching of guest buffers;
//! * `notify`: both directions of notification: the guest's kicks (interrupt mode) and our
//!   calls, with coalescing ([`Coalesce`]);
//! * `dequeue`: guest TX, chains into packet buffers, offload headers checked;
//! * `enqueue`: guest RX, packets into chains, mergeable buffers, postcopy roll-back.
//! * `packed`: packed rings (`VIRTIO_F_RING_PACKED`): both directions and their
//!   notifications, on the copy routines of `dequeue` and `enqueue`.
//!
//! Files only call down this list's arrows: `packed` → `dequeue`, `enqueue`; `dequeue`,
//! `enqueue` → `chain`, `prefetch`, `dirty_log`, `notify`; `notify` → `dirty_log`,
//! `packed` (its signal); all of them use this file's queue.
//!
//! Hot path: the burst functions carry `#[inline]`/`#[inline(always)]` so that each
//! [`Marker`] instantiation of a burst is one function with its marks inlined (or compiled
//! out with [`NoLog`]); code moved between these files keeps its attributes, and a helper
//! another file calls is `pub(super)`, never behind a trait object or a function pointer.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use ferrovs_sys::guest::dirty_log::DirtyLog;
use ferrovs_sys::guest::memory::GuestMemory;
use ferrovs_sys::guest::packed::PackedRing;
use ferrovs_sys::guest::vring::{
    AvailProbe, RingAddrs, RingError, SplitRing, VRING_USED_F_NO_NOTIFY,
};

use crate::features;
use crate::stats::{DropReason, QueueStats};

mod chain;
mod dequeue;
mod dirty_log;
mod enqueue;
mod notify;
mod packed;
#[cfg(test)]
mod packed_tests;
mod prefetch;
#[cfg(test)]
mod tests;

pub use chain::ChainError;
pub use dirty_log::{Logging, Marker, NoLog};
pub use notify::Coalesce;

/// Most packets one burst moves.
pub const BURST: usize = 32;

/// Plain, exportable state of a vring (what `GET_VRING_BASE` and a hot upgrade need).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VringState {
    pub size: u32,
    /// Split rings: free-running indices. Packed rings: slot in bits 0–14 and wrap counter in
    /// bit 15 (the vhost-user encoding); `used_idx == last_avail` at every burst boundary.
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

/// One virtqueue.
#[derive(Debug, Default)]
pub struct VirtQueue {
    pub(crate) state: VringState,
    ring: Option<SplitRing>,
    /// The ring when `VIRTIO_F_RING_PACKED` was negotiated (then `ring` is `None`).
    packed: Option<PackedRing>,
    /// Packed rings: guest-physical address of the descriptor ring (used descriptors are
    /// written there: the dirty log marks them).
    desc_gpa: Option<u64>,
    /// Packed rings, guest RX: the used descriptors of the packet being placed (slot, id,
    /// length), written once it is whole. Capacity reserved when the ring starts.
    shadow: Vec<(packed::Pos, u16, u32)>,
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

    /// `VIRTIO_F_IN_ORDER`: the driver may read one used entry for a batch of buffers.
    fn in_order(&self) -> bool {
        self.features & features::VIRTIO_F_IN_ORDER != 0
    }

    fn indirect_ok(&self) -> bool {
        self.features & features::VIRTIO_RING_F_INDIRECT_DESC != 0
    }

    /// Whether the datapath may use the ring. While the frontend logs (`LOG_ALL`) it must have
    /// given us a usable log.
    #[inline]
    pub fn ready(&self) -> bool {
        (self.ring.is_some() || self.packed.is_some())
            && self.state.enabled
            && self.broken.is_none()
            && (!self.log_all || self.log.is_some())
    }

    /// Places the ring in `mem` if it is configured and started. Called when the kick fd
    /// arrives and when the memory table changes.
    pub fn start(&mut self, mem: Option<&Arc<GuestMemory>>) -> Result<(), RingError> {
        self.ring = None;
        self.packed = None;
        let (Some(mem), Some(addrs), true) = (mem, self.state.addrs, self.state.kicked) else {
            return Ok(());
        };
        if self.packed_negotiated() {
            return self.start_packed(mem, addrs);
        }
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

    /// Whether the frontend negotiated packed rings.
    pub fn packed_negotiated(&self) -> bool {
        self.features & features::VIRTIO_F_RING_PACKED != 0
    }

    /// [`VirtQueue::start`] for a packed ring. A base whose slot is not below the ring size
    /// (SET_VRING_BASE or restored state) breaks the queue (`bad_avail_idx`).
    fn start_packed(&mut self, mem: &Arc<GuestMemory>, addrs: RingAddrs) -> Result<(), RingError> {
        let ring = PackedRing::new(mem.clone(), addrs, self.state.size)?;
        self.used_gpa = mem.uaddr_to_gpa(addrs.used);
        self.desc_gpa = mem.uaddr_to_gpa(addrs.desc);
        self.deferred_since = 0;
        self.deferred_pkts = 0;
        self.broken = None;
        if packed::Pos::decode(self.state.last_avail).slot >= ring.size() {
            self.broken = Some(ChainError::BadAvailIdx);
        }
        if self.shadow.capacity() < ring.size() as usize {
            self.shadow = Vec::with_capacity(ring.size() as usize);
        }
        self.pending_sync = mem.in_postcopy();
        if !self.pending_sync {
            self.packed_sync(&ring);
        }
        self.packed = Some(ring);
        Ok(())
    }

    /// Postcopy, packed ring: whether its pages are present (asking for those that are not),
    /// and its deferred start done.
    #[inline]
    fn packed_usable(&mut self, ring: &PackedRing) -> bool {
        let mem = ring.mem();
        if !self.pending_sync && !mem.in_postcopy() {
            return true;
        }
        let Some(a) = self.state.addrs else {
            return false;
        };
        let present = mem
            .check_resident_uaddr(a.desc, 16 * u64::from(ring.size()))
            .is_ok()
            && mem.check_resident_uaddr(a.avail, 4).is_ok()
            && mem.check_resident_uaddr(a.used, 4).is_ok();
        if !present {
            return false;
        }
        if self.pending_sync {
            self.packed_sync(ring);
        }
        true
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

    /// Whether the ring is placed (started) in guest memory.
    pub fn started(&self) -> bool {
        self.ring.is_some() || self.packed.is_some()
    }

    /// Stops the ring (GET_VRING_BASE, reset, disconnect) and returns its plain state.
    pub fn stop(&mut self, stats: &QueueStats) -> VringState {
        // A deferred notification is made now: the guest must not wait for a timer that
        // will no longer run for this ring.
        self.flush(stats);
        self.ring = None;
        self.packed = None;
        self.kick = None;
        self.state.kicked = false;
        self.broken = None;
        self.state
    }

    /// Marks the ring broken by a guest error (once) and counts it.
    #[cold]
    fn mark_broken(&mut self, e: ChainError, stats: &QueueStats) {
        // No log line here: this runs on a PMD thread (no allocation, no blocking write to
        // stderr); the drop reason counts it and the control thread logs the broken queue
        // through its rate limiter (`port-stats` shows it).
        stats.drop(e.reason(), 1);
        self.broken = Some(e);
    }

    /// After a burst: if an access hit a truncated guest memory file (SIGBUS, survived on a
    /// zero page by `ferrovs_sys::guest::sigbus`), the data of this burst is garbage and the ring
    /// cannot be trusted: break the queue.
    #[inline]
    fn check_fault(&mut self, mem: &GuestMemory, stats: &QueueStats) {
        if self.broken.is_none() && mem.faulted() {
            self.mark_broken(ChainError::MemoryFault, stats);
        }
        if self.broken.is_none() && self.logging().is_some_and(|l| l.faulted()) {
            self.mark_broken(ChainError::LogFault, stats);
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

    /// How full the ring is, as the guest left it: the descriptors it made available that the
    /// device has not taken yet (split rings: chains, from `avail.idx`; packed rings:
    /// descriptor slots, from their flags). On a guest-TX queue, packets waiting for the
    /// switch; on a guest-RX queue, empty buffers the guest has posted. None while the ring
    /// is stopped or broken, or in postcopy (the ring's page may not have arrived: the
    /// reader would wait for it). Reads guest memory: the caller holds the queue's lock,
    /// and a guest that changes the ring meanwhile gives a figure as of some instant.
    pub fn available(&self) -> Option<u16> {
        if self.broken.is_some() {
            return None;
        }
        if let Some(ring) = self.packed.as_ref() {
            if ring.mem().in_postcopy() {
                return None;
            }
            return Some(packed::available_from(
                ring,
                packed::Pos::decode(self.state.last_avail),
            ));
        }
        let ring = self.ring.as_ref()?;
        if ring.mem().in_postcopy() {
            return None;
        }
        // A guest's avail.idx more than a ring ahead is a bad ring, which the next poll
        // reports; the figure here is capped at the ring.
        Some(
            ring.avail_idx()
                .wrapping_sub(self.state.last_avail)
                .min(ring.size()),
        )
    }

    /// For a PMD that just found this queue empty: the ring's `avail.idx` handle and the
    /// next index we would take, when a later poll may rely on them alone (no lock) to see
    /// that the queue is still empty: a ring in use, not broken, nothing waiting for a
    /// resync after a hot upgrade, no postcopy migration in progress (the avail page may
    /// be missing; a memory that is not in postcopy never enters it), nothing cached
    /// pending, no notification deferred. Valid while nobody locks the queue again
    /// ([`crate::device::Queue::locks`]).
    pub fn idle_probe(&self) -> Option<(AvailProbe, u16)> {
        let ring = self.ring.as_ref()?;
        let quiet = self.broken.is_none()
            && !self.pending_sync
            && self.avail_cache == self.state.last_avail
            && self.deferred_until().is_none()
            && !ring.mem().in_postcopy();
        quiet.then(|| (ring.avail_probe(), self.state.last_avail))
    }

    /// The guest-memory the ring lives in.
    pub fn mem(&self) -> Option<&Arc<GuestMemory>> {
        self.ring
            .as_ref()
            .map(|r| r.mem())
            .or(self.packed.as_ref().map(|r| r.mem()))
    }
}
