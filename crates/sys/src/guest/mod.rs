//! Guest memory: the trust domain of a VM that may be hostile.
//!
//! Everything here maps or reads memory that a vhost-user frontend shares with us and that
//! its guest writes concurrently: the guest's RAM ([`memory`]), the split and packed rings
//! laid over it ([`vring`], [`packed`]), the frontend's dirty-page log during a live
//! migration ([`dirty_log`]), the userfaultfd through which postcopy pages guest RAM in ([`userfault`]), and the SIGBUS
//! guard that keeps a frontend that truncates a shared file from killing us ([`sigbus`]).
//!
//! Invariants every module here keeps (the threat model, `docs/threat-model.md`, assumes the
//! guest and its frontend are malicious):
//!
//! * **Checked once, then unable to escape.** A memory table, a ring or a log is validated
//!   against the fd that backs it when it is set up (sizes, overflow, overlaps, alignment);
//!   afterwards every access goes through a translation or an index mask that cannot leave
//!   the mapping, whatever values the guest writes.
//! * **No Rust reference into shared memory.** Bytes are moved with raw copies and ring
//!   indices and log words with atomics; a guest changing memory under us changes only the
//!   values we read, never the memory we touch.
//! * **Every shared mapping is registered with [`sigbus`]** for its whole life, so a shrunk
//!   file faults the offending port's queue, not the process.
//! * **No PMD ever waits on a guest page.** In postcopy the residency of pages is checked
//!   before an access and missing ones are faulted in by a per-memory thread.
//! * Values read from guest memory are untrusted data; checking what they mean (descriptor
//!   chains, lengths) is the caller's job (the `vhost` crate), with the accessors here as the
//!   last line that no value can cross.
//!
//! Not here, although guest-facing: [`crate::mmap`] (the owned mapping, shared by both trust
//! domains and the packet pool) and [`crate::pool`] (the switch's private packet buffers,
//! which neither a guest nor the kernel can see).

pub mod dirty_log;
pub mod memory;
pub mod packed;
pub mod sigbus;
pub mod userfault;
pub mod vring;
