//! TAP devices: the host network stack as a port.
//!
//! A [`Tap`] is a non-blocking fd of `/dev/net/tun` attached to one TAP device with
//! `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`: every frame read or written starts with a
//! virtio-net header of [`VNET_HDR_LEN`] bytes (set with `TUNSETVNETHDRSZ`, the virtio 1.x
//! size, so that a guest's header passes through unchanged). On transmit the header carries
//! the packet's offload metadata (partial checksum, TSO): the kernel completes or segments
//! what it must. [`Tap::enable_offloads`] (`TUNSETOFFLOAD`) lets the kernel hand us partial
//! checksums and TSO packets of up to 64 KiB in return, which the receiver must read into a
//! buffer that large.
//!
//! A device created by [`Tap::open`] is not persistent: it exists while an fd is attached to
//! it (ours, or the next daemon's after a hot upgrade, which receives the same fd). A
//! persistent device created beforehand (`ip tuntap add`) is attached to and left in place.
//!
//! Thread-safety: reads and writes are single system calls on a shared fd; any number of
//! threads may call [`Tap::send`] and [`Tap::recv`] at once (each call moves one whole frame).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::kernel::netdev::{self, TxFail};

/// Bytes of virtio-net header in front of every frame (`struct virtio_net_hdr_v1`).
pub const VNET_HDR_LEN: usize = 12;

/// Flags every ferrovs TAP fd has.
const FLAGS: libc::c_int = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;

/// Why a TAP device could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error(transparent)]
    Name(#[from] netdev::NameError),
    #[error("cannot open /dev/net/tun")]
    OpenTun(#[source] io::Error),
    #[error("{0} exists and is not a TAP device")]
    NotTap(String),
    #[error("TAP device {0} is attached to another process")]
    Busy(String),
    #[error("cannot create or attach TAP device {name}")]
    Attach {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("TAP device {name}: cannot {what}")]
    Setup {
        name: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "handed-over fd is not a TAP fd with IFF_NO_PI and a {VNET_HDR_LEN}-byte vnet header ({0})"
    )]
    BadFd(String),
}

/// One TAP device, attached.
#[derive(Debug)]
pub struct Tap {
    fd: OwnedFd,
    name: String,
}

impl Tap {
    /// Attaches to TAP device `name`, creating it if it does not exist, and brings it up.
    pub fn open(name: &str) -> Result<Tap, TapError> {
        let mut req = netdev::ifreq(name)?;
        // SAFETY: the path is a valid C string; the returned fd is owned by us.
        let fd = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(TapError::OpenTun(io::Error::last_os_error()));
        }
        // SAFETY: `fd` is fresh and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        req.ifr_ifru.ifru_flags = FLAGS as libc::c_short;
        // SAFETY: TUNSETIFF reads the name and flags from `req`, a valid ifreq, and may write
        // the (same) name back into it.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EINVAL) => TapError::NotTap(name.into()),
                Some(libc::EBUSY) => TapError::Busy(name.into()),
                _ => TapError::Attach {
                    name: name.into(),
                    source: e,
                },
            });
        }
        let setup = |what, source| TapError::Setup {
            name: name.into(),
            what,
            source,
        };
        let len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one c_int.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETVNETHDRSZ, &len) } < 0 {
            return Err(setup(
                "set the vnet header size",
                io::Error::last_os_error(),
            ));
        }
        netdev::set_up(name).map_err(|e| setup("bring it up", e))?;
        Ok(Tap {
            fd,
            name: name.into(),
        })
    }

    /// Adopts an fd handed over by another daemon, checking that it is a TAP fd set up as
    /// [`Tap::open`] does (flags and header size); makes it non-blocking.
    pub fn from_fd(fd: OwnedFd) -> Result<Tap, TapError> {
        // SAFETY: an all-zero ifreq is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        // SAFETY: TUNGETIFF writes the device name and flags into `req`, a valid ifreq.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNGETIFF, &mut req) } < 0 {
            return Err(TapError::BadFd(format!(
                "TUNGETIFF: {}",
                io::Error::last_os_error()
            )));
        }
        // SAFETY: TUNGETIFF succeeded, so the union holds `ifru_flags`.
        let flags = unsafe { req.ifr_ifru.ifru_flags } as libc::c_int;
        if flags & FLAGS != FLAGS {
            return Err(TapError::BadFd(format!("flags {flags:#x}")));
        }
        let mut len: libc::c_int = 0;
        // SAFETY: TUNGETVNETHDRSZ writes one c_int.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNGETVNETHDRSZ, &mut len) } < 0 {
            return Err(TapError::BadFd(format!(
                "TUNGETVNETHDRSZ: {}",
                io::Error::last_os_error()
            )));
        }
        if len as usize != VNET_HDR_LEN {
            return Err(TapError::BadFd(format!("vnet header of {len} bytes")));
        }
        crate::os::set_nonblocking(fd.as_fd(), true)
            .map_err(|e| TapError::BadFd(format!("O_NONBLOCK: {e}")))?;
        Ok(Tap {
            fd,
            name: netdev::ifreq_name(&req),
        })
    }

    /// Lets the kernel send us partial checksums and TCP segments of up to 64 KiB (IPv4, IPv6,
    /// with ECN), as it does to a virtio-net guest with those features.
    pub fn enable_offloads(&self) -> io::Result<()> {
        let flags: libc::c_uint =
            libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;
        // SAFETY: TUNSETOFFLOAD takes its argument by value.
        if unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                flags as libc::c_ulong,
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The device's name (as it was when attached).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reads one frame, virtio-net header included, into `buf`. `Ok(None)` when no frame
    /// is waiting, or when the device was deleted under us (the fd is detached: nothing will
    /// ever come, and nothing was lost).
    #[inline]
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: reads at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EBADFD | libc::EIO) => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(n as usize))
    }

    /// Writes one frame behind its virtio-net header `hdr` (one `writev`, no copy).
    #[inline]
    pub fn send(&self, hdr: &[u8; VNET_HDR_LEN], frame: &[u8]) -> Result<(), TxFail> {
        let iov = [
            libc::iovec {
                iov_base: hdr.as_ptr() as *mut _,
                iov_len: VNET_HDR_LEN,
            },
            libc::iovec {
                iov_base: frame.as_ptr() as *mut _,
                iov_len: frame.len(),
            },
        ];
        // SAFETY: both iovecs describe live, readable buffers; writev only reads them.
        let n = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), 2) };
        if n < 0 {
            return Err(TxFail::from_io(&io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl AsFd for Tap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        // SAFETY: plain syscall.
        if unsafe { libc::geteuid() } == 0 {
            return true;
        }
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        assert!(!ci, "root needed for TAP tests");
        eprintln!("SKIP: TAP test needs root");
        false
    }

    #[test]
    fn creates_attaches_once_and_adopts_handed_over_fds() {
        if !root() {
            return;
        }
        let name = format!("fvst{}", std::process::id() % 100_000);
        let tap = Tap::open(&name).unwrap();
        assert_eq!(tap.name(), name);
        assert!(crate::kernel::netdev::ifindex(&name).is_ok());
        // One fd per (single-queue) TAP.
        assert!(matches!(Tap::open(&name), Err(TapError::Busy(_))));
        assert!(matches!(Tap::open("lo"), Err(TapError::NotTap(_))));
        assert!(matches!(
            Tap::open("0123456789abcdefg"),
            Err(TapError::Name(_))
        ));
        let mut buf = [0u8; 2048];
        tap.enable_offloads().unwrap();
        let sent = tap.send(&[0; VNET_HDR_LEN], &[0xff; 60]);
        assert!(sent.is_ok(), "{sent:?}");
        assert!(matches!(tap.recv(&mut buf), Ok(None) | Ok(Some(_))));
        // What a new daemon receives: the same attachment, checked.
        let copy = Tap::from_fd(tap.as_fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(copy.name(), name);
        assert!(matches!(
            Tap::from_fd(crate::os::eventfd().unwrap()),
            Err(TapError::BadFd(_))
        ));
        // Not persistent: gone with its last fd.
        drop((tap, copy));
        assert!(crate::kernel::netdev::ifindex(&name).is_err());
    }
}
