//! Tunnel ports over the host stack: VXLAN (RFC 7348) and Geneve (RFC 8926). A UDP socket
//! bound to the local endpoint (`local_ip`, default any, and `dst_port`, default 4789 or
//! 6081) carries Ethernet frames behind a VXLAN or Geneve header to one remote endpoint.
//! The kernel routes, resolves the next hop and computes the outer IPv4 and UDP checksums
//! (so `options:csum=true` holds whatever is asked); we add and strip the tunnel header.
//!
//! A tunnel port takes no offload metadata on transmit (`tx_caps` 0): the PMD completes
//! partial checksums and cuts TSO packets into MSS-sized segments in software *before* they
//! are encapsulated, so every inner frame leaves with correct inner checksums (the case the
//! kernel datapath handles with GSO and OVS-DPDK without TSO support loses).
//!
//! **Keys.** With a fixed key (`key=N`, default 0) a port sends with VNI N and accepts only
//! VNI N. With `key=flow` (OVN's ports) the VNI of each packet sent is the `tun_id` the
//! rules set (`set_field:...->tun_id`), and Geneve options are the `tun_metadataN` they set,
//! encoded through the bridge's [`TlvMap`] (see [`TlvTable`]); on receive any VNI is
//! accepted and becomes the packet's `tun_id`, and mapped options its `tun_metadataN`.
//! The per-packet metadata travels beside the packets, never in them: received, in the
//! burst's `rx_tun` ([`KernelPort::rx_burst_tunnel`]); sent, as an index into the burst's
//! metadata table in the output list of a flow-based port only ([`TxPkts::tunnel`]).
//!
//! Receive: a datagram is accepted only from the port's remote address, with a header that
//! checks ([`crate::geneve::Geneve::parse`]: a Geneve frame with a bad version, an options
//! length beyond the datagram, a critical option the map does not know, a non-Ethernet
//! payload or the OAM flag is dropped and counted as `tunnel_bad_header`), with the I flag
//! (VXLAN) and the port's VNI unless `key=flow`; anything else is counted
//! (`tunnel_mismatch`, `runt`) and dropped. Frames arrive already decapsulated in the PMD's
//! buffers.
//!
//! **Several ports on one local endpoint** (OVN: one port per remote chassis, all on
//! `:6081`): they share one socket ([`TunnelEndpoint`], with the set of its ports'
//! remotes). A port alone on its endpoint reads datagrams directly. With siblings, a burst
//! takes the endpoint's read lock (`try_lock`: busy, the burst is empty), peeks each
//! datagram's source (`MSG_PEEK`), reads only its own, stops at a sibling's (whose next
//! poll takes it), and consumes and counts one from an address no port has
//! (`tunnel_mismatch`). The kernel cannot demultiplex for us: a connected UDP socket also
//! matches the peer's source port, which OVS varies per flow.
//!
//! Costs: one `recvfrom` per datagram (plus one that finds the socket empty; with siblings
//! one `MSG_PEEK` more per datagram) and one `sendto` per frame; batching with
//! recvmmsg/sendmmsg is future work.
//!
//! Thread-safety: the socket is shared; any PMD may send; a port alone on its endpoint
//! receives with one system call per datagram, so concurrent readers are safe; siblings
//! read under the endpoint's lock (peek and read must see the same datagram). The TLV map
//! is an [`ArcSwap`] the control plane replaces; a burst loads it once.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use ferrovs_counters::{DropReason, QueueStats};
use ferrovs_flow::{TlvMap, TunnelKey};
use ferrovs_sys::pool::{Mbuf, Pool};
use ferrovs_vhost::virtqueue::BURST;

use crate::geneve::{self, Geneve, GeneveError, MAX_TX_HLEN};
use crate::kernel_port::{KernelPort, TxPkts};

/// The VXLAN header.
pub const VXLAN_HLEN: usize = 8;
/// The "VNI valid" flag.
const FLAG_I: u8 = 0x08;
/// IANA's VXLAN port.
pub const VXLAN_PORT: u16 = 4789;
pub use crate::geneve::GENEVE_PORT;
/// Largest inner frame we send or accept (jumbo frames fit).
const MAX_INNER: usize = 9216;

/// A bridge's tunnel option map as its tunnel ports read it: the control plane stores a new
/// map ([`ArcSwap::store`]), a burst loads it once.
pub type TlvTable = ArcSwap<TlvMap>;

/// The encapsulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encap {
    Vxlan,
    Geneve,
}

/// Where the VNI comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelVni {
    /// `key=N`: sent with N, only N accepted.
    Fixed(u32),
    /// `key=flow`: the packet's `tun_id` (see the module doc).
    Flow,
}

/// A local tunnel endpoint: the socket its ports share (see the module doc).
#[derive(Debug)]
pub struct TunnelEndpoint {
    pub sock: UdpSocket,
    pub local: SocketAddrV4,
    pub encap: Encap,
    /// Held while a port with siblings peeks and reads.
    rx: Mutex<()>,
    /// The remotes of the ports on this endpoint.
    remotes: ArcSwap<Vec<Ipv4Addr>>,
}

/// The receive buffer a tunnel endpoint's socket asks for: 4 MiB (OVS's userspace tunnels
/// use the kernel's defaults; a larger buffer costs only memory that holds packets).
pub const RECEIVE_BUFFER: usize = 4 << 20;

impl TunnelEndpoint {
    /// An endpoint on a bound socket (made non-blocking, its receive buffer
    /// [`RECEIVE_BUFFER`] where the kernel allows).
    pub fn new(sock: UdpSocket, encap: Encap) -> std::io::Result<Arc<TunnelEndpoint>> {
        sock.set_nonblocking(true)?;
        // Best effort: the default (212 KiB) holds ~170 datagrams, 17 ms at 10 000 per
        // second, which a PMD sharing its core with other work can miss by.
        let _ = ferrovs_sys::os::set_receive_buffer(&sock, RECEIVE_BUFFER);
        let local = match sock.local_addr()? {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
        };
        Ok(Arc::new(TunnelEndpoint {
            sock,
            local,
            encap,
            rx: Mutex::new(()),
            remotes: ArcSwap::default(),
        }))
    }

    /// Whether a port of this endpoint tunnels to `ip`.
    pub fn has_remote(&self, ip: Ipv4Addr) -> bool {
        self.remotes.load().contains(&ip)
    }

    fn add_remote(&self, ip: Ipv4Addr) {
        self.remotes.rcu(|r| {
            let mut v = Vec::clone(r);
            v.push(ip);
            v
        });
    }

    fn remove_remote(&self, ip: Ipv4Addr) {
        self.remotes.rcu(|r| {
            let mut v = Vec::clone(r);
            if let Some(i) = v.iter().position(|x| *x == ip) {
                v.swap_remove(i);
            }
            v
        });
    }
}

/// A tunnel port.
#[derive(Debug)]
pub struct TunnelIo {
    /// The endpoint's socket (shared with the endpoint's other ports).
    pub ep: Arc<TunnelEndpoint>,
    pub remote: SocketAddrV4,
    pub local: SocketAddrV4,
    pub encap: Encap,
    pub vni: TunnelVni,
    /// Geneve options ↔ `tun_metadataN` (the bridge's, shared with its other ports).
    pub tlv: Arc<TlvTable>,
    /// Frames received from the tunnel (decapsulated).
    pub rx: QueueStats,
    /// Frames sent into the tunnel.
    pub tx: QueueStats,
}

/// The VXLAN port of earlier releases: a [`TunnelIo`] with `encap` VXLAN.
pub type VxlanIo = TunnelIo;

impl Drop for TunnelIo {
    fn drop(&mut self) {
        self.ep.remove_remote(*self.remote.ip());
    }
}

impl TunnelIo {
    /// Wraps a bound UDP socket (made non-blocking): a port alone on its endpoint.
    pub fn with_socket(
        sock: UdpSocket,
        encap: Encap,
        remote: SocketAddrV4,
        vni: TunnelVni,
        tlv: Arc<TlvTable>,
    ) -> std::io::Result<TunnelIo> {
        Ok(TunnelIo::on_endpoint(
            TunnelEndpoint::new(sock, encap)?,
            remote,
            vni,
            tlv,
        ))
    }

    /// A port on endpoint `ep` (beside its other ports; the caller checks that none of them
    /// has `remote` already).
    pub fn on_endpoint(
        ep: Arc<TunnelEndpoint>,
        remote: SocketAddrV4,
        vni: TunnelVni,
        tlv: Arc<TlvTable>,
    ) -> TunnelIo {
        ep.add_remote(*remote.ip());
        TunnelIo {
            remote,
            local: ep.local,
            encap: ep.encap,
            ep,
            vni: match vni {
                TunnelVni::Fixed(v) => TunnelVni::Fixed(v & 0x00ff_ffff),
                TunnelVni::Flow => TunnelVni::Flow,
            },
            tlv,
            rx: QueueStats::default(),
            tx: QueueStats::default(),
        }
    }

    /// The endpoint's socket.
    #[inline]
    pub fn sock(&self) -> &UdpSocket {
        &self.ep.sock
    }

    /// A VXLAN port with a fixed VNI on a bound socket.
    pub fn new(sock: UdpSocket, remote: SocketAddrV4, vni: u32) -> std::io::Result<TunnelIo> {
        TunnelIo::with_socket(
            sock,
            Encap::Vxlan,
            remote,
            TunnelVni::Fixed(vni),
            Arc::default(),
        )
    }

    /// Binds the local endpoint of a VXLAN port with a fixed VNI.
    pub fn open(local: SocketAddrV4, remote: SocketAddrV4, vni: u32) -> std::io::Result<TunnelIo> {
        TunnelIo::new(UdpSocket::bind(local)?, remote, vni)
    }

    /// Binds the local endpoint of a port.
    pub fn bind(
        encap: Encap,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        vni: TunnelVni,
        tlv: Arc<TlvTable>,
    ) -> std::io::Result<TunnelIo> {
        TunnelIo::with_socket(UdpSocket::bind(local)?, encap, remote, vni, tlv)
    }

    /// Whether the port sends with per-packet metadata (`key=flow`).
    #[inline]
    pub fn takes_metadata(&self) -> bool {
        self.vni == TunnelVni::Flow
    }

    /// Replaces the option map (tests; the daemon stores into the bridge's shared table).
    pub fn set_tlv_map(&self, map: TlvMap) {
        self.tlv.store(Arc::new(map));
    }

    /// The tunnel metadata every frame this port receives starts from (the VNI is each
    /// frame's own with `key=flow`).
    pub fn tunnel_key(&self) -> TunnelKey {
        TunnelKey {
            id: match self.vni {
                TunnelVni::Fixed(v) => u64::from(v),
                TunnelVni::Flow => 0,
            },
            src: *self.remote.ip(),
            dst: *self.local.ip(),
            ..TunnelKey::default()
        }
    }

    /// Checks a received datagram `d`: the inner frame's offset and its tunnel metadata.
    #[inline]
    fn decap(&self, d: &[u8], map: &TlvMap, base: &TunnelKey) -> Result<(usize, TunnelKey), Rx> {
        let mut t = *base;
        let (hlen, vni) = match self.encap {
            Encap::Vxlan => {
                if d.len() < VXLAN_HLEN + 14 {
                    return Err(Rx::Runt);
                }
                if d[0] & FLAG_I == 0 {
                    return Err(Rx::Mismatch);
                }
                (VXLAN_HLEN, u32::from_be_bytes([0, d[4], d[5], d[6]]))
            }
            Encap::Geneve => {
                let g = Geneve::parse(d).map_err(|e| match e {
                    GeneveError::Runt => Rx::Runt,
                    _ => Rx::BadHeader,
                })?;
                g.map_options(map, &mut t).map_err(|_| Rx::BadHeader)?;
                (g.len(), g.vni())
            }
        };
        match self.vni {
            TunnelVni::Fixed(v) if v != vni => return Err(Rx::Mismatch),
            _ => {}
        }
        t.id = u64::from(vni);
        Ok((hlen, t))
    }
}

/// Why a datagram was not taken.
enum Rx {
    Runt,
    Mismatch,
    BadHeader,
}

impl KernelPort for TunnelIo {
    fn mode(&self) -> &'static str {
        match self.encap {
            Encap::Vxlan => "vxlan",
            Encap::Geneve => "geneve",
        }
    }

    fn stats(&self) -> [&QueueStats; 2] {
        [&self.tx, &self.rx]
    }

    /// The UDP socket: readable while datagrams wait.
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.ep.sock.as_fd())
    }

    #[inline]
    fn tunnel_key(&self) -> Option<TunnelKey> {
        Some(TunnelIo::tunnel_key(self))
    }

    #[inline]
    fn takes_tunnel_metadata(&self) -> bool {
        self.takes_metadata()
    }

    fn rx_burst<'p>(&self, pool: &'p Pool, out: &mut Vec<Mbuf<'p>>, max: usize) -> usize {
        self.rx_burst_tunnel(pool, out, max, None)
    }

    /// Reads up to `max` datagrams, decapsulated into buffers from `pool`, appended to `out`,
    /// with each one's tunnel metadata appended to `tun`.
    fn rx_burst_tunnel<'p>(
        &self,
        pool: &'p Pool,
        out: &mut Vec<Mbuf<'p>>,
        max: usize,
        mut tun: Option<&mut Vec<TunnelKey>>,
    ) -> usize {
        let max = max.min(BURST).min(out.capacity() - out.len());
        let (mut pkts, mut bytes, mut runts, mut mismatch, mut bad, mut errors) =
            (0u64, 0u64, 0, 0, 0, 0);
        let base = TunnelIo::tunnel_key(self);
        let map = self.tlv.load();
        let remotes = self.ep.remotes.load();
        // Siblings on the endpoint: read under its lock, only our own datagrams.
        let shared = remotes.len() > 1;
        let _guard = if shared {
            match self.ep.rx.try_lock() {
                Ok(g) => Some(g),
                Err(_) => return 0,
            }
        } else {
            None
        };
        for _ in 0..max {
            if shared {
                match self.ep.sock.peek_from(&mut []) {
                    Ok((_, SocketAddr::V4(a))) if a.ip() == self.remote.ip() => {}
                    // A sibling's: its next poll takes it.
                    Ok((_, SocketAddr::V4(a))) if remotes.contains(a.ip()) => break,
                    // Nobody's: read below and counted as a mismatch.
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => {
                        errors += 1;
                        break;
                    }
                }
            }
            let Some(mut m) = pool.alloc() else {
                self.rx.drop(DropReason::NoMbuf, 1);
                break;
            };
            let cap = m.max_data();
            let Some(buf) = m.fill(cap) else { break };
            match self.ep.sock.recv_from(buf) {
                Ok((n, from)) => {
                    let from_remote = match from {
                        SocketAddr::V4(a) => a.ip() == self.remote.ip(),
                        SocketAddr::V6(_) => false,
                    };
                    if !from_remote {
                        mismatch += 1;
                        continue;
                    }
                    let Some(d) = buf.get(..n) else { continue };
                    match self.decap(d, &map, &base) {
                        Ok((hlen, t)) => {
                            m.truncate(n);
                            m.pull_front(hlen);
                            pkts += 1;
                            bytes += (n - hlen) as u64;
                            out.push(m);
                            if let Some(tun) = tun.as_deref_mut() {
                                tun.push(t);
                            }
                        }
                        Err(Rx::Runt) => runts += 1,
                        Err(Rx::Mismatch) => mismatch += 1,
                        Err(Rx::BadHeader) => bad += 1,
                    }
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
        self.rx.drop(DropReason::TunnelBadHeader, bad);
        self.rx.drop(DropReason::RxError, errors);
        pkts as usize
    }

    /// Encapsulates and sends the frames; returns (sent, dropped). Frames must carry no
    /// offload metadata (see the module doc). With `key=flow` each frame's VNI and options
    /// are its metadata's ([`TxPkts::tunnel`]; a frame without any: VNI 0, no option).
    fn tx_burst(&self, pkts: TxPkts<'_, '_>) -> (u64, u64) {
        let mut buf = [0u8; MAX_TX_HLEN + MAX_INNER];
        let map = self.tlv.load();
        let fixed = match self.vni {
            TunnelVni::Fixed(v) => Some(v),
            TunnelVni::Flow => None,
        };
        // The header of a fixed-key port is the same for every frame: written once.
        let mut hlen = match (self.encap, fixed) {
            (Encap::Vxlan, Some(v)) => write_vxlan(&mut buf, v),
            (Encap::Geneve, Some(v)) => geneve::write_header(&mut buf, v, None, &map),
            (_, None) => 0,
        };
        let (mut sent, mut bytes, mut oversize, mut full, mut errors) = (0u64, 0u64, 0, 0, 0);
        for (k, m) in pkts.iter().enumerate() {
            let d = m.data();
            if d.len() > MAX_INNER {
                oversize += 1;
                continue;
            }
            if fixed.is_none() {
                let t = pkts.tunnel(k);
                let vni = t.map_or(0, |t| t.id as u32 & 0x00ff_ffff);
                hlen = match self.encap {
                    Encap::Vxlan => write_vxlan(&mut buf, vni),
                    Encap::Geneve => geneve::write_header(&mut buf, vni, t, &map),
                };
            }
            buf[hlen..hlen + d.len()].copy_from_slice(d);
            match self.ep.sock.send_to(&buf[..hlen + d.len()], self.remote) {
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

/// Writes a VXLAN header with `vni` at the front of `buf`; returns its length.
#[inline]
fn write_vxlan(buf: &mut [u8], vni: u32) -> usize {
    buf[..VXLAN_HLEN].fill(0);
    buf[0] = FLAG_I;
    buf[4..7].copy_from_slice(&vni.to_be_bytes()[1..]);
    VXLAN_HLEN
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrovs_flow::TlvEntry;

    const OVN: TlvEntry = TlvEntry {
        class: 0x0102,
        kind: 0x80,
        len: 4,
        index: 0,
    };

    fn frame(tag: u8) -> Vec<u8> {
        let mut f = vec![tag; 60];
        f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f
    }

    fn lo(port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
    }

    /// Two ports facing each other on the loopback: (a, b).
    fn pair(encap: Encap, vni: TunnelVni) -> (TunnelIo, TunnelIo) {
        let sa = UdpSocket::bind(lo(0)).unwrap();
        let sb = UdpSocket::bind(lo(0)).unwrap();
        let (pa, pb) = (sa.local_addr().unwrap(), sb.local_addr().unwrap());
        let v4 = |a: SocketAddr| match a {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => unreachable!(),
        };
        let a = TunnelIo::with_socket(sa, encap, v4(pb), vni, Arc::default()).unwrap();
        let b = TunnelIo::with_socket(sb, encap, v4(pa), vni, Arc::default()).unwrap();
        (a, b)
    }

    /// Receives what waits on `p` (the datagrams are on the loopback already).
    fn recv<'p>(p: &TunnelIo, pool: &'p Pool) -> (Vec<Mbuf<'p>>, Vec<TunnelKey>) {
        let (mut out, mut tun) = (Vec::with_capacity(BURST), Vec::with_capacity(BURST));
        for _ in 0..100 {
            p.rx_burst_tunnel(pool, &mut out, BURST, Some(&mut tun));
            if !out.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        (out, tun)
    }

    #[test]
    fn geneve_key_flow_carries_vni_and_mapped_option_both_ways() {
        let pool = Pool::new(64).unwrap();
        let (a, b) = pair(Encap::Geneve, TunnelVni::Flow);
        a.set_tlv_map(TlvMap::new([OVN]).unwrap());
        b.set_tlv_map(TlvMap::new([OVN]).unwrap());
        assert!(a.takes_metadata());
        let f = frame(1);
        let mut tx = Vec::with_capacity(BURST);
        let mut m = pool.alloc().unwrap();
        m.fill(f.len()).unwrap().copy_from_slice(&f);
        tx.push(m);
        let meta = [TunnelKey {
            id: 0x7b,
            meta: [0x0001_0002, 0, 0, 0],
            present: 1,
            ..TunnelKey::default()
        }];
        let pkts = TxPkts::new(&[0], &tx, &[]).with_tunnel(&[0], &meta);
        assert_eq!(a.tx_burst(pkts), (1, 0));
        let (got, tun) = recv(&b, &pool);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].data(), &f[..]);
        assert_eq!(tun[0].id, 0x7b);
        assert_eq!((tun[0].meta[0], tun[0].present), (0x0001_0002, 1));
        assert_eq!(tun[0].src, Ipv4Addr::LOCALHOST);
        // Without the map on the receiver the critical option is unknown: dropped, counted.
        b.set_tlv_map(TlvMap::default());
        let pkts = TxPkts::new(&[0], &tx, &[]).with_tunnel(&[0], &meta);
        assert_eq!(a.tx_burst(pkts), (1, 0));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut out = Vec::with_capacity(BURST);
        assert_eq!(b.rx_burst(&pool, &mut out, BURST), 0);
        assert_eq!(b.rx.drops(DropReason::TunnelBadHeader), 1);
        // A frame without metadata on a flow port: VNI 0, no option.
        let pkts = TxPkts::new(&[0], &tx, &[]);
        assert_eq!(a.tx_burst(pkts), (1, 0));
        let (_, tun) = recv(&b, &pool);
        assert_eq!((tun[0].id, tun[0].present), (0, 0));
    }

    #[test]
    fn fixed_keys_send_theirs_and_accept_only_theirs() {
        let pool = Pool::new(64).unwrap();
        for encap in [Encap::Vxlan, Encap::Geneve] {
            let (a, b) = pair(encap, TunnelVni::Fixed(5));
            let f = frame(2);
            let mut tx = Vec::with_capacity(BURST);
            let mut m = pool.alloc().unwrap();
            m.fill(f.len()).unwrap().copy_from_slice(&f);
            tx.push(m);
            // Metadata given to a fixed port is ignored: VNI 5.
            let meta = [TunnelKey {
                id: 9,
                ..TunnelKey::default()
            }];
            let pkts = TxPkts::new(&[0], &tx, &[]).with_tunnel(&[0], &meta);
            assert_eq!(a.tx_burst(pkts), (1, 0));
            let (got, tun) = recv(&b, &pool);
            assert_eq!(got[0].data(), &f[..], "{encap:?}");
            assert_eq!(tun[0].id, 5);
            // Another VNI (a raw datagram to b): a mismatch.
            let raw = UdpSocket::bind(lo(0)).unwrap();
            let mut d = [0u8; MAX_TX_HLEN + 60];
            let h = match encap {
                Encap::Vxlan => write_vxlan(&mut d, 6),
                Encap::Geneve => geneve::write_header(&mut d, 6, None, &TlvMap::default()),
            };
            d[h..h + 60].copy_from_slice(&f);
            raw.send_to(&d[..h + 60], b.local).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
            let mut out = Vec::with_capacity(BURST);
            assert_eq!(b.rx_burst(&pool, &mut out, BURST), 0);
            assert_eq!(b.rx.drops(DropReason::TunnelMismatch), 1, "{encap:?}");
        }
    }

    /// Two ports on one endpoint (one socket), remotes 127.0.0.2 and 127.0.0.3: each takes
    /// only its own datagrams, in order, whichever is polled first; one from an address no
    /// port has is consumed and counted.
    #[test]
    fn ports_sharing_an_endpoint_take_only_their_own_datagrams() {
        let pool = Pool::new(64).unwrap();
        let ep = TunnelEndpoint::new(UdpSocket::bind(lo(0)).unwrap(), Encap::Geneve).unwrap();
        let peer = |ip: [u8; 4]| UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::from(ip), 0)).unwrap();
        let (p2, p3, p4) = (
            peer([127, 0, 0, 2]),
            peer([127, 0, 0, 3]),
            peer([127, 0, 0, 4]),
        );
        let port = |s: &UdpSocket| match s.local_addr().unwrap() {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => unreachable!(),
        };
        let a = TunnelIo::on_endpoint(ep.clone(), port(&p2), TunnelVni::Flow, Arc::default());
        let b = TunnelIo::on_endpoint(ep.clone(), port(&p3), TunnelVni::Flow, Arc::default());
        assert!(ep.has_remote(Ipv4Addr::new(127, 0, 0, 3)));
        let send = |s: &UdpSocket, vni: u32| {
            let mut d = [0u8; 8 + 60];
            geneve::write_header(&mut d, vni, None, &TlvMap::default());
            d[8..].copy_from_slice(&frame(vni as u8));
            s.send_to(&d, ep.local).unwrap();
        };
        send(&p3, 1);
        send(&p2, 2);
        send(&p2, 3);
        send(&p4, 4);
        send(&p3, 5);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
        for _ in 0..10 {
            for (p, got) in [(&a, &mut got_a), (&b, &mut got_b)] {
                let (mut out, mut tun) = (Vec::with_capacity(BURST), Vec::with_capacity(BURST));
                p.rx_burst_tunnel(&pool, &mut out, BURST, Some(&mut tun));
                got.extend(tun.iter().map(|t| t.id));
            }
        }
        assert_eq!((got_a, got_b), (vec![2, 3], vec![1, 5]));
        let mismatch =
            a.rx.drops(DropReason::TunnelMismatch) + b.rx.drops(DropReason::TunnelMismatch);
        assert_eq!(mismatch, 1);
        // A port that goes leaves the endpoint.
        drop(b);
        assert!(!ep.has_remote(Ipv4Addr::new(127, 0, 0, 3)));
    }

    #[test]
    fn geneve_garbage_from_the_peer_is_counted_not_taken() {
        let pool = Pool::new(64).unwrap();
        let (a, b) = pair(Encap::Geneve, TunnelVni::Flow);
        let f = frame(3);
        let mut bad = Vec::new();
        // Version 1; options beyond the datagram; IPv4 payload; OAM; a short datagram.
        for (i, v) in [(0usize, 0x40u8), (0, 0x3f), (2, 0x08), (1, 0x80)] {
            let mut d = [0u8; 8 + 60];
            geneve::write_header(&mut d, 1, None, &TlvMap::default());
            d[8..].copy_from_slice(&f);
            d[i] = v;
            bad.push(d.to_vec());
        }
        bad.push(vec![0u8; 10]);
        for d in &bad {
            a.sock().send_to(d, b.local).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut out = Vec::with_capacity(BURST);
        assert_eq!(b.rx_burst(&pool, &mut out, BURST), 0);
        assert_eq!(b.rx.drops(DropReason::TunnelBadHeader), 4);
        assert_eq!(b.rx.drops(DropReason::Runt), 1);
    }
}
