//! The dirty-page log of a live migration (vhost-user `SET_LOG_BASE`, `VHOST_F_LOG_ALL`).
//!
//! While a VM migrates, its frontend (QEMU) copies guest memory to the destination over and
//! over, each time only the pages written since the last pass. It sees its own writes and
//! the guest's, but not ours: the switch writes received packets and used-ring entries into
//! guest memory behind its back. So the frontend shares a bitmap, one bit per 4 KiB page of
//! guest-physical memory, and we set the bit of every page we write. The frontend takes the
//! bits with an atomic exchange of each 64-bit word and then copies those pages.
//!
//! Invariants:
//! * A bit is set *after* the data it covers is written (the OR is a Release read-modify-write,
//!   and callers mark after copying): a frontend that clears the bit and copies the page then
//!   copies our data. Marking before writing could let the frontend copy the old page and
//!   clear the bit before our write lands, and the write would be lost at the destination.
//! * The log is untrusted shared memory, like guest memory: its size was checked against the
//!   fd before mapping, it is registered with the SIGBUS guard (a frontend that truncates it
//!   loses its own log, not our process), and pages beyond its size are silently not logged
//!   (the frontend sized the log for its memory; a guest address past it is not its RAM).
//! * Only atomic read-modify-writes touch the mapping; no Rust reference is formed into it.
//!
//! Thread-safety: `DirtyLog` is `Sync`: any number of PMDs mark the same log concurrently.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::mmap::Mmap;

/// Bytes of guest memory one bit of the log covers.
pub const PAGE_SIZE: u64 = 4096;

/// Largest log accepted: 1 GiB of bitmap covers 32 TiB of guest memory.
pub const MAX_LOG_SIZE: u64 = 1 << 30;

/// Why a log was refused.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("log size {0} is zero or larger than {MAX_LOG_SIZE}")]
    BadSize(u64),
    #[error("log fd holds {fd_size} bytes, the request claims {claimed} (size + offset)")]
    FdTooSmall { fd_size: u64, claimed: u64 },
    #[error("log offset {0} overflows")]
    BadOffset(u64),
    #[error("cannot stat the log fd")]
    Stat(#[source] io::Error),
    #[error("cannot map the log")]
    Map(#[source] io::Error),
}

/// A mapped dirty-page bitmap.
#[derive(Debug)]
pub struct DirtyLog {
    /// Dropped before `map`: unregistered before it is unmapped.
    sigbus: crate::guest::sigbus::Guard,
    map: Mmap,
    /// Offset of the bitmap in the mapping.
    offset: usize,
    /// Bytes of bitmap.
    size: u64,
    fd: OwnedFd,
}

impl DirtyLog {
    /// Maps `size` bytes of bitmap found at `offset` in `fd`, after checking the file holds
    /// them.
    pub fn map(fd: OwnedFd, size: u64, offset: u64) -> Result<DirtyLog, LogError> {
        if size == 0 || size > MAX_LOG_SIZE {
            return Err(LogError::BadSize(size));
        }
        let claimed = size
            .checked_add(offset)
            .filter(|c| *c <= isize::MAX as u64)
            .ok_or(LogError::BadOffset(offset))?;
        let (fd_size, _) = crate::os::fd_size(fd.as_fd()).map_err(LogError::Stat)?;
        if fd_size < claimed {
            return Err(LogError::FdTooSmall { fd_size, claimed });
        }
        let map = Mmap::map_shared(fd.as_fd(), claimed as usize, 0).map_err(LogError::Map)?;
        let sigbus = crate::guest::sigbus::register(map.as_ptr(), map.len());
        Ok(DirtyLog {
            sigbus,
            map,
            offset: offset as usize,
            size,
            fd,
        })
    }

    /// Bytes of bitmap.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Offset of the bitmap in its fd.
    pub fn offset(&self) -> u64 {
        self.offset as u64
    }

    /// The fd (for handing the log to another process).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Whether the frontend shrank the log's file under us (marks since then were lost to
    /// a zero page; the migration it serves cannot be trusted).
    pub fn faulted(&self) -> bool {
        self.sigbus.faulted()
    }

    /// ORs `bits` into 64-bit word `word` of the bitmap (pages `64 * word ..`). Bits past the
    /// end of the log are dropped.
    #[inline]
    pub fn or_word(&self, word: u64, bits: u64) {
        let Some(first) = word.checked_mul(8) else {
            return;
        };
        if first >= self.size {
            return;
        }
        let at = self.offset + first as usize;
        // SAFETY: `first < size` and the mapping holds `offset + size` bytes, so the byte at
        // `at` is mapped; when all 8 bytes are and the address is 8-byte aligned, an
        // `AtomicU64` may alias the shared bytes (atomics are how memory shared with another
        // process is accessed).
        let p = unsafe { self.map.as_ptr().add(at) };
        if first + 8 <= self.size && (p as usize).is_multiple_of(8) {
            // SAFETY: see above: in bounds, aligned, only accessed atomically.
            let w = unsafe { &*(p as *const AtomicU64) };
            w.fetch_or(bits.to_le(), Ordering::Release);
            return;
        }
        for (i, b) in bits.to_le_bytes().into_iter().enumerate() {
            if b == 0 || first + i as u64 >= self.size {
                continue;
            }
            // SAFETY: `first + i < size`: in the mapping; an `AtomicU8` has no alignment need.
            let byte = unsafe { &*(p.add(i) as *const AtomicU8) };
            byte.fetch_or(b, Ordering::Release);
        }
    }

    /// Whether the bit of page `page` is set (tests and the frontend side).
    pub fn is_marked(&self, page: u64) -> bool {
        let byte = page / 8;
        if byte >= self.size {
            return false;
        }
        // SAFETY: `byte < size`: in the mapping.
        let b =
            unsafe { &*(self.map.as_ptr().add(self.offset + byte as usize) as *const AtomicU8) };
        b.load(Ordering::Acquire) & (1 << (page % 8)) != 0
    }

    /// Takes and clears word `word` (what the frontend does on each pass: tests and our own
    /// driver side). Returns 0 past the end.
    pub fn take_word(&self, word: u64) -> u64 {
        let mut v = 0u64;
        for i in 0..8u64 {
            let byte = word * 8 + i;
            if byte >= self.size {
                break;
            }
            // SAFETY: `byte < size`: in the mapping.
            let b = unsafe {
                &*(self.map.as_ptr().add(self.offset + byte as usize) as *const AtomicU8)
            };
            v |= u64::from(b.swap(0, Ordering::AcqRel)) << (8 * i);
        }
        v
    }
}

/// Marks of one burst, merged per 64-page word and written to the log once per word when
/// the burst ends ([`LogBatch::flush`]), as DPDK's per-queue log cache does: a burst of
/// packets into neighbouring buffers costs one atomic OR, not one per packet.
#[derive(Debug)]
pub struct LogBatch<'a> {
    log: &'a DirtyLog,
    words: [(u64, u64); LogBatch::SLOTS],
    n: usize,
    /// Page bits written to the log so far.
    marked: u64,
}

impl<'a> LogBatch<'a> {
    const SLOTS: usize = 16;

    pub fn new(log: &'a DirtyLog) -> LogBatch<'a> {
        LogBatch {
            log,
            words: [(0, 0); LogBatch::SLOTS],
            n: 0,
            marked: 0,
        }
    }

    /// Notes that guest-physical `[gpa, gpa + len)` was written.
    #[inline]
    pub fn mark(&mut self, gpa: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = gpa / PAGE_SIZE;
        let last = gpa.saturating_add(len - 1) / PAGE_SIZE;
        let mut page = first;
        loop {
            self.mark_page(page);
            if page >= last {
                break;
            }
            page += 1;
        }
    }

    #[inline]
    fn mark_page(&mut self, page: u64) {
        let (word, bit) = (page / 64, 1u64 << (page % 64));
        for w in &mut self.words[..self.n] {
            if w.0 == word {
                w.1 |= bit;
                return;
            }
        }
        if self.n == Self::SLOTS {
            self.flush();
        }
        self.words[self.n] = (word, bit);
        self.n += 1;
    }

    /// Writes the marks to the log (call after the data they cover is written).
    #[inline]
    pub fn flush(&mut self) {
        for &(word, bits) in &self.words[..self.n] {
            self.log.or_word(word, bits);
            self.marked += u64::from(bits.count_ones());
        }
        self.n = 0;
    }

    /// Page bits written to the log so far (a page counts once per flush that marks it).
    pub fn marked(&self) -> u64 {
        self.marked
    }
}

impl Drop for LogBatch<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::memfd;

    #[test]
    fn marks_pages_words_and_ignores_the_outside() {
        let fd = memfd("log", 4096, false).unwrap();
        let log = DirtyLog::map(fd, 16, 8).unwrap();
        let mut b = LogBatch::new(&log);
        b.mark(0, 1); // page 0
        b.mark(4095, 2); // pages 0 and 1
        b.mark(64 * 4096 + 10, 8192); // pages 64, 65, 66 (word 1)
        b.mark(1 << 40, 4096); // far past the log: dropped
        assert!(!log.is_marked(0), "nothing is written before the flush");
        drop(b);
        for p in [0, 1, 64, 65, 66] {
            assert!(log.is_marked(p), "page {p}");
        }
        for p in [2, 63, 67, 127] {
            assert!(!log.is_marked(p), "page {p}");
        }
        assert_eq!(log.take_word(0), 0b11);
        assert_eq!(log.take_word(1), 0b111);
        assert_eq!(log.take_word(0), 0, "take clears");
        assert_eq!(log.take_word(5), 0, "past the end");
    }

    #[test]
    fn a_log_that_is_not_word_sized_is_marked_bytewise() {
        let fd = memfd("log", 4096, false).unwrap();
        // 5 bytes at offset 3: no aligned word; pages 0..40 only.
        let log = DirtyLog::map(fd, 5, 3).unwrap();
        log.or_word(0, u64::MAX);
        assert!(log.is_marked(0) && log.is_marked(39));
        assert!(!log.is_marked(40));
        assert_eq!(log.take_word(0), 0xff_ffff_ffff);
    }

    #[test]
    fn refuses_sizes_the_fd_does_not_hold() {
        let fd = memfd("log", 4096, false).unwrap();
        assert!(matches!(
            DirtyLog::map(fd.try_clone().unwrap(), 4096, 1),
            Err(LogError::FdTooSmall {
                fd_size: 4096,
                claimed: 4097
            })
        ));
        assert!(matches!(
            DirtyLog::map(fd.try_clone().unwrap(), 0, 0),
            Err(LogError::BadSize(0))
        ));
        assert!(matches!(
            DirtyLog::map(fd.try_clone().unwrap(), 8, u64::MAX),
            Err(LogError::BadOffset(_))
        ));
        assert!(matches!(
            DirtyLog::map(fd, MAX_LOG_SIZE + 1, 0),
            Err(LogError::BadSize(_))
        ));
    }

    #[test]
    fn a_log_truncated_under_us_faults_instead_of_killing() {
        let fd = memfd("log", 8192, false).unwrap();
        let log = DirtyLog::map(fd.try_clone().unwrap(), 8192, 0).unwrap();
        crate::os::truncate(fd.as_fd(), 0).unwrap();
        log.or_word(600, 1);
        assert!(log.faulted());
    }
}
