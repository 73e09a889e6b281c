//! Surviving a guest that shrinks its memory file after we mapped it.
//!
//! Accessing a shared mapping past the end of its (now truncated) file raises SIGBUS. A
//! frontend can do that to us at any time, so every guest region is registered here, and a
//! SIGBUS handler checks the faulting address: inside a guest region, it maps an anonymous
//! zero page over the faulting page (the access then completes, reading zeros or writing into
//! a private page) and flags the region; anywhere else, it restores the default action and
//! lets the signal kill the process as usual. The datapath checks the flag after each burst
//! and marks the queue broken, so the offending port stops and every other port goes on.
//!
//! The handler only touches a fixed table of atomics and makes one `mmap` system call: no
//! allocation, no lock.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

const SLOTS: usize = 1024;

struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};
static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static INSTALL: Once = Once::new();

/// A registered guest range; unregistered on drop.
#[derive(Debug)]
pub struct Guard {
    slot: Option<usize>,
}

impl Guard {
    /// Whether an access in the range faulted (the file was shrunk under us).
    #[inline]
    pub fn faulted(&self) -> bool {
        self.slot
            .is_some_and(|s| TABLE[s].faulted.load(Ordering::Relaxed))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(s) = self.slot {
            TABLE[s].end.store(0, Ordering::Release);
            TABLE[s].start.store(0, Ordering::Release);
        }
    }
}

/// Registers `[start, start + len)` as guest memory. If the table is full the range is not
/// protected (a SIGBUS there stays fatal) and the guard says so by never reporting a fault.
pub fn register(start: *const u8, len: usize) -> Guard {
    INSTALL.call_once(install);
    let (s, e) = (start as usize, start as usize + len);
    for (i, slot) in TABLE.iter().enumerate() {
        if slot
            .start
            .compare_exchange(0, s, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            slot.faulted.store(false, Ordering::Relaxed);
            slot.end.store(e, Ordering::Release);
            return Guard { slot: Some(i) };
        }
    }
    Guard { slot: None }
}

fn install() {
    // SAFETY: a zeroed sigaction is a valid starting value; we fill the handler, flags and
    // an empty mask before installing it.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = handler;
        sa.sa_sigaction = f as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

extern "C" fn handler(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in TABLE.iter() {
        let (s, e) = (
            slot.start.load(Ordering::Acquire),
            slot.end.load(Ordering::Acquire),
        );
        if s != 0 && addr >= s && addr < e {
            let page = addr & !4095;
            // SAFETY: replaces one page inside a guest mapping we own with a private zero
            // page (MAP_FIXED over our own mapping); nothing else can live there.
            let p = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                slot.faulted.store(true, Ordering::Relaxed);
                return;
            }
        }
    }
    // Not guest memory: a real bug. Die as the signal intends.
    // SAFETY: restoring the default disposition and re-raising are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}
