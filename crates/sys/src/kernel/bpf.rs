//! The XDP program of AF_XDP uplinks, loaded with raw `bpf(2)` calls (no libbpf, no compiler).
//!
//! An AF_XDP socket receives only what an XDP program on its device redirects to it. Ours is
//! six instructions that send every frame of a receive queue to the socket registered for
//! that queue in an XSKMAP, and let the kernel's stack have it otherwise:
//!
//! ```text
//!  0: r2 = *(u32 *)(r1 + 16)      ; ctx->rx_queue_index (struct xdp_md)
//!  1: r1 = map[xsks]              ; ld_imm64, BPF_PSEUDO_MAP_FD: the loader puts the map's fd
//!  2:                             ;   (second half of the 16-byte load)
//!  3: r3 = XDP_PASS               ; what bpf_redirect_map returns when no socket is at the key
//!  4: call bpf_redirect_map       ; (map, key, flags) -> XDP_REDIRECT or the flags' action
//!  5: exit                        ; r0: the verdict
//! ```
//!
//! The map has one entry (queue 0: uplinks bind one queue); frames of other queues go to the
//! stack. The program is attached with a BPF link (`BPF_LINK_CREATE`, Linux 5.9+): native
//! (driver) mode if the driver has it, generic (SKB) mode otherwise. A link lives as long as
//! an fd refers to it, so the program detaches by itself when the port is deleted or the
//! daemon dies, and a hot upgrade keeps it attached by handing the fds over.
//!
//! Thread-safety: control thread only; nothing here is on the packet path.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_CREATE: libc::c_long = 28;

const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `enum bpf_attach_type`: BPF_XDP.
const BPF_XDP: u32 = 37;
const BPF_LINK_TYPE_XDP: u32 = 6;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// Offset of `rx_queue_index` in `struct xdp_md`.
const XDP_MD_RX_QUEUE_INDEX: i16 = 16;

/// One `struct bpf_insn`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    /// dst register in the low nibble, src register in the high nibble.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0xf),
        off,
        imm,
    }
}

/// The program, with `map_fd` as the XSKMAP.
pub fn program(map_fd: i32) -> [Insn; 6] {
    // Opcodes: class | size | mode (or class | op | source).
    const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
    const LD_IMM64: u8 = 0x18; // BPF_LD | BPF_IMM | BPF_DW
    const MOV64_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
    const CALL: u8 = 0x85; // BPF_JMP | BPF_CALL
    const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT
    [
        insn(LDX_MEM_W, 2, 1, XDP_MD_RX_QUEUE_INDEX, 0),
        insn(LD_IMM64, 1, BPF_PSEUDO_MAP_FD, 0, map_fd),
        insn(0, 0, 0, 0, 0),
        insn(MOV64_K, 3, 0, 0, XDP_PASS),
        insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// How the program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum XdpMode {
    /// In the driver (`XDP_FLAGS_DRV_MODE`).
    Native,
    /// After the stack built an skb (`XDP_FLAGS_SKB_MODE`): any device, slower.
    Generic,
}

impl XdpMode {
    pub fn name(self) -> &'static str {
        match self {
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
        }
    }

    pub fn from_name(s: &str) -> Option<XdpMode> {
        match s {
            "native" => Some(XdpMode::Native),
            "generic" => Some(XdpMode::Generic),
            _ => None,
        }
    }
}

/// Why the program could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("cannot {what}")]
    Sys {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("the verifier refused the XDP program: {0}")]
    Verifier(String),
    #[error("handed-over BPF fds are not an XSKMAP, an XDP program and its link on ifindex {0}")]
    BadFds(u32),
}

fn sys(what: &'static str) -> impl FnOnce(io::Error) -> BpfError {
    move |source| BpfError::Sys { what, source }
}

/// `bpf(cmd, attr, size)`, returning a new fd for commands that make one.
///
/// # Safety
/// `attr` must be the attribute struct the kernel expects for `cmd` (unused tail zeroed),
/// and every pointer in it valid for what the kernel reads or writes through it.
unsafe fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: the caller guarantees `attr` matches `cmd`; its size is passed along.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: `fd` was just returned by bpf(2) and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct MapUpdate {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

fn name16(s: &str) -> [u8; 16] {
    let mut n = [0u8; 16];
    for (d, b) in n.iter_mut().zip(s.bytes().take(15)) {
        *d = b;
    }
    n
}

/// The first words of `bpf_{map,prog,link}_info` for `fd` (type, id, ...).
fn info_words(fd: BorrowedFd<'_>) -> io::Result<[u32; 8]> {
    // Large enough for every info struct's head; the kernel fills at most `info_len` bytes
    // and requires nothing beyond its own size to be non-zero.
    let mut buf = [0u32; 64];
    let mut attr = InfoByFd {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of_val(&buf) as u32,
        info: buf.as_mut_ptr() as u64,
    };
    // SAFETY: OBJ_GET_INFO_BY_FD writes at most `info_len` bytes to `info`, our buffer.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    let mut out = [0u32; 8];
    out.copy_from_slice(&buf[..8]);
    Ok(out)
}

/// The XSKMAP, the program and the link that attaches it to a device.
#[derive(Debug)]
pub struct XdpProgram {
    pub map: OwnedFd,
    pub prog: OwnedFd,
    pub link: OwnedFd,
    pub mode: XdpMode,
}

impl XdpProgram {
    /// Creates the map with `xsk` at key 0, loads the program and attaches it to `ifindex`
    /// (native mode, else generic).
    pub fn attach(ifindex: u32, xsk: BorrowedFd<'_>) -> Result<XdpProgram, BpfError> {
        let mut mc = MapCreate {
            map_type: BPF_MAP_TYPE_XSKMAP,
            key_size: 4,
            value_size: 4,
            max_entries: 1,
            map_name: name16("ferrovs_xsks"),
            ..Default::default()
        };
        // SAFETY: a MAP_CREATE attribute with no pointers.
        let map = owned(unsafe { bpf(BPF_MAP_CREATE, &mut mc) }.map_err(sys("create an XSKMAP"))?);
        let key = 0u32;
        let value = xsk.as_raw_fd() as u32;
        let mut mu = MapUpdate {
            map_fd: map.as_raw_fd() as u32,
            key: &key as *const u32 as u64,
            value: &value as *const u32 as u64,
            ..Default::default()
        };
        // SAFETY: key and value point to 4-byte values alive for the call, the map's sizes.
        unsafe { bpf(BPF_MAP_UPDATE_ELEM, &mut mu) }
            .map_err(sys("put the AF_XDP socket in the XSKMAP"))?;
        let prog = load(map.as_raw_fd())?;
        let mut last = None;
        for (mode, flags) in [
            (XdpMode::Native, XDP_FLAGS_DRV_MODE),
            (XdpMode::Generic, XDP_FLAGS_SKB_MODE),
        ] {
            let mut lc = LinkCreate {
                prog_fd: prog.as_raw_fd() as u32,
                target_ifindex: ifindex,
                attach_type: BPF_XDP,
                flags,
            };
            // SAFETY: a LINK_CREATE attribute with no pointers.
            match unsafe { bpf(BPF_LINK_CREATE, &mut lc) } {
                Ok(fd) => {
                    return Ok(XdpProgram {
                        map,
                        prog,
                        link: owned(fd),
                        mode,
                    })
                }
                // Another program is there already: generic mode would not help.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    return Err(BpfError::Sys {
                        what: "attach the XDP program (another XDP program is attached)",
                        source: e,
                    })
                }
                Err(e) => last = Some(e),
            }
        }
        Err(BpfError::Sys {
            what: "attach the XDP program (native or generic mode)",
            source: last.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL)),
        })
    }

    /// Adopts the fds of a program another daemon attached to `ifindex`, checking what they
    /// are (an XSKMAP, an XDP program, an XDP link on that device).
    pub fn from_fds(
        map: OwnedFd,
        prog: OwnedFd,
        link: OwnedFd,
        ifindex: u32,
        mode: XdpMode,
    ) -> Result<XdpProgram, BpfError> {
        let bad = |_| BpfError::BadFds(ifindex);
        let m = info_words(map.as_fd()).map_err(bad)?;
        let p = info_words(prog.as_fd()).map_err(bad)?;
        let l = info_words(link.as_fd()).map_err(bad)?;
        // bpf_link_info: type, id, prog_id, pad, then xdp.ifindex at byte 16.
        let ok = m[0] == BPF_MAP_TYPE_XSKMAP
            && p[0] == BPF_PROG_TYPE_XDP
            && l[0] == BPF_LINK_TYPE_XDP
            && l[2] == p[1]
            && l[4] == ifindex;
        if !ok {
            return Err(BpfError::BadFds(ifindex));
        }
        Ok(XdpProgram {
            map,
            prog,
            link,
            mode,
        })
    }
}

fn load(map_fd: i32) -> Result<OwnedFd, BpfError> {
    let insns = program(map_fd);
    let license = b"Apache-2.0\0";
    let mut log = vec![0u8; 4096];
    let mut pl = ProgLoad {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name16("ferrovs_xsk"),
        expected_attach_type: BPF_XDP,
        ..Default::default()
    };
    // SAFETY: insns/license point to live arrays of the sizes given; no log buffer.
    match unsafe { bpf(BPF_PROG_LOAD, &mut pl) } {
        Ok(fd) => Ok(owned(fd)),
        Err(e)
            if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EINVAL) =>
        {
            // Load again with the verifier's log for the reason.
            pl.log_level = 1;
            pl.log_size = log.len() as u32;
            pl.log_buf = log.as_mut_ptr() as u64;
            // SAFETY: as above, plus a log buffer of `log_size` writable bytes.
            match unsafe { bpf(BPF_PROG_LOAD, &mut pl) } {
                Ok(fd) => Ok(owned(fd)),
                Err(_) => {
                    let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
                    let text = String::from_utf8_lossy(&log[..end]);
                    let text = text.trim();
                    if text.is_empty() {
                        Err(BpfError::Sys {
                            what: "load the XDP program",
                            source: e,
                        })
                    } else {
                        Err(BpfError::Verifier(
                            text.lines().last().unwrap_or("").to_string(),
                        ))
                    }
                }
            }
        }
        Err(e) => Err(BpfError::Sys {
            what: "load the XDP program",
            source: e,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_encoding() {
        let p = program(7);
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        // r2 = *(u32 *)(r1 + 16)
        assert_eq!(
            p[0],
            Insn {
                code: 0x61,
                regs: 0x12,
                off: 16,
                imm: 0
            }
        );
        // ld_imm64 r1, map fd 7 (src_reg = BPF_PSEUDO_MAP_FD), second half zero
        assert_eq!(
            p[1],
            Insn {
                code: 0x18,
                regs: 0x11,
                off: 0,
                imm: 7
            }
        );
        assert_eq!(
            p[2],
            Insn {
                code: 0,
                regs: 0,
                off: 0,
                imm: 0
            }
        );
        assert_eq!(
            p[3],
            Insn {
                code: 0xb7,
                regs: 0x03,
                off: 0,
                imm: 2
            }
        );
        assert_eq!(
            p[4],
            Insn {
                code: 0x85,
                regs: 0,
                off: 0,
                imm: 51
            }
        );
        assert_eq!(p[5].code, 0x95);
    }

    #[test]
    fn attribute_layouts_match_the_kernel() {
        assert_eq!(std::mem::size_of::<MapUpdate>(), 32);
        assert_eq!(std::mem::size_of::<ProgLoad>(), 72);
        assert_eq!(std::mem::size_of::<LinkCreate>(), 16);
        assert_eq!(std::mem::size_of::<InfoByFd>(), 16);
    }

    #[test]
    fn the_verifier_accepts_the_program() {
        // SAFETY: plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP: loading BPF needs root");
            return;
        }
        let mut mc = MapCreate {
            map_type: BPF_MAP_TYPE_XSKMAP,
            key_size: 4,
            value_size: 4,
            max_entries: 1,
            ..Default::default()
        };
        // SAFETY: a MAP_CREATE attribute with no pointers.
        let map = owned(unsafe { bpf(BPF_MAP_CREATE, &mut mc) }.unwrap());
        let prog = load(map.as_raw_fd()).unwrap();
        let p = info_words(prog.as_fd()).unwrap();
        assert_eq!(p[0], BPF_PROG_TYPE_XDP);
        assert_eq!(info_words(map.as_fd()).unwrap()[0], BPF_MAP_TYPE_XSKMAP);
    }
}
