//! The vhost-user net backend state machine.
//!
//! [`Device::handle`] takes one checked [`Request`] and applies it. The table below is the
//! contract of every request ferrovs accepts: what it changes and whether it stops the
//! datapath of a queue (those take the queue's lock, which a PMD holds for one burst at a
//! time, so a change never races a burst).
//!
//! | request | effect | datapath |
//! |---|---|---|
//! | GET/SET_FEATURES, GET/SET_PROTOCOL_FEATURES | negotiate (refuse unknown bits) | all queues locked for SET_FEATURES |
//! | SET_OWNER / RESET_OWNER / RESET_DEVICE | claim / reset the device | all queues stopped on reset |
//! | SET_MEM_TABLE | validate + map new regions, re-place rings | all queues locked |
//! | SET_VRING_NUM / ADDR / BASE | configure a stopped ring | one queue locked |
//! | SET_VRING_KICK | start the ring | one queue locked |
//! | SET_VRING_CALL / ERR | replace notification fds | one queue locked |
//! | GET_VRING_BASE | stop the ring, return last_avail_idx | one queue locked |
//! | SET_VRING_ENABLE | enable/disable a started ring | one queue locked |
//! | GET_QUEUE_NUM | report queue pairs | — |
//! | SET_LOG_BASE (fd) | map the dirty log (live migration); always answered | all queues locked |
//! | SET_FEATURES with LOG_ALL | log every guest write from now on | all queues locked |
//! | SET_VRING_ADDR with LOG | used ring's guest address for the log (allowed while running if the ring stays where it is) | one queue locked |
//! | POSTCOPY_ADVISE | open a userfaultfd, answer with it (fd) | — |
//! | POSTCOPY_LISTEN | the next memory tables are mapped for postcopy | — |
//! | SET_MEM_TABLE while listening | map + register with the userfaultfd, answer with our addresses; the memory is used after the frontend's ack (a SET_MEM_TABLE of one u64) | all queues locked (at the ack) |
//! | POSTCOPY_END | every page arrived: checks off, userfaultfd closed | — |
//! | SEND_RARP | announce the guest's MAC from its port (the daemon injects a RARP) | — |
//!
//! A request that fails leaves the device as it was and is answered with a non-zero ack when
//! the frontend asked for one (REPLY_ACK); it never affects other ports.
//!
//! Postcopy and the threads: no thread of ours but a memory's own fault thread ever stops on
//! a missing page (`ferrovs_sys::guest::memory`), so no queue lock is held across a fault and the
//! control thread never waits for a frontend to serve one.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use std::os::fd::OwnedFd;

use ferrovs_sys::guest::dirty_log::{DirtyLog, LogError};
use ferrovs_sys::guest::memory::{GuestMemory, MemoryError};
use ferrovs_sys::guest::userfault::Userfault;
use ferrovs_sys::guest::vring::{RingError, MAX_QUEUE_SIZE};
use ferrovs_sys::os;

use crate::features::{self, MAX_QUEUE_PAIRS, OFFERED, PROTOCOL_OFFERED};
use crate::msg::{self, Code, Header, Request};
use crate::stats::QueueStats;
use crate::virtqueue::{ChainError, VirtQueue, VringState};

/// Whether `FERROVS_TRACE_VHOST` asks for a log line (info) per vhost-user message.
fn trace() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("FERROVS_TRACE_VHOST").is_some())
}

/// One queue as shared between the control thread and a PMD.
#[derive(Debug, Default)]
pub struct Queue {
    pub vq: Mutex<VirtQueue>,
    pub stats: QueueStats,
    /// Hint for PMDs: skip the lock when the queue cannot be used.
    pub ready: AtomicBool,
    /// What the guest accepts of offload metadata on this queue (a receive queue):
    /// `ferrovs_sys::kernel::vnet::caps` bits, published with `ready`.
    pub rx_caps: std::sync::atomic::AtomicU8,
    /// Times the virtqueue was locked ([`Queue::lock`], [`Queue::try_lock`]; counted once
    /// held). A PMD that read it under its own lock knows, while it still reads the same
    /// value, that nobody has touched the virtqueue since: what it saw then (the ring, the
    /// next available index) still holds (`ferrovs_datapath`'s idle-queue probe).
    pub locks: std::sync::atomic::AtomicU64,
}

impl Queue {
    /// Locks for configuration (waits at most one burst).
    pub fn lock(&self) -> MutexGuard<'_, VirtQueue> {
        let g = self.vq.lock().unwrap_or_else(|p| p.into_inner());
        self.locks.fetch_add(1, Ordering::Relaxed);
        g
    }

    /// Takes the lock if free (a PMD: never waits for the control plane).
    #[inline]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, VirtQueue>> {
        let g = self.vq.try_lock().ok()?;
        self.locks.fetch_add(1, Ordering::Relaxed);
        Some(g)
    }

    fn publish_ready(&self, vq: &VirtQueue) {
        self.rx_caps.store(vq.rx_caps(), Ordering::Relaxed);
        self.ready.store(vq.ready(), Ordering::Release);
    }
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("queue index {0} out of range")]
    BadQueue(u32),
    #[error("queue size {0} invalid")]
    BadQueueSize(u32),
    #[error("feature bits {0:#x} were not offered")]
    UnofferedFeatures(u64),
    #[error("protocol feature bits {0:#x} were not offered")]
    UnofferedProtocolFeatures(u64),
    #[error("memory table refused")]
    Memory(#[from] MemoryError),
    #[error("ring placement refused")]
    Ring(#[from] RingError),
    #[error("ring configured while running")]
    RingRunning,
    #[error("request {0:?} is not supported")]
    Unsupported(Code),
    #[error("packed rings are not supported")]
    Packed,
    #[error("dirty log refused")]
    Log(#[from] LogError),
    #[error("ring addresses changed while running")]
    RingMoved,
    #[error("{0}")]
    Postcopy(&'static str),
    #[error("cannot open a userfaultfd")]
    Userfault(#[source] std::io::Error),
    /// SET_VRING_BASE of a packed ring: a slot not below the ring size, or a used position
    /// that differs from the available one (in-flight buffers we cannot take over).
    #[error("packed ring base {0:#x}: slot past the ring, or used differs from available")]
    BadPackedBase(u32),
}

/// A reply to send: its bytes and the fds that go with them.
#[derive(Debug)]
pub struct Reply {
    pub bytes: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

/// Where a device stands in a postcopy migration (destination side).
#[derive(Debug, Default)]
enum Postcopy {
    #[default]
    Off,
    /// POSTCOPY_ADVISE: the userfaultfd is open and handed to the frontend.
    Advised(Userfault),
    /// POSTCOPY_LISTEN: memory tables are mapped for postcopy.
    Listening(Userfault),
}

/// Counters of a device's live-migration work, for `port-stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MigrationInfo {
    /// The frontend logs dirty pages (VHOST_F_LOG_ALL) and a log is mapped.
    pub logging: bool,
    /// Size of the mapped log in bytes (0: none).
    pub log_size: u64,
    /// POSTCOPY_ADVISE/LISTEN seen and no POSTCOPY_END yet.
    pub postcopy: bool,
    /// Postcopy: accesses that found a page missing, and pages our fault thread brought in.
    pub pages_missing: u64,
    pub pages_fetched: u64,
    /// SEND_RARP requests received.
    pub rarps: u64,
    /// Postcopy migrations this device took part in (POSTCOPY_LISTEN answered).
    pub postcopy_listens: u64,
}

/// A vhost-user net device (one port).
#[derive(Debug)]
pub struct Device {
    pub name: String,
    queue_pairs: usize,
    features: u64,
    protocol: u64,
    mem: Option<Arc<GuestMemory>>,
    queues: Vec<Arc<Queue>>,
    /// Errors answered (for port stats).
    pub errors: u64,
    /// The frontend's dirty log (SET_LOG_BASE).
    log: Option<Arc<DirtyLog>>,
    postcopy: Postcopy,
    /// A postcopy memory table answered, waiting for the frontend's ack before use.
    pending_mem: Option<Arc<GuestMemory>>,
    /// fds to send with the reply being built.
    reply_fds: Vec<OwnedFd>,
    /// SEND_RARP: a MAC to announce from this port (taken by the daemon).
    announce: Option<[u8; 6]>,
    rarps: u64,
    postcopy_listens: u64,
    /// Offer `VIRTIO_F_RING_PACKED` (the `vhost-packed-rings` setting; on by default).
    packed_rings: bool,
    /// The last request refused, for the daemon to log through its rate limiter (a
    /// frontend repeating a bad request must not flood the log): taken by
    /// [`Device::take_refusal`].
    refusal: Option<String>,
}

impl Device {
    /// A device offering `queue_pairs` queue pairs (1..=16).
    pub fn new(name: &str, queue_pairs: usize) -> Device {
        let queue_pairs = queue_pairs.clamp(1, MAX_QUEUE_PAIRS);
        Device {
            name: name.to_string(),
            queue_pairs,
            features: 0,
            protocol: 0,
            mem: None,
            queues: (0..2 * queue_pairs)
                .map(|_| Arc::new(Queue::default()))
                .collect(),
            errors: 0,
            log: None,
            postcopy: Postcopy::Off,
            pending_mem: None,
            reply_fds: Vec::new(),
            refusal: None,
            announce: None,
            rarps: 0,
            postcopy_listens: 0,
            packed_rings: false,
        }
    }

    /// Whether to offer packed rings (`VIRTIO_F_RING_PACKED`) to the next frontend that
    /// negotiates features (a frontend connected now keeps what it negotiated).
    pub fn set_packed_rings(&mut self, on: bool) {
        self.packed_rings = on;
    }

    /// The MAC a SEND_RARP asked to announce, once.
    pub fn take_announce(&mut self) -> Option<[u8; 6]> {
        self.announce.take()
    }

    /// Why a hot upgrade cannot hand this device over now: a postcopy migration is under way
    /// (its userfaultfd registers this process's mappings; a dirty log, on the other hand,
    /// is handed over).
    pub fn migrating(&self) -> Option<&'static str> {
        if !matches!(self.postcopy, Postcopy::Off) || self.pending_mem.is_some() {
            Some("a postcopy live migration is under way")
        } else {
            None
        }
    }

    /// Live-migration state and counters.
    pub fn migration_info(&self) -> MigrationInfo {
        let pc = self
            .mem
            .as_ref()
            .map(|m| m.postcopy_stats())
            .unwrap_or_default();
        MigrationInfo {
            logging: self.features & features::VHOST_F_LOG_ALL != 0 && self.log.is_some(),
            log_size: self.log.as_ref().map_or(0, |l| l.size()),
            postcopy: !matches!(self.postcopy, Postcopy::Off),
            pages_missing: pc.missing,
            pages_fetched: pc.fetched,
            rarps: self.rarps,
            postcopy_listens: self.postcopy_listens,
        }
    }

    /// Installs a new memory table: every queue re-places its ring in it.
    fn install_memory(&mut self, mem: Arc<GuestMemory>) -> Result<(), DeviceError> {
        let mut guards: Vec<_> = self.queues.iter().map(|q| q.lock()).collect();
        let mut result = Ok(());
        for vq in guards.iter_mut() {
            if let Err(e) = vq.start(Some(&mem)) {
                result = Err(e);
            }
        }
        for (q, vq) in self.queues.iter().zip(&guards) {
            q.publish_ready(vq);
        }
        drop(guards);
        self.mem = Some(mem);
        result.map_err(Into::into)
    }

    /// Queues in virtio order: even = guest RX (we enqueue), odd = guest TX (we dequeue).
    /// Sets guest notification coalescing on every queue (both directions).
    pub fn set_coalesce(&self, c: crate::virtqueue::Coalesce) {
        for q in &self.queues {
            q.lock().set_coalesce(c, &q.stats);
        }
    }

    pub fn queues(&self) -> &[Arc<Queue>] {
        &self.queues
    }

    pub fn queue_pairs(&self) -> usize {
        self.queue_pairs
    }

    pub fn features(&self) -> u64 {
        self.features
    }

    pub fn protocol_features(&self) -> u64 {
        self.protocol
    }

    pub fn memory(&self) -> Option<&Arc<GuestMemory>> {
        self.mem.as_ref()
    }

    fn queue(&self, index: u32) -> Result<&Arc<Queue>, DeviceError> {
        self.queues
            .get(index as usize)
            .ok_or(DeviceError::BadQueue(index))
    }

    fn offered(&self) -> u64 {
        let f = if self.queue_pairs > 1 {
            OFFERED
        } else {
            OFFERED & !features::VIRTIO_NET_F_MQ
        };
        // Also once negotiated (a restored device, the setting turned off since): a frontend
        // re-sending its features (dirty logging on and off) must not be refused.
        if self.packed_rings || self.features & features::VIRTIO_F_RING_PACKED != 0 {
            f | features::VIRTIO_F_RING_PACKED
        } else {
            f
        }
    }

    /// Stops every queue (frontend gone or reset).
    pub fn reset(&mut self) {
        // Our userfaultfd first: with the frontend gone, closing it lets a fault thread that
        // waits on a page go on.
        self.postcopy = Postcopy::Off;
        self.pending_mem = None;
        for q in &self.queues {
            let mut vq = q.lock();
            vq.stop(&q.stats);
            vq.call = None;
            vq.err = None;
            vq.state = Default::default();
            vq.set_log(None);
            vq.set_features(0);
            q.publish_ready(&vq);
        }
        self.mem = None;
        self.log = None;
        self.features = 0;
        self.protocol = 0;
        self.announce = None;
    }

    /// Sets what a device handed over by another ferrovsd had negotiated (hot upgrade,
    /// [`crate::state`]); its queues are then set by [`Device::restore_queue`].
    pub(crate) fn set_negotiated(
        &mut self,
        features: u64,
        protocol: u64,
        errors: u64,
        mem: Option<Arc<GuestMemory>>,
        log: Option<Arc<DirtyLog>>,
    ) {
        self.features = features;
        self.protocol = protocol;
        self.errors = errors;
        self.mem = mem;
        for q in &self.queues {
            let mut vq = q.lock();
            vq.set_features(features);
            vq.set_log(log.clone());
        }
        self.log = log;
    }

    /// The frontend's dirty log, while a migration has one set.
    pub fn log(&self) -> Option<&Arc<DirtyLog>> {
        self.log.as_ref()
    }

    /// Sets queue `index` from handed-over state: its ring (not started), its kick, call and
    /// err fds, and the error that broke it.
    pub(crate) fn restore_queue(
        &self,
        index: usize,
        state: VringState,
        [kick, call, err]: [Option<OwnedFd>; 3],
        broken: Option<ChainError>,
    ) -> Result<(), DeviceError> {
        let q = self.queue(index as u32)?;
        let mut vq = q.lock();
        vq.state = state;
        vq.kick = kick;
        vq.call = call;
        vq.err = err;
        vq.broken = broken;
        Ok(())
    }

    /// Touches every page of the configured rings so that the first bursts after a takeover
    /// take no page faults (the rings' pages are new to this process).
    pub fn prefault(&self) {
        let Some(mem) = &self.mem else { return };
        for q in &self.queues {
            let vq = q.lock();
            if let Some(a) = vq.state.addrs {
                let n = vq.state.size as u64;
                mem.prefault_uaddr(a.desc, 16 * n);
                mem.prefault_uaddr(a.avail, 6 + 2 * n);
                mem.prefault_uaddr(a.used, 6 + 8 * n);
            }
        }
    }

    /// Starts every configured queue at its handed-over position and lets the datapath use
    /// it. `last_avail` per queue comes from the frozen old process; a queue that is broken
    /// stays broken.
    pub fn resume(&self, last_avail: &[Option<u16>]) -> Result<(), DeviceError> {
        for (i, q) in self.queues.iter().enumerate() {
            let mut vq = q.lock();
            if let Some(Some(a)) = last_avail.get(i) {
                vq.state.last_avail = *a;
            }
            let broken = vq.broken;
            if vq.state.kicked {
                vq.start(self.mem.as_ref())?;
            }
            vq.broken = broken;
            q.publish_ready(&vq);
        }
        Ok(())
    }

    /// Where each queue stands (None: not started). Taken with the datapath frozen.
    pub fn positions(&self) -> Vec<Option<u16>> {
        self.queues
            .iter()
            .map(|q| {
                let vq = q.lock();
                vq.started().then_some(vq.state.last_avail)
            })
            .collect()
    }

    /// After a rolled-back hot upgrade: take each ring's position from guest memory (the
    /// other process may have moved it before it was stopped).
    pub fn resync(&self) {
        for q in &self.queues {
            q.lock().resync();
        }
    }

    /// Applies one request; returns the reply payload for requests that have one.
    pub fn handle(&mut self, req: Request) -> Result<Option<Vec<u8>>, DeviceError> {
        let u64_reply = |v: u64| Ok(Some(v.to_le_bytes().to_vec()));
        match req {
            Request::GetFeatures => return u64_reply(self.offered()),
            Request::SetFeatures(f) => {
                if f & !self.offered() != 0 {
                    return Err(DeviceError::UnofferedFeatures(f & !self.offered()));
                }
                self.features = f;
                for q in &self.queues {
                    let mut vq = q.lock();
                    vq.set_features(f);
                    q.publish_ready(&vq);
                }
            }
            Request::GetProtocolFeatures => return u64_reply(PROTOCOL_OFFERED),
            Request::SetProtocolFeatures(f) => {
                if f & !PROTOCOL_OFFERED != 0 {
                    return Err(DeviceError::UnofferedProtocolFeatures(
                        f & !PROTOCOL_OFFERED,
                    ));
                }
                self.protocol = f;
            }
            Request::GetQueueNum => return u64_reply(self.queue_pairs as u64),
            Request::GetMaxMemSlots => return u64_reply(msg::MAX_MEM_TABLE_REGIONS as u64),
            Request::SetOwner => {}
            Request::ResetOwner | Request::ResetDevice => self.reset(),
            Request::SetMemTable(table) => {
                if let Postcopy::Listening(uf) = &self.postcopy {
                    // Postcopy: registered with the userfaultfd; used after the frontend's
                    // ack (`handle_message`), once it can serve our faults.
                    let mem = GuestMemory::map_postcopy(table, uf)?;
                    self.pending_mem = Some(mem);
                    return Ok(None);
                }
                let mem = Arc::new(GuestMemory::map(table)?);
                // Lock every queue, re-place rings in the new memory, then publish it.
                self.install_memory(mem)?;
            }
            Request::SetVringNum { index, num } => {
                let packed = self.features & features::VIRTIO_F_RING_PACKED != 0;
                if num == 0 || num > MAX_QUEUE_SIZE as u32 || !(packed || num.is_power_of_two()) {
                    return Err(DeviceError::BadQueueSize(num));
                }
                let q = self.queue(index)?;
                let mut vq = q.lock();
                if vq.ready() {
                    return Err(DeviceError::RingRunning);
                }
                vq.state.size = num;
            }
            Request::SetVringAddr {
                index,
                flags,
                addrs,
                log,
            } => {
                let q = self.queue(index)?;
                let mut vq = q.lock();
                let log_addr = (flags & (1 << msg::VRING_F_LOG) != 0).then_some(log);
                if vq.started() {
                    // A migrating frontend turns the used ring's logging on and off while the
                    // ring runs; the ring itself may not move.
                    if vq.state.addrs != Some(addrs) {
                        return Err(DeviceError::RingMoved);
                    }
                    vq.state.log_addr = log_addr;
                    return Ok(None);
                }
                vq.state.addrs = Some(addrs);
                vq.state.log_addr = log_addr;
            }
            Request::SetVringBase { index, num } => {
                let q = self.queue(index)?;
                let mut vq = q.lock();
                if vq.ready() {
                    return Err(DeviceError::RingRunning);
                }
                if vq.packed_negotiated() {
                    // Bits 0–15: available slot and wrap counter; 16–31: the used ones (0 from
                    // a frontend that sends only the first: then the same). We complete in
                    // order, so they must be equal.
                    let (avail, used) = (num as u16, (num >> 16) as u16);
                    let slot_ok = u32::from(avail & 0x7fff) < vq.state.size.max(1);
                    if !slot_ok || (used != 0 && used != avail) {
                        return Err(DeviceError::BadPackedBase(num));
                    }
                }
                vq.state.last_avail = num as u16;
            }
            Request::GetVringBase { index } => {
                let q = self.queue(index)?;
                let mut vq = q.lock();
                let st = vq.stop(&q.stats);
                q.publish_ready(&vq);
                let mut num = st.last_avail as u32;
                if vq.packed_negotiated() {
                    // Packed: the used position (equal: in order) in bits 16–31.
                    num |= (st.used_idx as u32) << 16;
                }
                return Ok(Some(msg::payload::state(index, num)));
            }
            Request::SetVringKick { index, fd } => {
                let mem = self.mem.clone();
                let protocol_features =
                    self.features & features::VHOST_USER_F_PROTOCOL_FEATURES != 0;
                let q = self.queue(index)?;
                let mut vq = q.lock();
                if let Some(fd) = &fd {
                    // We only ever read it when woken; never let it block a thread.
                    let _ = os::set_nonblocking(fd.as_fd(), true);
                }
                vq.kick = fd;
                vq.state.kicked = true;
                if !protocol_features {
                    // Without PROTOCOL_FEATURES rings start enabled (vhost-user spec).
                    vq.state.enabled = true;
                }
                let r = vq.start(mem.as_ref());
                q.publish_ready(&vq);
                r?;
            }
            Request::SetVringCall { index, fd } => {
                let q = self.queue(index)?;
                let mut vq = q.lock();
                if let Some(fd) = &fd {
                    // A frontend may pass a pipe or a blocking fd: writing must never block a PMD.
                    let _ = os::set_nonblocking(fd.as_fd(), true);
                }
                vq.call = fd;
            }
            Request::SetVringErr { index, fd } => {
                let q = self.queue(index)?;
                q.lock().err = fd;
            }
            Request::SetVringEnable { index, enable } => {
                let q = self.queue(index)?;
                let mut vq = q.lock();
                vq.state.enabled = enable;
                q.publish_ready(&vq);
            }
            Request::SetVringEndian { .. } | Request::NetSetMtu(_) => {}
            Request::SetLogBase { size, offset, fd } => {
                let log = Arc::new(DirtyLog::map(fd, size, offset)?);
                for q in &self.queues {
                    let mut vq = q.lock();
                    vq.set_log(Some(log.clone()));
                    q.publish_ready(&vq);
                }
                self.log = Some(log);
                // Answered with an empty payload (as DPDK does; QEMU reads the header only).
                return Ok(Some(Vec::new()));
            }
            // The log's eventfd: we write the shared log directly and never signal.
            Request::SetBackendReqFd(_) | Request::SetLogFd(_) => {}
            Request::PostcopyAdvise => {
                let uf = Userfault::new().map_err(DeviceError::Userfault)?;
                let fd = uf
                    .fd()
                    .try_clone_to_owned()
                    .map_err(DeviceError::Userfault)?;
                self.reply_fds.push(fd);
                self.postcopy = Postcopy::Advised(uf);
                return Ok(Some(Vec::new()));
            }
            Request::PostcopyListen => match std::mem::take(&mut self.postcopy) {
                Postcopy::Advised(uf) => {
                    self.postcopy_listens += 1;
                    self.postcopy = Postcopy::Listening(uf);
                }
                other => {
                    self.postcopy = other;
                    return Err(DeviceError::Postcopy(
                        "POSTCOPY_LISTEN without POSTCOPY_ADVISE",
                    ));
                }
            },
            Request::PostcopyEnd => {
                if let Some(m) = &self.mem {
                    m.postcopy_done();
                }
                self.pending_mem = None;
                self.postcopy = Postcopy::Off;
            }
            Request::SendRarp(mac) => {
                self.rarps += 1;
                self.announce = Some(mac);
            }
            Request::SetStatus(_) => {}
            Request::GetStatus => return u64_reply(0),
            Request::GetConfig { .. } | Request::SetConfig { .. } => {
                return Err(DeviceError::Unsupported(Code::GetConfig))
            }
            Request::AddMemReg(..) => return Err(DeviceError::Unsupported(Code::AddMemReg)),
            Request::RemMemReg(..) => return Err(DeviceError::Unsupported(Code::RemMemReg)),
            Request::Unsupported(c) => return Err(DeviceError::Unsupported(c)),
        }
        Ok(None)
    }

    /// The last refusal not yet logged (see the `refusal` field).
    pub fn take_refusal(&mut self) -> Option<String> {
        self.refusal.take()
    }

    /// Handles a framed message end to end: parse, apply, and build the reply (the request's
    /// own reply, or a REPLY_ACK when asked). Errors are counted, logged and acked.
    pub fn handle_message(
        &mut self,
        h: &Header,
        payload: &[u8],
        fds: Vec<std::os::fd::OwnedFd>,
    ) -> Option<Reply> {
        let code = Code::from_u32(h.code);
        if trace() {
            log::info!(
                "{}: vhost-user {:?} ({}) flags {:#x} payload {:02x?}",
                self.name,
                code,
                h.code,
                h.flags,
                payload
            );
        }
        self.reply_fds.clear();
        if self.pending_mem.is_some()
            && code == Some(Code::SetMemTable)
            && payload.len() == 8
            && fds.is_empty()
        {
            self.postcopy_mem_ack(payload);
            return None;
        }
        let result = match msg::parse(h, payload, fds) {
            Ok(req) => self.handle(req).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        // QEMU asks for replies to POSTCOPY_LISTEN/END with NEED_REPLY whether or not
        // REPLY_ACK was negotiated.
        let ack_wanted = h.need_reply()
            && (self.protocol & features::PROTOCOL_F_REPLY_ACK != 0
                || matches!(code, Some(Code::PostcopyListen | Code::PostcopyEnd)))
            && !code.is_some_and(Code::has_reply);
        let reply = |bytes: Vec<u8>, fds: Vec<OwnedFd>| Some(Reply { bytes, fds });
        match result {
            Ok(None) if code == Some(Code::SetMemTable) && self.pending_mem.is_some() => {
                // Postcopy: the same table back, with our address of each region in place of
                // the frontend's; no REPLY_ACK (the frontend acks us instead).
                let bases = self.pending_mem.as_ref().map(|m| m.host_bases());
                let mut p = payload.to_vec();
                for (i, b) in bases.unwrap_or_default().into_iter().enumerate() {
                    let at = 8 + 32 * i + 16;
                    if let Some(f) = p.get_mut(at..at + 8) {
                        f.copy_from_slice(&b.to_le_bytes());
                    }
                }
                reply(msg::encode(h.code, msg::FLAG_REPLY, &p), Vec::new())
            }
            Ok(Some(r)) => {
                let fds = std::mem::take(&mut self.reply_fds);
                reply(msg::encode(h.code, msg::FLAG_REPLY, &r), fds)
            }
            Ok(None) if ack_wanted => reply(
                msg::encode(h.code, msg::FLAG_REPLY, &0u64.to_le_bytes()),
                Vec::new(),
            ),
            Ok(None) => None,
            Err(e) => {
                self.errors += 1;
                self.reply_fds.clear();
                self.refusal = Some(format!("vhost-user request {} refused: {e}", h.code));
                let failed = msg::encode(h.code, msg::FLAG_REPLY, &1u64.to_le_bytes());
                if ack_wanted || matches!(code, Some(Code::SetLogBase | Code::PostcopyAdvise)) {
                    // (A POSTCOPY_ADVISE answer with a payload and no fd fails the frontend's
                    // advise: the migration stops there.)
                    reply(failed, Vec::new())
                } else if code.is_some_and(Code::has_reply) {
                    // The frontend waits for an answer: give it one it can see is empty.
                    reply(msg::encode(h.code, msg::FLAG_REPLY, &[]), Vec::new())
                } else {
                    None
                }
            }
        }
    }

    /// The frontend's ack of a postcopy memory table: 0 and the memory goes into use, else it
    /// could not register our regions and the table is dropped.
    fn postcopy_mem_ack(&mut self, payload: &[u8]) {
        let mut v = [0u8; 8];
        v.copy_from_slice(payload);
        let Some(mem) = self.pending_mem.take() else {
            return;
        };
        if u64::from_le_bytes(v) != 0 {
            self.errors += 1;
            self.refusal = Some("frontend refused our postcopy memory table; not used".into());
            return;
        }
        if let Err(e) = self.install_memory(mem) {
            self.errors += 1;
            self.refusal = Some(format!("postcopy memory table: {e}"));
        }
    }
}
