//! VXLAN tunnel ports (RFC 7348) over the host stack: a UDP socket bound to the local
//! endpoint (`local_ip`, default any, and `dst_port`, default 4789) carries Ethernet frames
//! behind an 8-byte VXLAN header to one remote endpoint. The kernel routes, resolves the
//! next hop and computes the outer IPv4 and UDP checksums; we add and strip the VXLAN header.
//!
//! A tunnel port takes no offload metadata on transmit (`tx_caps` 0): the PMD completes
//! partial checksums and cuts TSO packets into MSS-sized segments in software *before* they
//! are encapsulated, so every inner frame leaves with correct inner checksums (the case the
//! kernel datapath handles with GSO and OVS-DPDK without TSO support loses).
//!
//! Receive: a datagram is accepted only from the port's remote endpoint with the port's VNI
//! and the I flag set; anything else is counted (`tunnel_mismatch`, `runt`) and dropped.
//! Frames arrive already decapsulated in the PMD's buffers; the flow pipeline sees the
//! tunnel metadata (`tun_id`, `tun_src`, `tun_dst`) from [`VxlanIo::tunnel_key`].
//!
//! Costs: one `recvfrom` per datagram (plus one that finds the socket empty) and one
//! `sendto` per frame; batching with recvmmsg/sendmmsg is future work.
//!
//! Thread-safety: the socket is shared; any PMD may send; receiving is one system call per
//! datagram, so concurrent readers are safe (one PMD polls a port in practice).

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};

use ferrovs_counters::{DropReason, QueueStats};
use ferrovs_flow::TunnelKey;
use ferrovs_sys::pool::{Mbuf, Pool};
use ferrovs_vhost::virtqueue::BURST;

use crate::kernel_port::{KernelPort, TxPkts};

/// The VXLAN header.
pub const VXLAN_HLEN: usize = 8;
/// The "VNI valid" flag.
const FLAG_I: u8 = 0x08;
/// IANA's VXLAN port.
pub const VXLAN_PORT: u16 = 4789;
/// Largest inner frame we send or accept (jumbo frames fit).
const MAX_INNER: usize = 9216;

/// A VXLAN port.
#[derive(Debug)]
pub struct VxlanIo {
    pub sock: UdpSocket,
    pub remote: SocketAddrV4,
    pub local: SocketAddrV4,
    pub vni: u32,
    /// Frames received from the tunnel (decapsulated).
    pub rx: QueueStats,
    /// Frames sent into the tunnel.
    pub tx: QueueStats,
}

impl VxlanIo {
    /// Wraps a bound UDP socket (made non-blocking).
    pub fn new(sock: UdpSocket, remote: SocketAddrV4, vni: u32) -> std::io::Result<VxlanIo> {
        sock.set_nonblocking(true)?;
        let local = match sock.local_addr()? {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
        };
        Ok(VxlanIo {
            sock,
            remote,
            local,
            vni: vni & 0x00ff_ffff,
            rx: QueueStats::default(),
            tx: QueueStats::default(),
        })
    }

    /// Binds the local endpoint.
    pub fn open(local: SocketAddrV4, remote: SocketAddrV4, vni: u32) -> std::io::Result<VxlanIo> {
        VxlanIo::new(UdpSocket::bind(local)?, remote, vni)
    }

    /// The tunnel metadata of every frame this port receives.
    pub fn tunnel_key(&self) -> TunnelKey {
        TunnelKey {
            id: u64::from(self.vni),
            src: *self.remote.ip(),
            dst: *self.local.ip(),
        }
    }
}

impl KernelPort for VxlanIo {
    fn mode(&self) -> &'static str {
        "vxlan"
    }

    fn stats(&self) -> [&QueueStats; 2] {
        [&self.tx, &self.rx]
    }

    /// The UDP socket: readable while datagrams wait.
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.sock.as_fd())
    }

    #[inline]
    fn tunnel_key(&self) -> Option<TunnelKey> {
        Some(VxlanIo::tunnel_key(self))
    }

    /// Reads up to `max` datagrams, decapsulated into buffers from `pool`, appended to `out`.
    fn rx_burst<'p>(&self, pool: &'p Pool, out: &mut Vec<Mbuf<'p>>, max: usize) -> usize {
        let max = max.min(BURST).min(out.capacity() - out.len());
        let (mut pkts, mut bytes, mut runts, mut mismatch, mut errors) = (0u64, 0u64, 0, 0, 0);
        for _ in 0..max {
            let Some(mut m) = pool.alloc() else {
                self.rx.drop(DropReason::NoMbuf, 1);
                break;
            };
            let cap = m.max_data();
            let Some(buf) = m.fill(cap) else { break };
            match self.sock.recv_from(buf) {
                Ok((n, from)) => {
                    if n < VXLAN_HLEN + 14 {
                        runts += 1;
                        continue;
                    }
                    let vni = u32::from_be_bytes([0, buf[4], buf[5], buf[6]]);
                    let from_remote = match from {
                        SocketAddr::V4(a) => a.ip() == self.remote.ip(),
                        SocketAddr::V6(_) => false,
                    };
                    if buf[0] & FLAG_I == 0 || vni != self.vni || !from_remote {
                        mismatch += 1;
                        continue;
                    }
                    m.truncate(n);
                    m.pull_front(VXLAN_HLEN);
                    pkts += 1;
                    bytes += (n - VXLAN_HLEN) as u64;
                    out.push(m);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    errors += 1;
                    break;
                }
            }
        }
        self.rx.add(pkts, bytes);
        self.rx.drop(DropReason::Runt, runts);
        self.rx.drop(DropReason::TunnelMismatch, mismatch);
        self.rx.drop(DropReason::RxError, errors);
        pkts as usize
    }

    /// Encapsulates and sends `n` frames; returns (sent, dropped). Frames must carry no
    /// offload metadata (see the module doc).
    fn tx_burst(&self, pkts: TxPkts<'_, '_>) -> (u64, u64) {
        let mut buf = [0u8; VXLAN_HLEN + MAX_INNER];
        buf[0] = FLAG_I;
        buf[4..7].copy_from_slice(&self.vni.to_be_bytes()[1..]);
        let (mut sent, mut bytes, mut oversize, mut full, mut errors) = (0u64, 0u64, 0, 0, 0);
        for m in pkts.iter() {
            let d = m.data();
            if d.len() > MAX_INNER {
                oversize += 1;
                continue;
            }
            buf[VXLAN_HLEN..VXLAN_HLEN + d.len()].copy_from_slice(d);
            match self.sock.send_to(&buf[..VXLAN_HLEN + d.len()], self.remote) {
                Ok(_) => {
                    sent += 1;
                    bytes += d.len() as u64;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => full += 1,
                Err(_) => errors += 1,
            }
        }
        self.tx.add(sent, bytes);
        self.tx.drop(DropReason::Oversize, oversize);
        self.tx.drop(DropReason::KernelTxFull, full);
        self.tx.drop(DropReason::TxError, errors);
        (sent, oversize + full + errors)
    }
}
