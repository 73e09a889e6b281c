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
//!
//! A request that fails leaves the device as it was and is answered with a non-zero ack when
//! the frontend asked for one (REPLY_ACK); it never affects other ports.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ferrovs_sys::guest::{GuestMemory, MemoryError};
use ferrovs_sys::os;
use ferrovs_sys::vring::{RingError, MAX_QUEUE_SIZE};

use crate::features::{self, MAX_QUEUE_PAIRS, OFFERED, PROTOCOL_OFFERED};
use crate::msg::{self, Code, Header, Request};
use crate::stats::QueueStats;
use crate::virtqueue::{ChainError, VirtQueue, VringState};

/// Whether `FERROVS_TRACE_VHOST` asks for a log line per vhost-user message.
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
    /// `ferrovs_sys::vnet::caps` bits, published with `ready`.
    pub rx_caps: std::sync::atomic::AtomicU8,
}

impl Queue {
    /// Locks for configuration (waits at most one burst).
    pub fn lock(&self) -> MutexGuard<'_, VirtQueue> {
        self.vq.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish_ready(&self, vq: &VirtQueue) {
        self.rx_caps.store(vq.rx_caps(), Ordering::Relaxed);
        self.ready.store(vq.ready(), Ordering::Release);
    }
}

/// One queue's handed-over state (hot upgrade).
#[derive(Debug, Default)]
pub struct QueuePart {
    pub state: VringState,
    pub kick: Option<std::os::fd::OwnedFd>,
    pub call: Option<std::os::fd::OwnedFd>,
    pub err: Option<std::os::fd::OwnedFd>,
    pub broken: Option<ChainError>,
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
        }
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
        if self.queue_pairs > 1 {
            OFFERED
        } else {
            OFFERED & !features::VIRTIO_NET_F_MQ
        }
    }

    /// Stops every queue (frontend gone or reset).
    pub fn reset(&mut self) {
        for q in &self.queues {
            let mut vq = q.lock();
            vq.stop(&q.stats);
            vq.call = None;
            vq.err = None;
            vq.state = Default::default();
            q.publish_ready(&vq);
        }
        self.mem = None;
        self.features = 0;
        self.protocol = 0;
    }

    /// Rebuilds a device handed over by another ferrovsd (hot upgrade). Its queues are
    /// configured by [`Device::restore_queue`] but not started: nothing touches guest memory
    /// until [`Device::resume`].
    pub fn restore(
        name: &str,
        queue_pairs: usize,
        features: u64,
        protocol: u64,
        errors: u64,
        mem: Option<Arc<GuestMemory>>,
    ) -> Device {
        let mut d = Device::new(name, queue_pairs);
        d.features = features;
        d.protocol = protocol;
        d.errors = errors;
        d.mem = mem;
        for q in &d.queues {
            q.lock().set_features(features);
        }
        d
    }

    /// Sets queue `index` from handed-over state.
    pub fn restore_queue(&self, index: usize, part: QueuePart) -> Result<(), DeviceError> {
        let q = self.queue(index as u32)?;
        let mut vq = q.lock();
        vq.state = part.state;
        vq.kick = part.kick;
        vq.call = part.call;
        vq.err = part.err;
        vq.broken = part.broken;
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
                let mem = Arc::new(GuestMemory::map(table)?);
                // Lock every queue, re-place rings in the new memory, then publish it.
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
                result?;
            }
            Request::SetVringNum { index, num } => {
                if num == 0 || num > MAX_QUEUE_SIZE as u32 || !num.is_power_of_two() {
                    return Err(DeviceError::BadQueueSize(num));
                }
                let q = self.queue(index)?;
                let mut vq = q.lock();
                if vq.ready() {
                    return Err(DeviceError::RingRunning);
                }
                vq.state.size = num;
            }
            Request::SetVringAddr { index, addrs, .. } => {
                let q = self.queue(index)?;
                let mut vq = q.lock();
                if vq.ready() {
                    return Err(DeviceError::RingRunning);
                }
                vq.state.addrs = Some(addrs);
            }
            Request::SetVringBase { index, num } => {
                let q = self.queue(index)?;
                let mut vq = q.lock();
                if vq.ready() {
                    return Err(DeviceError::RingRunning);
                }
                vq.state.last_avail = num as u16;
            }
            Request::GetVringBase { index } => {
                let q = self.queue(index)?;
                let mut vq = q.lock();
                let st = vq.stop(&q.stats);
                q.publish_ready(&vq);
                return Ok(Some(msg::payload::state(index, st.last_avail as u32)));
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
            Request::SetVringEndian { .. } | Request::NetSetMtu(_) | Request::SendRarp(_) => {}
            Request::SetBackendReqFd(_) | Request::SetLogFd(_) | Request::SetLogBase { .. } => {}
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

    /// Handles a framed message end to end: parse, apply, and build the reply bytes (the
    /// request's own reply, or a REPLY_ACK when asked). Errors are counted, logged and acked.
    pub fn handle_message(
        &mut self,
        h: &Header,
        payload: &[u8],
        fds: Vec<std::os::fd::OwnedFd>,
    ) -> Option<Vec<u8>> {
        let code = Code::from_u32(h.code);
        if trace() {
            eprintln!(
                "ferrovs: {}: vhost-user {:?} ({}) flags {:#x} payload {:02x?}",
                self.name, code, h.code, h.flags, payload
            );
        }
        let result = match msg::parse(h, payload, fds) {
            Ok(req) => self.handle(req).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let ack_wanted = h.need_reply()
            && self.protocol & features::PROTOCOL_F_REPLY_ACK != 0
            && !code.is_some_and(Code::has_reply);
        match result {
            Ok(Some(reply)) => Some(msg::encode(h.code, msg::FLAG_REPLY, &reply)),
            Ok(None) if ack_wanted => {
                Some(msg::encode(h.code, msg::FLAG_REPLY, &0u64.to_le_bytes()))
            }
            Ok(None) => None,
            Err(e) => {
                self.errors += 1;
                eprintln!(
                    "ferrovs: {}: vhost-user request {} refused: {e}",
                    self.name, h.code
                );
                if ack_wanted {
                    Some(msg::encode(h.code, msg::FLAG_REPLY, &1u64.to_le_bytes()))
                } else if code.is_some_and(Code::has_reply) {
                    // The frontend waits for an answer: give it one it can see is empty.
                    Some(msg::encode(h.code, msg::FLAG_REPLY, &[]))
                } else {
                    None
                }
            }
        }
    }
}
