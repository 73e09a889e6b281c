//! `ferrovs-sys`: the only crate of ferrovs that contains `unsafe` code.
//!
//! Everything that touches memory shared with an untrusted guest, raw file descriptors or
//! system calls that have no safe wrapper in `std` lives here, behind safe APIs whose
//! invariants are stated once:
//!
//! * [`mmap`]: owned shared mappings of file descriptors (guest RAM, packet pools).
//! * [`guest`]: the guest memory table: guest-physical and frontend-virtual address
//!   translation and bounds-checked copies in and out of guest memory.
//! * [`vring`]: a split virtqueue laid over guest memory, validated once when it is set up;
//!   its accessors cannot read or write outside the ring.
//! * [`pool`]: a preallocated packet-buffer pool, hugepage-backed when possible.
//! * [`sigbus`]: a guest that truncates its memory file under us breaks its port, not us.
//! * [`dirty_log`]: the dirty-page bitmap of a live migration, marked for every guest page
//!   the switch writes.
//! * [`userfault`]: userfaultfd, through which postcopy migration pages guest memory in.
//! * [`os`]: eventfds, fd passing (SCM_RIGHTS), epoll, CPU affinity, memfd, TSC.
//! * [`netdev`]: kernel network device names, indices, link state.
//! * [`tap`]: TAP devices (`/dev/net/tun` with a virtio-net header).
//! * [`vnet`]: the virtio-net header: offload metadata carried beside a packet.
//! * [`af_packet`]: AF_PACKET sockets bound to a netdev, with a mapped TPACKET_V3 RX ring.
//! * [`af_xdp`]: AF_XDP sockets on a netdev's queue 0: UMEM in a memfd, four mapped rings.
//! * [`bpf`]: the XDP program that redirects to them, loaded with raw `bpf(2)` calls.
//!
//! Guest memory is concurrently written by the guest. We never form Rust references
//! (`&[u8]`/`&mut [u8]`) into it: data is moved with raw copies and ring indices with atomics,
//! as DPDK and vm-memory do. A guest changing bytes under us can only change the values we
//! read, never make us access memory outside the mapping.

pub mod af_packet;
pub mod af_xdp;
pub mod bpf;
pub mod dirty_log;
pub mod guest;
pub mod mmap;
pub mod netdev;
pub mod os;
pub mod pool;
pub mod sigbus;
pub mod tap;
#[cfg(test)]
mod test_veth;
pub mod userfault;
pub mod vnet;
pub mod vring;
