//! Kernel network devices by name: name rules, index lookup, bringing a device up.
//!
//! These run on the control thread only (never on the packet path).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `IFNAMSIZ`: a device name plus its terminating NUL.
pub const IFNAMSIZ: usize = libc::IFNAMSIZ;

/// Why a string cannot be a network device name (the kernel's `dev_valid_name`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("network device name is empty")]
    Empty,
    #[error("network device name '{0}' is longer than 15 bytes")]
    TooLong(String),
    #[error("network device name '{0}' is invalid (no '/', ':', whitespace, '.' or '..')")]
    Invalid(String),
}

/// Checks `name` as the kernel would before creating or finding a device.
pub fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() >= IFNAMSIZ {
        return Err(NameError::TooLong(name.to_string()));
    }
    if name == "."
        || name == ".."
        || name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
    {
        return Err(NameError::Invalid(name.to_string()));
    }
    Ok(())
}

/// Why the kernel refused to send a frame, by errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxFail {
    /// No room now (EAGAIN, ENOBUFS).
    Full,
    /// The device is down, gone or detached (ENETDOWN, ENXIO, ENODEV, EIO, EBADFD).
    LinkDown,
    /// Larger than the device takes (EMSGSIZE).
    Oversize,
    /// Anything else.
    Other,
}

impl TxFail {
    pub fn from_io(e: &io::Error) -> TxFail {
        match e.raw_os_error() {
            Some(libc::EAGAIN | libc::ENOBUFS) => TxFail::Full,
            Some(libc::ENETDOWN | libc::ENXIO | libc::ENODEV | libc::EIO | libc::EBADFD) => {
                TxFail::LinkDown
            }
            Some(libc::EMSGSIZE) => TxFail::Oversize,
            _ => TxFail::Other,
        }
    }
}

/// A zeroed `ifreq` carrying `name` (checked with [`check_name`]).
pub(crate) fn ifreq(name: &str) -> Result<libc::ifreq, NameError> {
    check_name(name)?;
    // SAFETY: an all-zero ifreq is a valid value (plain integers, arrays and a union of them).
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(r)
}

/// The name held in an `ifreq` the kernel filled.
pub(crate) fn ifreq_name(r: &libc::ifreq) -> String {
    let bytes: Vec<u8> = r
        .ifr_name
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The index of device `name` in this network namespace (`NotFound` if there is none).
pub fn ifindex(name: &str) -> io::Result<u32> {
    let mut r = ifreq(name).map_err(invalid)?;
    let sock = control_socket()?;
    // SAFETY: SIOCGIFINDEX reads the name and writes the index into `r`, a valid ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFINDEX, &mut r) } < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENODEV) {
            return Err(io::Error::new(io::ErrorKind::NotFound, e));
        }
        return Err(e);
    }
    // SAFETY: SIOCGIFINDEX succeeded, so the union holds `ifru_ifindex`.
    let idx = unsafe { r.ifr_ifru.ifru_ifindex };
    Ok(idx as u32)
}

/// Sets IFF_UP on device `name` (a no-op if it is up already).
pub fn set_up(name: &str) -> io::Result<()> {
    let mut r = ifreq(name).map_err(invalid)?;
    let sock = control_socket()?;
    // SAFETY: SIOCGIFFLAGS fills the flags of the named device into `r`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut r) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS succeeded, so the union holds `ifru_flags`.
    let flags = unsafe { r.ifr_ifru.ifru_flags };
    if flags & libc::IFF_UP as libc::c_short != 0 {
        return Ok(());
    }
    r.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads the name and flags from `r`, a valid ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &r) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the device with index `ifindex` is up with its carrier on (IFF_UP and
/// IFF_RUNNING), asked through `sock`, a socket in the device's namespace. Two ioctls: for
/// error paths only.
pub fn running_by_index(sock: BorrowedFd<'_>, ifindex: u32) -> bool {
    // SAFETY: an all-zero ifreq is a valid value.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    r.ifr_ifru.ifru_ifindex = ifindex as libc::c_int;
    // SAFETY: SIOCGIFNAME reads the index from and writes the name into `r`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFNAME, &mut r) } < 0 {
        return false;
    }
    // SAFETY: SIOCGIFFLAGS reads the name from and writes the flags into `r`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut r) } < 0 {
        return false;
    }
    // SAFETY: SIOCGIFFLAGS succeeded, so the union holds `ifru_flags`.
    let flags = unsafe { r.ifr_ifru.ifru_flags };
    let want = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    flags & want == want
}

/// The link type (`ARPHRD_*`) of device `name`, asked through `sock`.
pub fn link_type(sock: BorrowedFd<'_>, name: &str) -> io::Result<u16> {
    let mut r = ifreq(name).map_err(invalid)?;
    // SAFETY: SIOCGIFHWADDR reads the name from and writes the hardware address into `r`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR, &mut r) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFHWADDR succeeded, so the union holds `ifru_hwaddr`.
    Ok(unsafe { r.ifr_ifru.ifru_hwaddr.sa_family })
}

fn invalid(e: NameError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e)
}

/// A datagram socket for interface ioctls.
fn control_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `name` is a physical device (it has a bus device behind it in sysfs). The other
/// end of a virtual one (veth, macvlan, bond of them) may be this host's own stack, which
/// hands over partial checksums and GSO packets.
pub fn is_physical(name: &str) -> bool {
    check_name(name).is_ok()
        && std::path::Path::new("/sys/class/net")
            .join(name)
            .join("device")
            .exists()
}

/// Puts device `ifindex` in promiscuous mode for as long as the AF_PACKET socket `fd` stays
/// open (a per-socket membership: the kernel drops it when the socket closes, so a crashed
/// switch leaves no device promiscuous).
pub fn join_promiscuous(fd: BorrowedFd<'_>, ifindex: u32) -> io::Result<()> {
    let mreq = libc::packet_mreq {
        mr_ifindex: ifindex as libc::c_int,
        mr_type: libc::PACKET_MR_PROMISC as libc::c_ushort,
        mr_alen: 0,
        mr_address: [0; 8],
    };
    crate::os::setopt(fd, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_kernel_rules() {
        assert!(check_name("eth0").is_ok());
        assert!(check_name("a23456789012345").is_ok());
        assert_eq!(
            check_name("a234567890123456"),
            Err(NameError::TooLong("a234567890123456".into()))
        );
        assert_eq!(check_name(""), Err(NameError::Empty));
        for bad in [".", "..", "a/b", "a:1", "a b"] {
            assert!(
                matches!(check_name(bad), Err(NameError::Invalid(_))),
                "{bad}"
            );
        }
        assert_eq!(ifindex("lo").unwrap(), 1);
        assert_eq!(
            ifindex("fv-no-such-dev").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
