//! The AF_XDP socket ([`XskSocket`]): set-up on a netdev (UMEM, rings, bind to queue 0, XDP
//! program, promiscuity), adoption of a handed-over socket's fds, and the kernel's counters.
//!
//! Invariant: the receive and transmit halves it returns share its socket and UMEM (`Arc`);
//! the XDP program stays attached and the device promiscuous while any of the three lives.
//! Handed-over fds are untrusted: each is checked to be what it claims (socket domain,
//! UMEM size, BPF object types, the link's device) before it is mapped or used.
//!
//! Thread-safety: shared; its methods are system calls on its own fds.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::rings::{RingMap, Umem};
use super::{XskError, XskFds, XskGeometry, XskRx, XskStats, XskTx};
use crate::kernel::bpf::{XdpMode, XdpProgram};
use crate::kernel::netdev;
use crate::mmap::Mmap;
use crate::os::{getopt, setopt};

fn socket(domain: libc::c_int, proto: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(domain, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An AF_XDP socket bound to queue 0 of a netdev, with its UMEM and XDP program.
#[derive(Debug)]
pub struct XskSocket {
    fd: Arc<OwnedFd>,
    umem: Arc<Umem>,
    promisc: Arc<OwnedFd>,
    prog: XdpProgram,
    ifindex: u32,
    zero_copy: bool,
}

impl XskSocket {
    /// Attaches to the existing Ethernet netdev `name`: UMEM, rings, socket bound to queue
    /// 0 (zero-copy if the driver has it, else copy), XDP program attached, device
    /// promiscuous and up. Every failure names the step and the kernel's reason.
    pub fn open(name: &str, geo: XskGeometry) -> Result<(XskSocket, XskRx, XskTx), XskError> {
        netdev::check_name(name)?;
        let setup = |what| {
            move |source| XskError::Setup {
                name: name.into(),
                what,
                source,
            }
        };
        geo.check()
            .map_err(|e| setup("size the UMEM")(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let ifindex = match netdev::ifindex(name) {
            Ok(i) => i,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(XskError::NoDevice(name.into()))
            }
            Err(e) => return Err(setup("look up the device")(e)),
        };
        // Protocol 0: this packet socket receives nothing; it only holds promiscuity.
        let promisc = socket(libc::AF_PACKET, 0).map_err(setup("open an AF_PACKET socket"))?;
        let hwtype =
            netdev::link_type(promisc.as_fd(), name).map_err(setup("read the link type"))?;
        if hwtype != libc::ARPHRD_ETHER {
            return Err(XskError::NotEthernet(name.into(), hwtype));
        }
        let fd = socket(libc::AF_XDP, 0).map_err(setup("open an AF_XDP socket"))?;
        let len = geo.umem_len();
        let memfd = crate::os::memfd("ferrovs-umem", len as u64, false)
            .map_err(setup("create the UMEM"))?;
        let map = Mmap::map_shared_populated(memfd.as_fd(), len).map_err(setup("map the UMEM"))?;
        let reg = libc::xdp_umem_reg {
            addr: map.as_ptr() as u64,
            len: len as u64,
            chunk_size: geo.frame_size,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setopt(fd.as_fd(), libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)
            .map_err(setup("register the UMEM"))?;
        for (opt, n) in [
            (libc::XDP_UMEM_FILL_RING, geo.rx_frames),
            (libc::XDP_UMEM_COMPLETION_RING, geo.tx_frames),
            (libc::XDP_RX_RING, geo.rx_frames),
            (libc::XDP_TX_RING, geo.tx_frames),
        ] {
            setopt(fd.as_fd(), libc::SOL_XDP, opt, &(n as libc::c_int))
                .map_err(setup("size the AF_XDP rings"))?;
        }
        let umem = Arc::new(Umem::new(memfd, map, geo).map_err(setup("map the UMEM"))?);
        let fd = Arc::new(fd);
        let promisc = Arc::new(promisc);
        let (mut rx, tx) = map_rings(&fd, &umem, &promisc, ifindex, false)
            .map_err(setup("map the AF_XDP rings"))?;
        // Every receive frame to the kernel before it can receive anything.
        for i in 0..geo.rx_frames {
            rx.fill.write_addr(i, i as u64 * geo.frame_size as u64);
        }
        rx.fill_prod = geo.rx_frames;
        rx.fill.producer().store(rx.fill_prod, Ordering::Release);
        // SAFETY: a zeroed sockaddr_xdp is valid.
        let mut sa: libc::sockaddr_xdp = unsafe { std::mem::zeroed() };
        sa.sxdp_family = libc::AF_XDP as u16;
        sa.sxdp_flags = libc::XDP_USE_NEED_WAKEUP;
        sa.sxdp_ifindex = ifindex;
        sa.sxdp_queue_id = 0;
        // SAFETY: `sa` is a valid sockaddr_xdp of the length passed.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(setup("bind the AF_XDP socket to queue 0")(
                io::Error::last_os_error(),
            ));
        }
        let zero_copy = zero_copy(fd.as_fd());
        rx.zero_copy = zero_copy;
        let prog = XdpProgram::attach(ifindex, fd.as_fd()).map_err(|source| XskError::Bpf {
            name: name.into(),
            source,
        })?;
        netdev::join_promiscuous(promisc.as_fd(), ifindex)
            .map_err(setup("enter promiscuous mode"))?;
        netdev::set_up(name).map_err(setup("bring the device up"))?;
        let mut tx = tx;
        tx.free.extend(geo.rx_frames..geo.rx_frames + geo.tx_frames);
        tx.is_free.iter_mut().for_each(|f| *f = true);
        let sock = XskSocket {
            fd,
            umem,
            promisc,
            prog,
            ifindex,
            zero_copy,
        };
        Ok((sock, rx, tx))
    }

    /// Adopts the fds of a socket another daemon set up (same geometry), mapping the same
    /// UMEM and rings. Nothing moves until [`XskRx::resume`] and [`XskTx::resume`].
    pub fn from_fds(
        fds: XskFds,
        geo: XskGeometry,
        ifindex: u32,
        mode: XdpMode,
    ) -> Result<(XskSocket, XskRx, XskTx), XskError> {
        let bad = |what: &str, e: io::Error| XskError::BadFd(format!("{what}: {e}"));
        geo.check().map_err(XskError::BadFd)?;
        for (what, fd, want) in [
            ("AF_XDP socket", &fds.xsk, libc::AF_XDP),
            ("promiscuity socket", &fds.promisc, libc::AF_PACKET),
        ] {
            let d = getopt(
                fd.as_fd(),
                libc::SOL_SOCKET,
                libc::SO_DOMAIN,
                0 as libc::c_int,
            )
            .map_err(|e| bad(what, e))?;
            if d != want {
                return Err(XskError::BadFd(format!("{what}: socket domain {d}")));
            }
        }
        let (size, _) = crate::os::fd_size(fds.umem.as_fd()).map_err(|e| bad("UMEM", e))?;
        if size != geo.umem_len() as u64 {
            return Err(XskError::BadFd(format!(
                "UMEM of {size} bytes, expected {}",
                geo.umem_len()
            )));
        }
        let map = Mmap::map_shared_populated(fds.umem.as_fd(), geo.umem_len())
            .map_err(|e| bad("mapping the UMEM", e))?;
        let prog = XdpProgram::from_fds(fds.map, fds.prog, fds.link, ifindex, mode)
            .map_err(|e| XskError::BadFd(e.to_string()))?;
        let umem = Arc::new(Umem::new(fds.umem, map, geo).map_err(|e| bad("mapping the UMEM", e))?);
        let fd = Arc::new(fds.xsk);
        let promisc = Arc::new(fds.promisc);
        let zc = zero_copy(fd.as_fd());
        let (mut rx, tx) = map_rings(&fd, &umem, &promisc, ifindex, zc)
            .map_err(|e| bad("mapping the rings", e))?;
        rx.zero_copy = zc;
        let sock = XskSocket {
            fd,
            umem,
            promisc,
            prog,
            ifindex,
            zero_copy: zc,
        };
        Ok((sock, rx, tx))
    }

    /// The fds to hand over, in [`XskFds`] order.
    pub fn handover_fds(&self) -> [BorrowedFd<'_>; 6] {
        [
            self.fd.as_fd(),
            self.umem.fd.as_fd(),
            self.promisc.as_fd(),
            self.prog.map.as_fd(),
            self.prog.prog.as_fd(),
            self.prog.link.as_fd(),
        ]
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    pub fn geometry(&self) -> XskGeometry {
        self.umem.geo
    }

    /// Whether the kernel bound in zero-copy mode (else copy mode).
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// How the XDP program is attached.
    pub fn xdp_mode(&self) -> XdpMode {
        self.prog.mode
    }

    /// The kernel's counters (one system call).
    pub fn statistics(&self) -> io::Result<XskStats> {
        // SAFETY: an all-zero xdp_statistics is a valid value.
        let s: libc::xdp_statistics = getopt(
            self.fd.as_fd(),
            libc::SOL_XDP,
            libc::XDP_STATISTICS,
            unsafe { std::mem::zeroed() },
        )?;
        Ok(XskStats {
            rx_dropped: s.rx_dropped,
            rx_ring_full: s.rx_ring_full,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
        })
    }
}

impl AsFd for XskSocket {
    /// The AF_XDP socket: readable while the rx ring has frames.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn zero_copy(fd: BorrowedFd<'_>) -> bool {
    getopt(
        fd,
        libc::SOL_XDP,
        libc::XDP_OPTIONS,
        libc::xdp_options { flags: 0 },
    )
    .is_ok_and(|o| o.flags & libc::XDP_OPTIONS_ZEROCOPY != 0)
}

/// Maps the four rings of `fd` (sized by the UMEM's geometry); local indices are read from
/// the shared rings (a fresh socket's are all zero).
fn map_rings(
    fd: &Arc<OwnedFd>,
    umem: &Arc<Umem>,
    ctl: &Arc<OwnedFd>,
    ifindex: u32,
    zero_copy: bool,
) -> io::Result<(XskRx, XskTx)> {
    let geo = umem.geo;
    // SAFETY: an all-zero xdp_mmap_offsets is a valid value.
    let off: libc::xdp_mmap_offsets =
        getopt(fd.as_fd(), libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, unsafe {
            std::mem::zeroed()
        })?;
    let desc = std::mem::size_of::<libc::xdp_desc>();
    let rx = RingMap::map(
        fd.as_fd(),
        libc::XDP_PGOFF_RX_RING as u64,
        &off.rx,
        geo.rx_frames,
        desc,
    )?;
    let tx = RingMap::map(
        fd.as_fd(),
        libc::XDP_PGOFF_TX_RING as u64,
        &off.tx,
        geo.tx_frames,
        desc,
    )?;
    let fill = RingMap::map(
        fd.as_fd(),
        libc::XDP_UMEM_PGOFF_FILL_RING,
        &off.fr,
        geo.rx_frames,
        8,
    )?;
    let cq = RingMap::map(
        fd.as_fd(),
        libc::XDP_UMEM_PGOFF_COMPLETION_RING,
        &off.cr,
        geo.tx_frames,
        8,
    )?;
    let rx = XskRx {
        umem: umem.clone(),
        fd: fd.clone(),
        cons: rx.consumer().load(Ordering::Acquire),
        fill_prod: fill.producer().load(Ordering::Acquire),
        rx,
        fill,
        zero_copy,
        lost: 0,
    };
    let tx = XskTx {
        umem: umem.clone(),
        fd: fd.clone(),
        ctl: ctl.clone(),
        ifindex,
        prod: tx.producer().load(Ordering::Acquire),
        cq_cons: cq.consumer().load(Ordering::Acquire),
        tx,
        cq,
        free: Vec::with_capacity(geo.tx_frames as usize),
        is_free: vec![false; geo.tx_frames as usize],
        link_down: false,
        bad_completions: 0,
    };
    Ok((rx, tx))
}
