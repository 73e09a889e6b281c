//! Kernel I/O: the trust domain of the host kernel's network devices and sockets.
//!
//! Everything here turns a kernel interface that `std` does not wrap into a safe port
//! primitive: TAP devices ([`tap`]), AF_PACKET sockets with a mapped TPACKET_V3 receive ring
//! ([`af_packet`]), AF_XDP sockets with their UMEM and four mapped rings ([`af_xdp`]), the XDP
//! program that feeds them, loaded with raw `bpf(2)` ([`bpf`]), network device names, indices
//! and link state ([`netdev`]), and the virtio-net header that a TAP or packet socket
//! exchanges beside each frame ([`vnet`], plain data that the vhost ports share).
//!
//! The kernel is trusted not to be malicious, but it is a concurrent writer and its devices
//! come and go under us. Invariants every module here keeps:
//!
//! * **Rings shared with the kernel are read like guest memory.** Indices and status words
//!   with atomics (Acquire on the kernel's side, Release on ours), frames with raw copies,
//!   never as Rust references; every offset or address the kernel hands back is checked
//!   against its block or UMEM before use, so even a corrupt ring cannot move an access
//!   outside the mapping.
//! * **A device that goes away breaks its port, not the switch.** Send failures are sorted
//!   by errno into [`netdev::TxFail`] kinds and returned as values (per frame for a TAP,
//!   counted per burst in a [`af_packet::SendReport`] for the packet sockets) for the
//!   datapath to count; nothing on the packet path logs.
//! * **Everything is an fd that a hot upgrade can hand over**: sockets, ring mappings, UMEM
//!   memfds, BPF links. A new daemon maps the same memory from the received fds and resumes
//!   from an exported position.
//! * Set-up and link-state queries (ioctls, `bpf(2)`) run on the control thread or on error
//!   paths only. On the packet path a TAP costs one system call per frame, the packet
//!   sockets one per burst, and polling an empty mapped ring none.
//!
//! Thread-safety is stated per module; in short, a TAP or AF_PACKET fd takes sends from any
//! number of threads, while each mapped ring has one reader or writer at a time (`&mut self`).

pub mod af_packet;
pub mod af_xdp;
pub mod bpf;
pub mod netdev;
pub mod tap;
#[cfg(test)]
mod test_veth;
pub mod vnet;
