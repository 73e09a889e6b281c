//! The asynchronous path between the PMDs and the control plane's OpenFlow peers: packets a
//! rule's `controller` action sends up (PACKET_IN), and frames a peer sends down to be
//! executed (PACKET_OUT).
//!
//! * [`PacketInQueue`]: a PMD executing [`ferrovs_flow::DpAction::Controller`] copies the
//!   frame as it is at that point (the edits made so far), whole, into the queue (as OVS
//!   3.1 does: it buffers nothing, so `buffer_id` is always `NO_BUFFER` and the action's
//!   `max_len` truncates nothing: `controller:20` still sends the whole frame), and
//!   signals the queue's eventfd when the queue was empty, which wakes the control thread's
//!   epoll loop. The queue is bounded ([`PacketInQueue::MAX_PACKETS`] packets,
//!   [`PacketInQueue::MAX_BYTES`] bytes): a full queue drops the packet-in and counts it; a
//!   PMD never waits for the control thread (it `try_lock`s, and counts a packet-in it could
//!   not queue at once as dropped).
//! * [`PacketOutQueue`]: the control thread queues decoded packet-outs (the frame, the
//!   bridge, the input port, and either datapath actions or "through the tables"); every PMD
//!   looks at one atomic flag per iteration and the first to get the lock executes what is
//!   waiting (at most [`PacketOutQueue::BATCH`] per iteration) with the ordinary executor, as
//!   if the frame had been received on the input port. Bounded too: a full queue refuses.
//!
//! Neither queue knows OpenFlow: port numbers are datapath ids, reasons and cookies are what
//! the rule said ([`ferrovs_flow::ControllerAction`]).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferrovs_flow::{ControllerAction, DpAction};
use ferrovs_sys::os;

use crate::port::Port;

/// The datapath id of the pseudo input port of a packet-out from the controller (not a
/// port of any bridge: a rule matching `in_port` never matches it, and no output goes to it).
pub const CONTROLLER_PORT: u32 = u32::MAX - 2;

/// One packet for the controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketIn {
    pub bridge: u32,
    /// Datapath id of the port it came in on ([`CONTROLLER_PORT`] for a packet-out's).
    pub in_port: u32,
    /// Tunnel id it came with (0: none).
    pub tun_id: u64,
    /// Length of the whole frame.
    pub total_len: u16,
    pub action: ControllerAction,
    /// The frame (whole: see the module doc).
    pub data: Vec<u8>,
}

/// Counters of the packet-in queue.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PacketInCounters {
    /// Packet-ins queued for the control thread.
    pub queued: u64,
    /// Packet-ins dropped because the queue was full (or busy at that instant).
    pub dropped: u64,
}

/// PMDs → control thread (see the module doc).
#[derive(Debug)]
pub struct PacketInQueue {
    q: Mutex<(VecDeque<PacketIn>, usize)>,
    wake: OwnedFd,
    queued: AtomicU64,
    dropped: AtomicU64,
}

impl PacketInQueue {
    /// Most packet-ins waiting.
    pub const MAX_PACKETS: usize = 1024;
    /// Most bytes of frames waiting.
    pub const MAX_BYTES: usize = 4 << 20;

    /// A queue with its eventfd.
    pub fn new() -> io::Result<PacketInQueue> {
        Ok(PacketInQueue {
            q: Mutex::new((VecDeque::with_capacity(Self::MAX_PACKETS), 0)),
            wake: os::eventfd()?,
            queued: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })
    }

    /// The eventfd the control thread watches (readable: packet-ins wait).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// Queues a packet-in of `frame` (PMD), a copy of it. False if it was dropped.
    pub fn push(
        &self,
        bridge: u32,
        in_port: u32,
        tun_id: u64,
        frame: &[u8],
        action: ControllerAction,
    ) -> bool {
        let len = frame.len();
        let Some(mut q) = self.lock_briefly() else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let (list, bytes) = &mut *q;
        if list.len() >= Self::MAX_PACKETS || *bytes + len > Self::MAX_BYTES {
            drop(q);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let was_empty = list.is_empty();
        list.push_back(PacketIn {
            bridge,
            in_port,
            tun_id,
            total_len: frame.len().min(usize::from(u16::MAX)) as u16,
            action,
            data: frame[..len].to_vec(),
        });
        *bytes += len;
        drop(q);
        self.queued.fetch_add(1, Ordering::Relaxed);
        if was_empty {
            // Full eventfd counter (never in practice): the control thread is awake anyway.
            let _ = os::notify(self.wake.as_fd());
        }
        true
    }

    /// The queue's lock for a PMD: a few attempts (the control thread holds it only to swap
    /// the queue out, [`Self::take`]), never a wait.
    fn lock_briefly(&self) -> Option<std::sync::MutexGuard<'_, (VecDeque<PacketIn>, usize)>> {
        for _ in 0..Self::LOCK_TRIES {
            match self.q.try_lock() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => std::hint::spin_loop(),
            }
        }
        None
    }

    /// Attempts of [`Self::lock_briefly`].
    const LOCK_TRIES: usize = 64;

    /// Takes every waiting packet-in (control thread) into `buf` (which must be empty: the
    /// caller keeps it between calls, so neither side allocates), after clearing the eventfd
    /// (a packet-in queued after the take signals again). The lock is held for a swap only,
    /// so a PMD's [`Self::push`] rarely finds it taken.
    pub fn take_into(&self, buf: &mut VecDeque<PacketIn>) {
        let _ = os::drain(self.wake.as_fd());
        buf.clear();
        if buf.capacity() < Self::MAX_PACKETS {
            buf.reserve(Self::MAX_PACKETS);
        }
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        q.1 = 0;
        std::mem::swap(&mut q.0, buf);
    }

    /// Takes every waiting packet-in ([`Self::take_into`] a new buffer).
    pub fn take(&self) -> VecDeque<PacketIn> {
        let mut buf = VecDeque::new();
        self.take_into(&mut buf);
        buf
    }

    pub fn counters(&self) -> PacketInCounters {
        PacketInCounters {
            queued: self.queued.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

/// What a packet-out does with its frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PacketOutActions {
    /// These actions (outputs, edits), in order.
    Actions(Vec<DpAction>),
    /// Through the bridge's rule tables, as if received on the input port (`OFPP_TABLE`).
    Table,
}

/// One frame to execute.
#[derive(Debug)]
pub struct PacketOut {
    pub bridge: u32,
    /// The input port: a port of the bridge, or a pseudo port ([`CONTROLLER_PORT`]) that
    /// belongs to no bridge's port list.
    pub inp: Arc<Port>,
    pub data: Vec<u8>,
    pub actions: PacketOutActions,
}

/// Why a packet-out was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketOutError {
    /// The queue is full (this many waiting).
    Full(usize),
}

impl std::fmt::Display for PacketOutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PacketOutError::Full(n) => write!(f, "the packet-out queue is full ({n} waiting)"),
        }
    }
}

impl std::error::Error for PacketOutError {}

/// The pseudo input port of `bridge`'s packet-outs from the controller
/// ([`CONTROLLER_PORT`]): a port with no queues, in no bridge's port list.
pub fn controller_port(bridge: u32) -> Port {
    Port {
        id: CONTROLLER_PORT,
        name: "CONTROLLER".into(),
        bridge,
        vlan: crate::port::VlanMode::Trunk,
        io: crate::port::PortIo::Vhost { queues: Vec::new() },
        rx_drops: Default::default(),
        tx_not_ready: Default::default(),
        offload: Default::default(),
        inject: Default::default(),
        capture: Default::default(),
        rxq_load: Default::default(),
    }
}

/// Counters of the packet-out queue.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PacketOutCounters {
    /// Packet-outs executed by a PMD.
    pub executed: u64,
    /// Refused because the queue was full.
    pub refused: u64,
}

/// Control thread → PMDs (see the module doc).
#[derive(Debug, Default)]
pub struct PacketOutQueue {
    pending: AtomicBool,
    q: Mutex<VecDeque<PacketOut>>,
    executed: AtomicU64,
    refused: AtomicU64,
}

impl PacketOutQueue {
    /// Most packet-outs waiting.
    pub const MAX: usize = 1024;
    /// Most packet-outs one PMD executes per iteration.
    pub const BATCH: usize = 32;

    /// Queues `p` (control thread).
    pub fn push(&self, p: PacketOut) -> Result<(), PacketOutError> {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= Self::MAX {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(PacketOutError::Full(q.len()));
        }
        q.push_back(p);
        self.pending.store(true, Ordering::Release);
        Ok(())
    }

    /// Takes up to [`Self::BATCH`] waiting packet-outs into `out` (PMD; never waits).
    #[inline]
    pub(crate) fn take_into(&self, out: &mut Vec<PacketOut>) {
        if !self.pending.load(Ordering::Relaxed) {
            return;
        }
        self.take_slow(out);
    }

    #[cold]
    fn take_slow(&self, out: &mut Vec<PacketOut>) {
        let Ok(mut q) = self.q.try_lock() else {
            return;
        };
        while out.len() < Self::BATCH {
            let Some(p) = q.pop_front() else { break };
            out.push(p);
        }
        self.pending.store(!q.is_empty(), Ordering::Release);
    }

    pub(crate) fn executed(&self, n: u64) {
        self.executed.fetch_add(n, Ordering::Relaxed);
    }

    pub fn counters(&self) -> PacketOutCounters {
        PacketOutCounters {
            executed: self.executed.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(max_len: u16) -> ControllerAction {
        ControllerAction {
            max_len,
            reason: 1,
            table_id: 0,
            cookie: 9,
            ..ControllerAction::default()
        }
    }

    #[test]
    fn packet_ins_are_whole_bounded_and_signalled_once_per_batch() {
        let q = PacketInQueue::new().unwrap();
        let frame = vec![0xab; 100];
        assert!(q.push(1, 2, 0, &frame, action(64)));
        assert!(q.push(1, 2, 0, &frame, action(u16::MAX)));
        // One signal for the two (the queue was empty only before the first).
        let mut b = [0u8; 8];
        assert_eq!(
            nix_read(q.fd(), &mut b),
            8,
            "the eventfd is readable after a push"
        );
        let v = q.take();
        assert_eq!(v.len(), 2);
        // max_len truncates nothing (OVS buffers nothing, and sends the whole frame).
        assert_eq!((v[0].data.len(), v[0].total_len), (100, 100));
        assert_eq!((v[1].data.len(), v[1].total_len), (100, 100));
        for _ in 0..PacketInQueue::MAX_PACKETS {
            assert!(q.push(1, 2, 0, &frame, action(u16::MAX)));
        }
        assert!(!q.push(1, 2, 0, &frame, action(u16::MAX)));
        assert_eq!(
            q.counters(),
            PacketInCounters {
                queued: 2 + PacketInQueue::MAX_PACKETS as u64,
                dropped: 1
            }
        );
        assert_eq!(q.take().len(), PacketInQueue::MAX_PACKETS);
        assert!(q.take().is_empty());
        // Bytes bound: 64 KiB frames fill MAX_BYTES before MAX_PACKETS.
        let big = vec![0u8; 65535];
        let fit = PacketInQueue::MAX_BYTES / 65535;
        for _ in 0..fit {
            assert!(q.push(1, 2, 0, &big, action(u16::MAX)));
        }
        assert!(!q.push(1, 2, 0, &big, action(u16::MAX)));
    }

    fn nix_read(fd: BorrowedFd<'_>, _b: &mut [u8; 8]) -> usize {
        os::drain(fd).unwrap_or(0)
    }

    #[test]
    fn packet_outs_are_bounded_and_taken_in_batches() {
        let q = PacketOutQueue::default();
        let port = Arc::new(controller_port(0));
        for _ in 0..PacketOutQueue::MAX {
            q.push(PacketOut {
                bridge: 0,
                inp: port.clone(),
                data: vec![0; 60],
                actions: PacketOutActions::Table,
            })
            .unwrap();
        }
        let e = q
            .push(PacketOut {
                bridge: 0,
                inp: port.clone(),
                data: vec![],
                actions: PacketOutActions::Table,
            })
            .unwrap_err();
        assert_eq!(e, PacketOutError::Full(PacketOutQueue::MAX));
        let mut out = Vec::new();
        q.take_into(&mut out);
        assert_eq!(out.len(), PacketOutQueue::BATCH);
        assert_eq!(q.counters().refused, 1);
    }
}
