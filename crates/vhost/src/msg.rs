//! The vhost-user wire protocol.
//!
//! Every message is a 12-byte header (request, flags, payload size, little-endian) followed
//! by the payload; fds travel beside it as SCM_RIGHTS ancillary data. [`parse`]
//! checks a complete message once — known request, payload size exactly as the request
//! demands, fd count as the request demands — and turns it into a typed [`Request`]. Nothing
//! downstream indexes raw bytes.

use std::os::fd::OwnedFd;

use ferrovs_sys::guest::memory::RegionDesc;
use ferrovs_sys::guest::vring::RingAddrs;

pub const HEADER_LEN: usize = 12;
/// Largest payload we accept (a SET_MEM_TABLE of 8 regions is 264 bytes; GET_CONFIG ≤ 256).
pub const MAX_PAYLOAD: usize = 4096;
pub const VERSION: u32 = 0x1;
pub const FLAG_REPLY: u32 = 0x4;
pub const FLAG_NEED_REPLY: u32 = 0x8;
/// Regions one SET_MEM_TABLE carries.
pub const MAX_MEM_TABLE_REGIONS: usize = 8;
/// In SET_VRING_KICK/CALL/ERR: no fd passed (polling mode).
pub const VRING_NOFD_MASK: u64 = 0x100;
pub const VRING_IDX_MASK: u64 = 0xff;
/// In SET_VRING_ADDR flags: log writes to the used ring at the given guest address (bit).
pub const VRING_F_LOG: u32 = 0;

macro_rules! requests {
    ($($name:ident = $code:literal),* $(,)?) => {
        /// Request codes, frontend to backend.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(u32)]
        pub enum Code { $($name = $code),* }
        impl Code {
            pub fn from_u32(v: u32) -> Option<Code> {
                match v { $($code => Some(Code::$name),)* _ => None }
            }
        }
    };
}

requests! {
    GetFeatures = 1, SetFeatures = 2, SetOwner = 3, ResetOwner = 4, SetMemTable = 5,
    SetLogBase = 6, SetLogFd = 7, SetVringNum = 8, SetVringAddr = 9, SetVringBase = 10,
    GetVringBase = 11, SetVringKick = 12, SetVringCall = 13, SetVringErr = 14,
    GetProtocolFeatures = 15, SetProtocolFeatures = 16, GetQueueNum = 17, SetVringEnable = 18,
    SendRarp = 19, NetSetMtu = 20, SetBackendReqFd = 21, IotlbMsg = 22, SetVringEndian = 23,
    GetConfig = 24, SetConfig = 25, PostcopyAdvise = 28, PostcopyListen = 29, PostcopyEnd = 30,
    GetInflightFd = 31, SetInflightFd = 32, ResetDevice = 34, GetMaxMemSlots = 36,
    AddMemReg = 37, RemMemReg = 38, SetStatus = 39, GetStatus = 40,
}

/// The payload shape and fd rule of a request: the one table the parser follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// No payload (some frontends send a u64 anyway; accepted and ignored).
    Empty,
    U64,
    VringState,
    VringAddr,
    MemTable,
    /// u64 whose low byte is a queue index and bit 8 says "no fd".
    VringFd,
    Log,
    Config,
    SingleRegion,
}

/// How many fds a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fds {
    None,
    One,
    /// One unless the payload says NOFD.
    VringFd,
    /// One per region.
    PerRegion,
}

impl Code {
    fn rule(self) -> (Shape, Fds) {
        use Code::*;
        match self {
            GetFeatures | GetProtocolFeatures | GetQueueNum | GetMaxMemSlots | GetStatus => {
                (Shape::Empty, Fds::None)
            }
            SetOwner | ResetOwner | ResetDevice | PostcopyAdvise | PostcopyListen | PostcopyEnd => {
                (Shape::Empty, Fds::None)
            }
            SetFeatures | SetProtocolFeatures | SendRarp | NetSetMtu | SetStatus => {
                (Shape::U64, Fds::None)
            }
            SetVringNum | SetVringBase | GetVringBase | SetVringEnable | SetVringEndian => {
                (Shape::VringState, Fds::None)
            }
            SetVringAddr => (Shape::VringAddr, Fds::None),
            SetMemTable => (Shape::MemTable, Fds::PerRegion),
            SetVringKick | SetVringCall | SetVringErr => (Shape::VringFd, Fds::VringFd),
            SetLogBase => (Shape::Log, Fds::One),
            SetLogFd | SetBackendReqFd => (Shape::Empty, Fds::One),
            GetConfig | SetConfig => (Shape::Config, Fds::None),
            AddMemReg => (Shape::SingleRegion, Fds::One),
            RemMemReg => (Shape::SingleRegion, Fds::None),
            IotlbMsg | GetInflightFd | SetInflightFd => (Shape::Empty, Fds::None),
        }
    }

    /// Whether the reply is part of the request itself (not a REPLY_ACK). SET_LOG_BASE (with
    /// LOG_SHMFD, the only way ferrovs takes a log) and POSTCOPY_ADVISE (its reply carries the
    /// userfaultfd) are answered whether or not the frontend set NEED_REPLY: QEMU waits for
    /// both.
    pub fn has_reply(self) -> bool {
        matches!(
            self,
            Code::GetFeatures
                | Code::GetProtocolFeatures
                | Code::GetQueueNum
                | Code::GetVringBase
                | Code::GetConfig
                | Code::GetMaxMemSlots
                | Code::GetStatus
                | Code::SetLogBase
                | Code::PostcopyAdvise
        )
    }
}

/// The 12-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub code: u32,
    pub flags: u32,
    pub size: u32,
}

impl Header {
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Header {
            code: word(0),
            flags: word(4),
            size: word(8),
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.code.to_le_bytes());
        b[4..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..12].copy_from_slice(&self.size.to_le_bytes());
        b
    }

    pub fn need_reply(&self) -> bool {
        self.flags & FLAG_NEED_REPLY != 0
    }
}

/// A checked request.
#[derive(Debug)]
pub enum Request {
    GetFeatures,
    SetFeatures(u64),
    SetOwner,
    ResetOwner,
    ResetDevice,
    SetMemTable(Vec<(RegionDesc, OwnedFd)>),
    SetLogBase {
        size: u64,
        offset: u64,
        fd: OwnedFd,
    },
    SetLogFd(OwnedFd),
    SetVringNum {
        index: u32,
        num: u32,
    },
    SetVringAddr {
        index: u32,
        flags: u32,
        addrs: RingAddrs,
        log: u64,
    },
    SetVringBase {
        index: u32,
        num: u32,
    },
    GetVringBase {
        index: u32,
    },
    SetVringKick {
        index: u32,
        fd: Option<OwnedFd>,
    },
    SetVringCall {
        index: u32,
        fd: Option<OwnedFd>,
    },
    SetVringErr {
        index: u32,
        fd: Option<OwnedFd>,
    },
    GetProtocolFeatures,
    SetProtocolFeatures(u64),
    GetQueueNum,
    SetVringEnable {
        index: u32,
        enable: bool,
    },
    SendRarp([u8; 6]),
    NetSetMtu(u64),
    SetBackendReqFd(OwnedFd),
    SetVringEndian {
        index: u32,
        num: u32,
    },
    GetConfig {
        offset: u32,
        size: u32,
        flags: u32,
    },
    SetConfig {
        offset: u32,
        data: Vec<u8>,
        flags: u32,
    },
    GetMaxMemSlots,
    AddMemReg(RegionDesc, OwnedFd),
    RemMemReg(RegionDesc),
    SetStatus(u64),
    GetStatus,
    PostcopyAdvise,
    PostcopyListen,
    PostcopyEnd,
    /// Known but not supported by ferrovs; answered with an error ack if a reply is asked.
    Unsupported(Code),
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("unknown request code {0}")]
    UnknownCode(u32),
    #[error("unsupported header version {0:#x}")]
    BadVersion(u32),
    #[error("{code:?}: payload of {got} bytes, expected {expected}")]
    BadSize {
        code: Code,
        got: usize,
        expected: usize,
    },
    #[error("{code:?}: carries {got} fds, expected {expected}")]
    BadFds {
        code: Code,
        got: usize,
        expected: usize,
    },
    #[error("payload of {0} bytes exceeds the limit")]
    TooLarge(u32),
    #[error("{code:?}: {what}")]
    Invalid { code: Code, what: &'static str },
}

impl ParseError {
    /// Whether the connection can go on after this error (the message was framed correctly,
    /// so the stream is still in sync). A bad header means framing is lost: disconnect.
    pub fn recoverable(&self) -> bool {
        !matches!(self, ParseError::BadVersion(_) | ParseError::TooLarge(_))
    }
}

fn u64_at(p: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&p[at..at + 8]);
    u64::from_le_bytes(b)
}

fn u32_at(p: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]])
}

fn region_at(p: &[u8], at: usize) -> RegionDesc {
    RegionDesc {
        gpa: u64_at(p, at),
        size: u64_at(p, at + 8),
        uaddr: u64_at(p, at + 16),
        mmap_offset: u64_at(p, at + 24),
    }
}

/// Checks a header before its payload is read: version and size limit.
pub fn check_header(h: &Header) -> Result<(), ParseError> {
    if h.flags & 0x3 != VERSION {
        return Err(ParseError::BadVersion(h.flags));
    }
    if h.size as usize > MAX_PAYLOAD {
        return Err(ParseError::TooLarge(h.size));
    }
    Ok(())
}

/// Parses a complete message (header already checked with [`check_header`]).
pub fn parse(h: &Header, p: &[u8], mut fds: Vec<OwnedFd>) -> Result<Request, ParseError> {
    let code = Code::from_u32(h.code).ok_or(ParseError::UnknownCode(h.code))?;
    let (shape, fd_rule) = code.rule();
    let size = |expected: usize| {
        if p.len() == expected {
            Ok(())
        } else {
            Err(ParseError::BadSize {
                code,
                got: p.len(),
                expected,
            })
        }
    };
    match shape {
        Shape::Empty => {
            if !p.is_empty() && p.len() != 8 {
                return Err(ParseError::BadSize {
                    code,
                    got: p.len(),
                    expected: 0,
                });
            }
        }
        Shape::U64 | Shape::VringFd => size(8)?,
        Shape::VringState => size(8)?,
        Shape::VringAddr => size(40)?,
        Shape::Log => size(16)?,
        Shape::SingleRegion => size(40)?,
        Shape::MemTable => {
            if p.len() < 8 {
                return Err(ParseError::BadSize {
                    code,
                    got: p.len(),
                    expected: 8,
                });
            }
            let n = u32_at(p, 0) as usize;
            if n == 0 || n > MAX_MEM_TABLE_REGIONS {
                return Err(ParseError::Invalid {
                    code,
                    what: "region count not in 1..=8",
                });
            }
            // QEMU sends the full 8-slot table; others send only `n` regions.
            if p.len() != 8 + 32 * n && p.len() != 8 + 32 * MAX_MEM_TABLE_REGIONS {
                return Err(ParseError::BadSize {
                    code,
                    got: p.len(),
                    expected: 8 + 32 * n,
                });
            }
        }
        Shape::Config => {
            if p.len() < 12 {
                return Err(ParseError::BadSize {
                    code,
                    got: p.len(),
                    expected: 12,
                });
            }
            let sz = u32_at(p, 4) as usize;
            if code == Code::SetConfig && p.len() != 12 + sz {
                return Err(ParseError::BadSize {
                    code,
                    got: p.len(),
                    expected: 12 + sz,
                });
            }
            if sz > 256 {
                return Err(ParseError::Invalid {
                    code,
                    what: "config size over 256",
                });
            }
        }
    }
    let expected_fds = match fd_rule {
        Fds::None => 0,
        Fds::One => 1,
        Fds::VringFd => usize::from(u64_at(p, 0) & VRING_NOFD_MASK == 0),
        Fds::PerRegion => u32_at(p, 0) as usize,
    };
    if fds.len() != expected_fds {
        return Err(ParseError::BadFds {
            code,
            got: fds.len(),
            expected: expected_fds,
        });
    }
    let state = || (u32_at(p, 0), u32_at(p, 4));
    let vring_fd = |fds: &mut Vec<OwnedFd>| {
        let v = u64_at(p, 0);
        let index = (v & VRING_IDX_MASK) as u32;
        (index, fds.pop())
    };
    Ok(match code {
        Code::GetFeatures => Request::GetFeatures,
        Code::SetFeatures => Request::SetFeatures(u64_at(p, 0)),
        Code::SetOwner => Request::SetOwner,
        Code::ResetOwner => Request::ResetOwner,
        Code::ResetDevice => Request::ResetDevice,
        Code::SetMemTable => {
            let n = u32_at(p, 0) as usize;
            let regions = (0..n).map(|i| region_at(p, 8 + 32 * i));
            Request::SetMemTable(regions.zip(fds).collect())
        }
        Code::SetLogBase => {
            let fd = fds.pop().ok_or(ParseError::Invalid {
                code,
                what: "no fd",
            })?;
            Request::SetLogBase {
                size: u64_at(p, 0),
                offset: u64_at(p, 8),
                fd,
            }
        }
        Code::SetLogFd => Request::SetLogFd(fds.pop().ok_or(ParseError::Invalid {
            code,
            what: "no fd",
        })?),
        Code::SetVringNum => {
            let (index, num) = state();
            Request::SetVringNum { index, num }
        }
        Code::SetVringBase => {
            let (index, num) = state();
            Request::SetVringBase { index, num }
        }
        Code::GetVringBase => Request::GetVringBase { index: state().0 },
        Code::SetVringEnable => {
            let (index, num) = state();
            Request::SetVringEnable {
                index,
                enable: num != 0,
            }
        }
        Code::SetVringEndian => {
            let (index, num) = state();
            Request::SetVringEndian { index, num }
        }
        Code::SetVringAddr => Request::SetVringAddr {
            index: u32_at(p, 0),
            flags: u32_at(p, 4),
            addrs: RingAddrs {
                desc: u64_at(p, 8),
                used: u64_at(p, 16),
                avail: u64_at(p, 24),
            },
            log: u64_at(p, 32),
        },
        Code::SetVringKick => {
            let (index, fd) = vring_fd(&mut fds);
            Request::SetVringKick { index, fd }
        }
        Code::SetVringCall => {
            let (index, fd) = vring_fd(&mut fds);
            Request::SetVringCall { index, fd }
        }
        Code::SetVringErr => {
            let (index, fd) = vring_fd(&mut fds);
            Request::SetVringErr { index, fd }
        }
        Code::GetProtocolFeatures => Request::GetProtocolFeatures,
        Code::SetProtocolFeatures => Request::SetProtocolFeatures(u64_at(p, 0)),
        Code::GetQueueNum => Request::GetQueueNum,
        Code::SendRarp => {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&p[..6]);
            Request::SendRarp(mac)
        }
        Code::NetSetMtu => Request::NetSetMtu(u64_at(p, 0)),
        Code::SetBackendReqFd => {
            Request::SetBackendReqFd(fds.pop().ok_or(ParseError::Invalid {
                code,
                what: "no fd",
            })?)
        }
        Code::GetConfig => Request::GetConfig {
            offset: u32_at(p, 0),
            size: u32_at(p, 4),
            flags: u32_at(p, 8),
        },
        Code::SetConfig => Request::SetConfig {
            offset: u32_at(p, 0),
            flags: u32_at(p, 8),
            data: p[12..].to_vec(),
        },
        Code::GetMaxMemSlots => Request::GetMaxMemSlots,
        Code::AddMemReg => {
            let fd = fds.pop().ok_or(ParseError::Invalid {
                code,
                what: "no fd",
            })?;
            Request::AddMemReg(region_at(p, 8), fd)
        }
        Code::RemMemReg => Request::RemMemReg(region_at(p, 8)),
        Code::SetStatus => Request::SetStatus(u64_at(p, 0)),
        Code::GetStatus => Request::GetStatus,
        Code::PostcopyAdvise => Request::PostcopyAdvise,
        Code::PostcopyListen => Request::PostcopyListen,
        Code::PostcopyEnd => Request::PostcopyEnd,
        c @ (Code::IotlbMsg | Code::GetInflightFd | Code::SetInflightFd) => Request::Unsupported(c),
    })
}

/// Encodes a message (used for replies by the backend and for requests by the frontend).
pub fn encode(code: u32, flags: u32, payload: &[u8]) -> Vec<u8> {
    let h = Header {
        code,
        flags: flags | VERSION,
        size: payload.len() as u32,
    };
    let mut v = Vec::with_capacity(HEADER_LEN + payload.len());
    v.extend_from_slice(&h.encode());
    v.extend_from_slice(payload);
    v
}

/// Payload builders for the frontend side.
pub mod payload {
    use super::*;

    pub fn u64(v: u64) -> Vec<u8> {
        v.to_le_bytes().to_vec()
    }

    pub fn state(index: u32, num: u32) -> Vec<u8> {
        let mut v = index.to_le_bytes().to_vec();
        v.extend_from_slice(&num.to_le_bytes());
        v
    }

    pub fn addr(index: u32, a: RingAddrs) -> Vec<u8> {
        addr_logged(index, a, None)
    }

    /// SET_VRING_ADDR; with `log`, the used ring's guest-physical address to log its writes
    /// at (flag VHOST_VRING_F_LOG), as a migrating frontend sends it.
    pub fn addr_logged(index: u32, a: RingAddrs, log: Option<u64>) -> Vec<u8> {
        let mut v = index.to_le_bytes().to_vec();
        let flags = u32::from(log.is_some()) << VRING_F_LOG;
        v.extend_from_slice(&flags.to_le_bytes());
        for x in [a.desc, a.used, a.avail, log.unwrap_or(0)] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v
    }

    pub fn log(size: u64, offset: u64) -> Vec<u8> {
        let mut v = size.to_le_bytes().to_vec();
        v.extend_from_slice(&offset.to_le_bytes());
        v
    }

    pub fn mem_table(regions: &[RegionDesc]) -> Vec<u8> {
        let mut v = (regions.len() as u32).to_le_bytes().to_vec();
        v.extend_from_slice(&0u32.to_le_bytes());
        for r in regions {
            for x in [r.gpa, r.size, r.uaddr, r.mmap_offset] {
                v.extend_from_slice(&x.to_le_bytes());
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(code: Code, size: usize) -> Header {
        Header {
            code: code as u32,
            flags: VERSION,
            size: size as u32,
        }
    }

    #[test]
    fn parses_vring_addr_in_wire_order() {
        let a = RingAddrs {
            desc: 0x1000,
            avail: 0x2000,
            used: 0x3000,
        };
        let p = payload::addr(3, a);
        match parse(&hdr(Code::SetVringAddr, p.len()), &p, vec![]).unwrap() {
            Request::SetVringAddr {
                index: 3, addrs, ..
            } => assert_eq!(addrs, a),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn refuses_wrong_sizes_and_fd_counts() {
        let p = payload::u64(1);
        assert_eq!(
            parse(&hdr(Code::SetVringAddr, 8), &p, vec![]).unwrap_err(),
            ParseError::BadSize {
                code: Code::SetVringAddr,
                got: 8,
                expected: 40
            }
        );
        // A kick without NOFD must carry exactly one fd.
        assert_eq!(
            parse(&hdr(Code::SetVringKick, 8), &payload::u64(0), vec![]).unwrap_err(),
            ParseError::BadFds {
                code: Code::SetVringKick,
                got: 0,
                expected: 1
            }
        );
        // NOFD: polling mode, no fd.
        assert!(matches!(
            parse(&hdr(Code::SetVringKick, 8), &payload::u64(0x101), vec![]).unwrap(),
            Request::SetVringKick { index: 1, fd: None }
        ));
        let mt = payload::mem_table(&[RegionDesc {
            gpa: 0,
            size: 1,
            uaddr: 0,
            mmap_offset: 0,
        }]);
        assert!(matches!(
            parse(&hdr(Code::SetMemTable, mt.len()), &mt, vec![]).unwrap_err(),
            ParseError::BadFds {
                expected: 1,
                got: 0,
                ..
            }
        ));
        let mut zero = mt.clone();
        zero[0] = 0;
        assert!(matches!(
            parse(&hdr(Code::SetMemTable, zero.len()), &zero, vec![]).unwrap_err(),
            ParseError::Invalid { .. }
        ));
        assert_eq!(
            parse(
                &Header {
                    code: 999,
                    flags: 1,
                    size: 0
                },
                &[],
                vec![]
            )
            .unwrap_err(),
            ParseError::UnknownCode(999)
        );
    }

    /// Randomised messages (a deterministic fuzz pass): parsing never panics, and whatever
    /// parses carries exactly the fds its request demands.
    #[test]
    fn random_messages_never_panic() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut ok = 0;
        for _ in 0..20_000 {
            let code = (next() % 45) as u32;
            let len = match next() % 4 {
                0 => 8,
                1 => 40,
                2 => 8 + 32 * (next() % 9) as usize,
                _ => (next() % 300) as usize,
            };
            let mut p: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if next() % 2 == 0 && len >= 4 {
                p[0..4].copy_from_slice(&((next() % 10) as u32).to_le_bytes());
            }
            let nfds = (next() % 3) as usize;
            let fds: Vec<OwnedFd> = (0..nfds)
                .map(|_| ferrovs_sys::os::eventfd().unwrap())
                .collect();
            let h = Header {
                code,
                flags: VERSION,
                size: len as u32,
            };
            if parse(&h, &p, fds).is_ok() {
                ok += 1;
            }
        }
        assert!(ok > 100, "some random messages are well-formed: {ok}");
    }

    #[test]
    fn header_checks() {
        assert!(check_header(&Header {
            code: 1,
            flags: 2,
            size: 0
        })
        .is_err());
        assert!(check_header(&Header {
            code: 1,
            flags: 1,
            size: 1 << 20
        })
        .is_err());
        assert!(check_header(&Header {
            code: 1,
            flags: 1 | FLAG_NEED_REPLY,
            size: 8
        })
        .is_ok());
    }
}
