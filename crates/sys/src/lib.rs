//! `ferrovs-sys`: the only crate of ferrovs that contains `unsafe` code.
//!
//! Everything that touches memory shared with an untrusted guest, raw file descriptors or
//! system calls that have no safe wrapper in `std` lives here, behind safe APIs whose
//! invariants are stated once. The modules are split by trust domain:
//!
//! * [`guest`]: memory a VM shares with us and writes concurrently; the guest is assumed
//!   hostile.
//!   * [`guest::memory`]: the guest memory table: guest-physical and frontend-virtual
//!     address translation and bounds-checked copies in and out of guest memory.
//!   * [`guest::vring`]: a split virtqueue laid over guest memory, validated once when it is
//!     set up; its accessors cannot read or write outside the ring.
//!   * [`guest::sigbus`]: a guest that truncates its memory file under us breaks its port,
//!     not us.
//!   * [`guest::dirty_log`]: the dirty-page bitmap of a live migration, marked for every
//!     guest page the switch writes.
//!   * [`guest::userfault`]: userfaultfd, through which postcopy migration pages guest memory
//!     in.
//! * [`kernel`]: the host kernel's network devices and the memory it shares with us.
//!   * [`kernel::netdev`]: kernel network device names, indices, link state.
//!   * [`kernel::tap`]: TAP devices (`/dev/net/tun` with a virtio-net header).
//!   * [`kernel::vnet`]: the virtio-net header: offload metadata carried beside a packet.
//!   * [`kernel::af_packet`]: AF_PACKET sockets bound to a netdev, with a mapped TPACKET_V3
//!     RX ring.
//!   * [`kernel::af_xdp`]: AF_XDP sockets on a netdev's queue 0: UMEM in a memfd, four mapped
//!     rings.
//!   * [`kernel::bpf`]: the XDP program that redirects to them, loaded with raw `bpf(2)`
//!     calls.
//! * Primitives both domains build on, at the top:
//!   * [`mmap`]: owned shared mappings of file descriptors (guest RAM, dirty logs, kernel
//!     rings, UMEMs, packet pools).
//!   * [`pool`]: a preallocated packet-buffer pool, hugepage-backed when possible: the
//!     switch's own memory, which packets from both domains are copied into.
//!   * [`os`]: eventfds, memfds, fd passing (SCM_RIGHTS), seqpacket sockets, epoll, socket
//!     options, CPU affinity and thread priority, TSC.
//!
//! Guest memory is concurrently written by the guest. We never form Rust references
//! (`&[u8]`/`&mut [u8]`) into it: data is moved with raw copies and ring indices with atomics,
//! as DPDK and vm-memory do. A guest changing bytes under us can only change the values we
//! read, never make us access memory outside the mapping.

pub mod guest;
pub mod kernel;
pub mod mmap;
pub mod os;
pub mod pool;
