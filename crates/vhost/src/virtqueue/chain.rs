//! A descriptor chain the guest offered, walked once and checked as it goes: [`ChainError`]
//! (what a guest can get wrong, and the drop reason each is counted as) and `Chain`, the
//! walker used by both directions.
//!
//! Invariants: every index, length and address comes from guest memory and is untrusted. A
//! walk is bounded however the guest links its descriptors (a budget of the ring's size, or of
//! the one indirect table's entries); an indirect table is accepted only as the first
//! descriptor, when negotiated, unnested, and wholly inside guest memory. Any other shape is an
//! error that breaks the queue (by the caller, [`super::VirtQueue`]).
//!
//! Thread-safety: a `Chain` borrows the ring of a queue its caller holds locked; it keeps no
//! state past one chain.

use ferrovs_sys::guest::memory::{AccessError, GuestMemory};
use ferrovs_sys::guest::vring::{Descriptor, SplitRing, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT};

use crate::stats::DropReason;

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
    /// Packed rings: AVAIL/USED flags that are neither available nor used in this lap.
    #[error("packed descriptor flags fit neither the ring's wrap counter nor a used entry")]
    PackedBadFlags,
    /// Packed rings: a buffer id the queue cannot have given out.
    #[error("packed buffer id not below the queue size")]
    PackedBadBufferId,
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
            ChainError::PackedBadFlags => DropReason::PackedBadFlags,
            ChainError::PackedBadBufferId => DropReason::PackedBadBufferId,
        }
    }
}

impl ChainError {
    /// Every error that breaks a queue, for mapping to and from plain data (hot upgrade).
    pub const ALL: [ChainError; 10] = [
        ChainError::BadIndex,
        ChainError::Loop,
        ChainError::BadIndirect,
        ChainError::OutOfMemory,
        ChainError::WrongDirection,
        ChainError::BadAvailIdx,
        ChainError::MemoryFault,
        ChainError::LogFault,
        ChainError::PackedBadFlags,
        ChainError::PackedBadBufferId,
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

/// Walks one descriptor chain, direct or through one indirect table, with a budget that
/// bounds it however the guest links descriptors.
pub(super) struct Chain<'a> {
    ring: &'a SplitRing,
    mem: &'a GuestMemory,
    indirect: Option<(u64, u32)>,
    next: Option<u16>,
    budget: u32,
    first: bool,
    indirect_ok: bool,
}

/// A walk of one descriptor chain, split or packed: what the copy routines take.
pub(super) trait Walk {
    /// The next descriptor of the chain (only its address, length and WRITE flag are
    /// meaningful), `None` at its end.
    fn next(&mut self) -> Result<Option<Descriptor>, ChainError>;
}

impl Walk for Chain<'_> {
    #[inline(always)]
    fn next(&mut self) -> Result<Option<Descriptor>, ChainError> {
        Chain::next(self)
    }
}

impl<'a> Chain<'a> {
    pub(super) fn new(ring: &'a SplitRing, head: u16, indirect_ok: bool) -> Chain<'a> {
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

    /// The next descriptor of the chain, `None` at its end. A loop, not a recursion, into an
    /// indirect table: a recursive function is not inlined into the dequeue and enqueue loops
    /// (measured: two out-of-line calls per packet, ~50 instructions, when it was one).
    #[inline(always)]
    pub(super) fn next(&mut self) -> Result<Option<Descriptor>, ChainError> {
        loop {
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
                self.enter_indirect(&d, first)?;
                continue;
            }
            self.next = (d.flags & VRING_DESC_F_NEXT != 0).then_some(d.next);
            return Ok(Some(d));
        }
    }

    /// The chain's first descriptor points to an indirect table: the walk goes on there.
    #[inline(never)]
    fn enter_indirect(&mut self, d: &Descriptor, first: bool) -> Result<(), ChainError> {
        let count = d.len / 16;
        if !first
            || !self.indirect_ok
            || self.indirect.is_some()
            || d.flags & VRING_DESC_F_NEXT != 0
            || !d.len.is_multiple_of(16)
            || count == 0
            || count > 65536
        {
            return Err(ChainError::BadIndirect);
        }
        self.mem.check_range(d.addr, d.len as u64)?;
        self.indirect = Some((d.addr, count));
        self.budget = count;
        self.next = Some(0);
        Ok(())
    }
}
