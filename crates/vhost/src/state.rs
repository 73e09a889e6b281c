//! A device's plain, exportable state (hot upgrade), and its restore as untrusted input.
//!
//! [`Device::export`] writes what another process needs to carry a device on: negotiated
//! features, the memory table, per queue its ring's configuration and position, a broken
//! queue's error, the dirty log of a live migration. Fds are not part of the state: they go
//! into a side list (sent with SCM_RIGHTS) and the state names them by their index in it.
//!
//! [`Device::restore`] takes such a state from another process, which may be another version
//! or plain wrong, so it is checked as untrusted input before any fd is used or any memory is
//! mapped ([`DeviceState::validate`]): every rule gives its own [`StateError`]. The restored
//! device's queues are configured but not started; nothing touches guest memory before
//! [`Device::resume`].
//!
//! With the `serde` feature (the control plane's; the datapath builds vhost without it) the
//! types are (de)serialisable; their field names are the hot-upgrade wire format
//! (`docs/upgrade.md`), so they only ever gain defaulted fields within a schema.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use ferrovs_sys::guest::dirty_log::{DirtyLog, LogError};
use ferrovs_sys::guest::memory::{GuestMemory, MemoryError, RegionDesc, MAX_REGIONS};
use ferrovs_sys::guest::packed::MAX_PACKED_SIZE;
use ferrovs_sys::guest::vring::{RingAddrs, MAX_QUEUE_SIZE};
use ferrovs_sys::os;

use crate::device::{Device, DeviceError};
use crate::features::{self, MAX_QUEUE_PAIRS, PROTOCOL_OFFERED};
use crate::virtqueue::{ChainError, VringState};

/// A vhost-user device as plain data. `Default` is the empty state a port without a device
/// (a kernel port) carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeviceState {
    pub queue_pairs: usize,
    /// Negotiated virtio features.
    pub features: u64,
    /// Negotiated vhost-user protocol features.
    pub protocol: u64,
    /// Requests refused so far (a counter).
    pub errors: u64,
    /// The memory table, in table order.
    pub regions: Vec<RegionState>,
    /// Every queue in virtio order (`2 * queue_pairs`).
    pub queues: Vec<QueueState>,
    /// The frontend's dirty log (a live migration is under way; hot-upgrade schema 2).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub log: Option<LogState>,
}

/// One region of the memory table; `fd` is an index in the side list of fds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RegionState {
    pub gpa: u64,
    pub size: u64,
    pub uaddr: u64,
    pub mmap_offset: u64,
    pub fd: u32,
}

/// The dirty log: fd (index), size and offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LogState {
    pub fd: u32,
    pub size: u64,
    pub offset: u64,
}

/// One queue: its ring's configuration and position, its notification fds (indices) and,
/// if the guest broke it, why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QueueState {
    /// Entries (0: not configured).
    pub size: u32,
    /// desc, avail, used (frontend virtual addresses).
    pub addrs: Option<[u64; 3]>,
    pub last_avail: u16,
    pub used_idx: u16,
    pub enabled: bool,
    /// The kick fd arrived: the ring is started.
    pub kicked: bool,
    pub kick: Option<u32>,
    pub call: Option<u32>,
    pub err: Option<u32>,
    /// The guest error that broke the queue (by its drop reason's name on the wire).
    pub broken: Option<ChainError>,
    /// The used ring's guest-physical address for the dirty log (hot-upgrade schema 2).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub log_addr: Option<u64>,
}

impl QueueState {
    fn vring(&self) -> VringState {
        VringState {
            size: self.size,
            addrs: self
                .addrs
                .map(|[desc, avail, used]| RingAddrs { desc, avail, used }),
            last_avail: self.last_avail,
            used_idx: self.used_idx,
            enabled: self.enabled,
            kicked: self.kicked,
            log_addr: self.log_addr,
        }
    }
}

/// The three areas of a split ring, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingArea {
    Descriptors,
    Available,
    Used,
}

impl std::fmt::Display for RingArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RingArea::Descriptors => "descriptor table",
            RingArea::Available => "available ring",
            RingArea::Used => "used ring",
        })
    }
}

/// Why a handed-over device state was refused.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{0} queue pairs (1 to {MAX_QUEUE_PAIRS})")]
    QueuePairs(usize),
    #[error("{queues} queues for {pairs} queue pairs")]
    QueueCount { queues: usize, pairs: usize },
    #[error("feature bits {0:#x} are not ours to offer")]
    Features(u64),
    #[error("protocol feature bits {0:#x} are not ours to offer")]
    ProtocolFeatures(u64),
    #[error("{0} memory regions (at most {MAX_REGIONS})")]
    TooManyRegions(usize),
    #[error("region {0}: zero size")]
    EmptyRegion(usize),
    #[error("region {0}: address range overflows")]
    RegionOverflow(usize),
    #[error("region {index} overlaps region {other}")]
    RegionOverlap { index: usize, other: usize },
    #[error("queue {queue}: size {size} (a power of two up to {MAX_QUEUE_SIZE})")]
    QueueSize { queue: usize, size: u32 },
    #[error("queue {queue}: {area} at {addr:#x} lies outside guest memory")]
    RingOutsideMemory {
        queue: usize,
        area: RingArea,
        addr: u64,
    },
    #[error("queue {queue}: {area} at {addr:#x} is misaligned")]
    RingMisaligned {
        queue: usize,
        area: RingArea,
        addr: u64,
    },
    #[error("queue {queue}: started without ring addresses")]
    StartedWithoutRing { queue: usize },
    #[error(
        "queue {queue}: {in_flight} chains in flight (last_avail {last_avail}, used_idx \
         {used_idx}) in a ring of {size}"
    )]
    RingIndex {
        queue: usize,
        last_avail: u16,
        used_idx: u16,
        in_flight: u16,
        size: u32,
    },
    #[error("queue {queue}: `{0}` does not break a queue", .error.name())]
    NotBreaking { queue: usize, error: ChainError },
    #[error("names fd {0}, which did not arrive (or is named twice)")]
    MissingFd(u32),
    #[error("guest memory")]
    Memory(#[source] MemoryError),
    #[error("dirty log")]
    Log(#[source] LogError),
    #[error("queue {queue}")]
    Queue {
        queue: usize,
        #[source]
        source: DeviceError,
    },
    #[error("queue {queue}: packed ring size {size} (1 to {MAX_PACKED_SIZE})")]
    PackedQueueSize { queue: usize, size: u32 },
    #[error(
        "queue {queue}: packed ring position {last_avail:#x} (used {used_idx:#x}): the slot \
         must be below the size {size} and used equal to available"
    )]
    PackedPosition {
        queue: usize,
        last_avail: u16,
        used_idx: u16,
        size: u32,
    },
}

/// Where [`Device::restore`] takes the fds a state names (by index, each exactly once).
pub trait FdSource {
    /// The fd at `index`, or `None` if there is none (or it was taken already).
    fn take_fd(&mut self, index: u32) -> Option<OwnedFd>;
}

impl FdSource for Vec<Option<OwnedFd>> {
    fn take_fd(&mut self, index: u32) -> Option<OwnedFd> {
        self.get_mut(index as usize).and_then(Option::take)
    }
}

fn take(fds: &mut dyn FdSource, index: u32) -> Result<OwnedFd, StateError> {
    fds.take_fd(index).ok_or(StateError::MissingFd(index))
}

fn take_opt(fds: &mut dyn FdSource, index: Option<u32>) -> Result<Option<OwnedFd>, StateError> {
    index.map(|i| take(fds, i)).transpose()
}

impl DeviceState {
    /// Checks everything that can be checked without the fds: counts, feature bits, the
    /// memory table's shape and every configured ring against it. Touches nothing.
    pub fn validate(&self) -> Result<(), StateError> {
        if !(1..=MAX_QUEUE_PAIRS).contains(&self.queue_pairs) {
            return Err(StateError::QueuePairs(self.queue_pairs));
        }
        if self.queues.len() != 2 * self.queue_pairs {
            return Err(StateError::QueueCount {
                queues: self.queues.len(),
                pairs: self.queue_pairs,
            });
        }
        // Packed rings are offered only when configured, but a device that negotiated them
        // is carried on (`docs/upgrade.md`, "Packed rings").
        let unoffered = self.features & !(features::OFFERED | features::VIRTIO_F_RING_PACKED);
        if unoffered != 0 {
            return Err(StateError::Features(unoffered));
        }
        let unoffered = self.protocol & !PROTOCOL_OFFERED;
        if unoffered != 0 {
            return Err(StateError::ProtocolFeatures(unoffered));
        }
        self.validate_regions()?;
        for (i, q) in self.queues.iter().enumerate() {
            self.validate_queue(i, q)?;
        }
        Ok(())
    }

    fn validate_regions(&self) -> Result<(), StateError> {
        if self.regions.len() > MAX_REGIONS {
            return Err(StateError::TooManyRegions(self.regions.len()));
        }
        for (i, r) in self.regions.iter().enumerate() {
            if r.size == 0 {
                return Err(StateError::EmptyRegion(i));
            }
            let ends = [r.gpa, r.uaddr, r.mmap_offset].map(|a| a.checked_add(r.size));
            if ends.iter().any(Option::is_none) {
                return Err(StateError::RegionOverflow(i));
            }
        }
        for (i, a) in self.regions.iter().enumerate() {
            for (j, b) in self.regions.iter().enumerate().take(i) {
                let overlap = |x: u64, y: u64| x < y + b.size && y < x + a.size;
                if overlap(a.gpa, b.gpa) || overlap(a.uaddr, b.uaddr) {
                    return Err(StateError::RegionOverlap { index: i, other: j });
                }
            }
        }
        Ok(())
    }

    /// A packed ring: any size up to 32768; the position is a slot below the size with its
    /// wrap counter in bit 15, used equal to available (we complete in order); the driver and
    /// device event structures are 4 bytes each.
    fn validate_packed_queue(&self, queue: usize, q: &QueueState) -> Result<(), StateError> {
        let configured = q.size != 0 || q.addrs.is_some();
        if configured && (q.size == 0 || q.size > MAX_PACKED_SIZE) {
            return Err(StateError::PackedQueueSize {
                queue,
                size: q.size,
            });
        }
        if let Some(error) = q.broken {
            if !ChainError::ALL.contains(&error) {
                return Err(StateError::NotBreaking { queue, error });
            }
        }
        if q.size != 0 && (q.last_avail != q.used_idx || u32::from(q.last_avail & 0x7fff) >= q.size)
        {
            return Err(StateError::PackedPosition {
                queue,
                last_avail: q.last_avail,
                used_idx: q.used_idx,
                size: q.size,
            });
        }
        let Some([desc, avail, used]) = q.addrs else {
            if q.kicked && !self.regions.is_empty() && q.size != 0 {
                return Err(StateError::StartedWithoutRing { queue });
            }
            return Ok(());
        };
        if self.regions.is_empty() {
            return Ok(());
        }
        let areas = [
            (RingArea::Descriptors, desc, 16 * u64::from(q.size), 16),
            (RingArea::Available, avail, 4, 4),
            (RingArea::Used, used, 4, 4),
        ];
        for (area, addr, len, align) in areas {
            if !addr.is_multiple_of(align) {
                return Err(StateError::RingMisaligned { queue, area, addr });
            }
            if !self.in_memory(addr, len) {
                return Err(StateError::RingOutsideMemory { queue, area, addr });
            }
        }
        Ok(())
    }

    /// Whether `[addr, addr + len)` lies in one region (frontend addresses).
    fn in_memory(&self, addr: u64, len: u64) -> bool {
        self.regions.iter().any(|r| {
            addr >= r.uaddr
                && addr
                    .checked_add(len)
                    .is_some_and(|end| end <= r.uaddr + r.size)
        })
    }

    fn validate_queue(&self, queue: usize, q: &QueueState) -> Result<(), StateError> {
        if self.features & features::VIRTIO_F_RING_PACKED != 0 {
            return self.validate_packed_queue(queue, q);
        }
        let configured = q.size != 0 || q.addrs.is_some();
        if configured && (q.size > MAX_QUEUE_SIZE as u32 || !q.size.is_power_of_two()) {
            return Err(StateError::QueueSize {
                queue,
                size: q.size,
            });
        }
        if let Some(error) = q.broken {
            if !ChainError::ALL.contains(&error) {
                return Err(StateError::NotBreaking { queue, error });
            }
        }
        if q.size != 0 {
            let in_flight = q.last_avail.wrapping_sub(q.used_idx);
            if u32::from(in_flight) > q.size {
                return Err(StateError::RingIndex {
                    queue,
                    last_avail: q.last_avail,
                    used_idx: q.used_idx,
                    in_flight,
                    size: q.size,
                });
            }
        }
        let Some([desc, avail, used]) = q.addrs else {
            // A kicked ring without addresses is never placed; with memory, it cannot be.
            if q.kicked && !self.regions.is_empty() && q.size != 0 {
                return Err(StateError::StartedWithoutRing { queue });
            }
            return Ok(());
        };
        if self.regions.is_empty() {
            // No memory table yet: the ring is placed when one arrives.
            return Ok(());
        }
        let n = u64::from(q.size);
        let areas = [
            (RingArea::Descriptors, desc, 16 * n, 16),
            (RingArea::Available, avail, 6 + 2 * n, 2),
            (RingArea::Used, used, 6 + 8 * n, 4),
        ];
        for (area, addr, len, align) in areas {
            if !addr.is_multiple_of(align) {
                return Err(StateError::RingMisaligned { queue, area, addr });
            }
            if !self.in_memory(addr, len) {
                return Err(StateError::RingOutsideMemory { queue, area, addr });
            }
        }
        Ok(())
    }
}

impl Device {
    /// This device as plain data. Its fds (memory regions, kick/call/err, the dirty log) are
    /// appended to `fds`; the state names them by their index there. Taken on the control
    /// thread (positions are final only with the datapath frozen: [`Device::positions`]).
    pub fn export(&self, fds: &mut Vec<RawFd>) -> DeviceState {
        let mut push = |fd: RawFd| {
            fds.push(fd);
            (fds.len() - 1) as u32
        };
        let regions = self
            .memory()
            .map(|m| {
                m.regions()
                    .zip(m.fds())
                    .map(|(r, fd)| RegionState {
                        gpa: r.gpa,
                        size: r.size,
                        uaddr: r.uaddr,
                        mmap_offset: r.mmap_offset,
                        fd: push(fd.as_raw_fd()),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let queues = self
            .queues()
            .iter()
            .map(|q| {
                let vq = q.lock();
                let st = vq.state();
                let [kick, call, err] = vq.fds().map(|f| f.map(|f| push(f.as_raw_fd())));
                QueueState {
                    size: st.size,
                    addrs: st.addrs.map(|a| [a.desc, a.avail, a.used]),
                    last_avail: st.last_avail,
                    used_idx: st.used_idx,
                    enabled: st.enabled,
                    kicked: st.kicked,
                    kick,
                    call,
                    err,
                    broken: vq.broken(),
                    log_addr: st.log_addr,
                }
            })
            .collect();
        let log = self.log().map(|l| LogState {
            fd: push(l.fd().as_raw_fd()),
            size: l.size(),
            offset: l.offset(),
        });
        DeviceState {
            queue_pairs: self.queue_pairs(),
            features: self.features(),
            protocol: self.protocol_features(),
            errors: self.errors,
            regions,
            queues,
            log,
        }
    }

    /// Rebuilds a device another process exported: validates `state`, takes the fds it
    /// names from `fds`, maps the memory and the dirty log, configures every queue and
    /// prefaults the rings' pages. Queues are not started: nothing touches guest memory
    /// (beyond the prefault's reads) until [`Device::resume`].
    pub fn restore(
        name: &str,
        state: &DeviceState,
        fds: &mut dyn FdSource,
    ) -> Result<Device, StateError> {
        state.validate()?;
        let mem = if state.regions.is_empty() {
            None
        } else {
            let mut table = Vec::with_capacity(state.regions.len());
            for r in &state.regions {
                let desc = RegionDesc {
                    gpa: r.gpa,
                    size: r.size,
                    uaddr: r.uaddr,
                    mmap_offset: r.mmap_offset,
                };
                table.push((desc, take(fds, r.fd)?));
            }
            Some(Arc::new(
                GuestMemory::map(table).map_err(StateError::Memory)?,
            ))
        };
        let log = match &state.log {
            None => None,
            Some(l) => {
                let fd = take(fds, l.fd)?;
                let log = DirtyLog::map(fd, l.size, l.offset).map_err(StateError::Log)?;
                Some(Arc::new(log))
            }
        };
        let mut d = Device::new(name, state.queue_pairs);
        d.set_negotiated(state.features, state.protocol, state.errors, mem, log);
        for (i, q) in state.queues.iter().enumerate() {
            let [kick, call, err] = [q.kick, q.call, q.err].map(|f| take_opt(fds, f));
            let (kick, call, err) = (kick?, call?, err?);
            for fd in [&kick, &call].into_iter().flatten() {
                // Read only when woken, written from a PMD: neither may ever block.
                let _ = os::set_nonblocking(std::os::fd::AsFd::as_fd(fd), true);
            }
            d.restore_queue(i, q.vring(), [kick, call, err], q.broken)
                .map_err(|source| StateError::Queue { queue: i, source })?;
        }
        d.prefault();
        Ok(d)
    }
}

#[cfg(feature = "serde")]
mod wire {
    //! `ChainError` on the wire: the name of its drop reason (what schemas 1 and 2 carry).
    use super::ChainError;

    impl serde::Serialize for ChainError {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(self.name())
        }
    }

    impl<'de> serde::Deserialize<'de> for ChainError {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
            ChainError::from_any_name(&name)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown queue error {name:?}")))
        }
    }
}

#[cfg(test)]
mod tests {
    //! One test per validation rule: each hostile state gives its own error.
    use super::*;

    const MB: u64 = 1 << 20;

    fn region(gpa: u64, uaddr: u64, size: u64, fd: u32) -> RegionState {
        RegionState {
            gpa,
            size,
            uaddr,
            mmap_offset: 0,
            fd,
        }
    }

    fn queue(base: u64) -> QueueState {
        QueueState {
            size: 256,
            addrs: Some([base, base + 0x1000, base + 0x2000]),
            last_avail: 7,
            used_idx: 7,
            enabled: true,
            kicked: true,
            ..Default::default()
        }
    }

    /// A valid one-pair device with 2 MiB of memory at uaddr 0x7f00_0000_0000.
    fn good() -> DeviceState {
        let u = 0x7f00_0000_0000;
        DeviceState {
            queue_pairs: 1,
            features: features::VIRTIO_F_VERSION_1,
            protocol: 0,
            errors: 0,
            regions: vec![region(0, u, MB, 0), region(MB, u + MB, MB, 1)],
            queues: vec![queue(u), queue(u + MB)],
            log: None,
        }
    }

    #[test]
    fn a_good_state_and_an_empty_memory_table_validate() {
        good().validate().unwrap();
        let mut s = good();
        s.regions.clear();
        s.validate().unwrap();
    }

    #[test]
    fn queue_pairs_out_of_range() {
        let mut s = good();
        s.queue_pairs = 0;
        assert!(matches!(s.validate(), Err(StateError::QueuePairs(0))));
        s.queue_pairs = MAX_QUEUE_PAIRS + 1;
        assert!(matches!(s.validate(), Err(StateError::QueuePairs(_))));
    }

    #[test]
    fn queue_count_must_match_pairs() {
        let mut s = good();
        s.queues.pop();
        assert!(matches!(
            s.validate(),
            Err(StateError::QueueCount {
                queues: 1,
                pairs: 1
            })
        ));
    }

    #[test]
    fn unoffered_features() {
        let mut s = good();
        s.features |= 1 << 63;
        assert!(matches!(s.validate(), Err(StateError::Features(b)) if b == 1 << 63));
        let mut s = good();
        s.protocol = 1 << 62;
        assert!(matches!(s.validate(), Err(StateError::ProtocolFeatures(_))));
    }

    #[test]
    fn too_many_regions() {
        let mut s = good();
        s.regions = (0..=MAX_REGIONS as u64)
            .map(|i| region(i * MB, i * MB, MB, i as u32))
            .collect();
        assert!(matches!(s.validate(), Err(StateError::TooManyRegions(_))));
    }

    #[test]
    fn empty_region() {
        let mut s = good();
        s.regions[1].size = 0;
        assert!(matches!(s.validate(), Err(StateError::EmptyRegion(1))));
    }

    #[test]
    fn region_overflow() {
        let mut s = good();
        s.regions[1].uaddr = u64::MAX - 10;
        assert!(matches!(s.validate(), Err(StateError::RegionOverflow(1))));
        let mut s = good();
        s.regions[0].mmap_offset = u64::MAX;
        assert!(matches!(s.validate(), Err(StateError::RegionOverflow(0))));
    }

    #[test]
    fn region_overlap() {
        let mut s = good();
        s.regions[1].gpa = MB / 2;
        assert!(matches!(
            s.validate(),
            Err(StateError::RegionOverlap { index: 1, other: 0 })
        ));
        let mut s = good();
        s.regions[1].uaddr = s.regions[0].uaddr + MB - 4096;
        assert!(matches!(
            s.validate(),
            Err(StateError::RegionOverlap { index: 1, other: 0 })
        ));
    }

    #[test]
    fn queue_size() {
        let mut s = good();
        s.queues[1].size = 100;
        assert!(matches!(
            s.validate(),
            Err(StateError::QueueSize {
                queue: 1,
                size: 100
            })
        ));
        s.queues[1].size = 2 * MAX_QUEUE_SIZE as u32;
        assert!(matches!(s.validate(), Err(StateError::QueueSize { .. })));
        s.queues[1].size = 0;
        assert!(matches!(s.validate(), Err(StateError::QueueSize { .. })));
    }

    #[test]
    fn ring_outside_memory() {
        let mut s = good();
        let end = s.regions[1].uaddr + MB;
        s.queues[0].addrs = Some([end - 2048, end - 0x800, end + 0x1000]);
        assert!(matches!(
            s.validate(),
            Err(StateError::RingOutsideMemory {
                queue: 0,
                area: RingArea::Descriptors,
                ..
            })
        ));
        // The used ring's last bytes past the end.
        let mut s = good();
        s.queues[1].addrs = Some([s.regions[1].uaddr, s.regions[1].uaddr + 0x1000, end - 8]);
        assert!(matches!(
            s.validate(),
            Err(StateError::RingOutsideMemory {
                queue: 1,
                area: RingArea::Used,
                ..
            })
        ));
    }

    #[test]
    fn ring_misaligned() {
        let mut s = good();
        let [d, a, u] = s.queues[0].addrs.unwrap();
        s.queues[0].addrs = Some([d, a + 1, u]);
        assert!(matches!(
            s.validate(),
            Err(StateError::RingMisaligned {
                queue: 0,
                area: RingArea::Available,
                ..
            })
        ));
    }

    #[test]
    fn started_without_ring() {
        let mut s = good();
        s.queues[1].addrs = None;
        assert!(matches!(
            s.validate(),
            Err(StateError::StartedWithoutRing { queue: 1 })
        ));
    }

    #[test]
    fn ring_index_out_of_range() {
        let mut s = good();
        s.queues[0].last_avail = 7 + 257;
        assert!(matches!(
            s.validate(),
            Err(StateError::RingIndex {
                queue: 0,
                in_flight: 257,
                ..
            })
        ));
        // Wrapping: 3 chains in flight across the u16 boundary are fine.
        let mut s = good();
        s.queues[0].used_idx = u16::MAX - 1;
        s.queues[0].last_avail = 1;
        s.validate().unwrap();
    }

    #[test]
    fn not_breaking() {
        let mut s = good();
        s.queues[0].broken = Some(ChainError::NotArrived);
        assert!(matches!(
            s.validate(),
            Err(StateError::NotBreaking { queue: 0, .. })
        ));
        s.queues[0].broken = Some(ChainError::Loop);
        s.validate().unwrap();
    }

    #[test]
    fn missing_fd_and_fd_named_twice() {
        let s = DeviceState {
            regions: vec![],
            ..good()
        };
        let mut s = s;
        s.queues[0].kick = Some(0);
        s.queues[1].kick = Some(0);
        let fd = os::memfd("kick", 8, false).unwrap();
        let mut fds = vec![Some(fd)];
        let e = Device::restore("t", &s, &mut fds).unwrap_err();
        assert!(matches!(e, StateError::MissingFd(0)), "{e}");
        s.queues[1].kick = Some(5);
        let mut fds: Vec<Option<OwnedFd>> = vec![Some(os::memfd("kick", 8, false).unwrap())];
        let e = Device::restore("t", &s, &mut fds).unwrap_err();
        assert!(matches!(e, StateError::MissingFd(5)), "{e}");
    }

    /// A device on packed rings (any size, 4-byte event structures, positions with their
    /// wrap counters) is carried on; a position past the ring or with used behind available
    /// is refused, each with its own error.
    #[test]
    fn packed_rings_validate_and_round_trip() {
        let u = 0x7f00_0000_0000;
        let packed = |base: u64| QueueState {
            size: 300,
            addrs: Some([base, base + 0x2000, base + 0x2004]),
            last_avail: 0x8000 | 299,
            used_idx: 0x8000 | 299,
            enabled: true,
            kicked: true,
            ..Default::default()
        };
        let good = DeviceState {
            features: features::VIRTIO_F_VERSION_1 | features::VIRTIO_F_RING_PACKED,
            queues: vec![packed(u), packed(u + MB)],
            ..good()
        };
        good.validate().unwrap();
        let mut s = good.clone();
        s.queues[1].last_avail = 300;
        s.queues[1].used_idx = 300;
        assert!(matches!(
            s.validate(),
            Err(StateError::PackedPosition { queue: 1, .. })
        ));
        let mut s = good.clone();
        s.queues[0].used_idx = 0x8000 | 298;
        assert!(matches!(
            s.validate(),
            Err(StateError::PackedPosition { queue: 0, .. })
        ));
        let mut s = good.clone();
        s.queues[0].size = 32769;
        assert!(matches!(
            s.validate(),
            Err(StateError::PackedQueueSize {
                queue: 0,
                size: 32769
            })
        ));
        let mut s = good.clone();
        s.queues[0].addrs = Some([u, u + 0x2002, u + 0x2004]);
        assert!(matches!(
            s.validate(),
            Err(StateError::RingMisaligned {
                queue: 0,
                area: RingArea::Available,
                ..
            })
        ));
        // Without memory, restore and export give the same plain data back.
        let mut s = good;
        s.regions.clear();
        let d = Device::restore("t", &s, &mut Vec::new()).unwrap();
        assert_eq!(d.export(&mut Vec::new()), s);
    }

    #[test]
    fn export_then_restore_round_trips() {
        let mut s = good();
        s.regions.clear();
        s.queues[0].broken = Some(ChainError::BadIndirect);
        s.queues[1].kick = Some(0);
        s.queues[1].call = Some(1);
        s.errors = 3;
        let mut fds: Vec<Option<OwnedFd>> = (0..2)
            .map(|_| Some(os::memfd("fd", 8, false).unwrap()))
            .collect();
        let d = Device::restore("t", &s, &mut fds).unwrap();
        let mut out = Vec::new();
        let back = d.export(&mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(back, s);
    }

    #[cfg(feature = "serde")]
    #[test]
    fn queue_errors_travel_by_drop_reason_name() {
        for e in ChainError::ALL {
            let j = serde_json::to_string(&e).unwrap();
            assert_eq!(j, format!("\"{}\"", e.name()));
            assert_eq!(serde_json::from_str::<ChainError>(&j).unwrap(), e);
        }
        assert!(serde_json::from_str::<ChainError>("\"no_such\"").is_err());
    }
}
