//! Port numbers (`OFPP_*`) and the port description (`ofp_port`).

use crate::error::{brc, OfError};
use crate::wire::{Put, Reader};

/// `OFPP_MAX`: the highest ordinary port number.
pub const OFPP_MAX: u32 = 0xffff_ff00;
/// `OFPP_IN_PORT`: send the packet out of its input port.
pub const OFPP_IN_PORT: u32 = 0xffff_fff8;
/// `OFPP_TABLE`: submit the packet to the first table (PACKET_OUT only).
pub const OFPP_TABLE: u32 = 0xffff_fff9;
/// `OFPP_NORMAL`: the traditional L2 switch.
pub const OFPP_NORMAL: u32 = 0xffff_fffa;
/// `OFPP_FLOOD`: every port but the input port and those with `OFPPC_NO_FLOOD`.
pub const OFPP_FLOOD: u32 = 0xffff_fffb;
/// `OFPP_ALL`: every port but the input port.
pub const OFPP_ALL: u32 = 0xffff_fffc;
/// `OFPP_CONTROLLER`: to the controller (PACKET_IN).
pub const OFPP_CONTROLLER: u32 = 0xffff_fffd;
/// `OFPP_LOCAL`: the bridge's local port.
pub const OFPP_LOCAL: u32 = 0xffff_fffe;
/// `OFPP_ANY`: no port (a wildcard in requests; never an output).
pub const OFPP_ANY: u32 = 0xffff_ffff;

/// Whether `port` may be an OUTPUT action's port: an ordinary port (not 0) or a reserved
/// port other than `OFPP_ANY`.
pub fn is_valid_output(port: u32) -> bool {
    (port != 0 && port <= OFPP_MAX) || (OFPP_IN_PORT..=OFPP_LOCAL).contains(&port)
}

/// The length of an `ofp_port`.
pub const PORT_LEN: usize = 64;
/// The length of an `ofp14_port` with its Ethernet property, as this crate writes it.
pub const PORT14_LEN: usize = 72;
/// `OFP_MAX_PORT_NAME_LEN`.
pub const PORT_NAME_LEN: usize = 16;

/// `OFPPC_*`: port configuration bits.
pub mod config {
    pub const PORT_DOWN: u32 = 1 << 0;
    pub const NO_RECV: u32 = 1 << 2;
    pub const NO_FWD: u32 = 1 << 5;
    pub const NO_PACKET_IN: u32 = 1 << 6;
}

/// `OFPPS_*`: port state bits.
pub mod state {
    pub const LINK_DOWN: u32 = 1 << 0;
    pub const BLOCKED: u32 = 1 << 1;
    pub const LIVE: u32 = 1 << 2;
}

/// `OFPPF_*`: port feature bits (curr, advertised, supported, peer).
pub mod features {
    pub const F_10MB_HD: u32 = 1 << 0;
    pub const F_10MB_FD: u32 = 1 << 1;
    pub const F_100MB_HD: u32 = 1 << 2;
    pub const F_100MB_FD: u32 = 1 << 3;
    pub const F_1GB_HD: u32 = 1 << 4;
    pub const F_1GB_FD: u32 = 1 << 5;
    pub const F_10GB_FD: u32 = 1 << 6;
    pub const F_40GB_FD: u32 = 1 << 7;
    pub const F_100GB_FD: u32 = 1 << 8;
    pub const F_1TB_FD: u32 = 1 << 9;
    pub const OTHER: u32 = 1 << 10;
    pub const COPPER: u32 = 1 << 11;
    pub const FIBER: u32 = 1 << 12;
    pub const AUTONEG: u32 = 1 << 13;
    pub const PAUSE: u32 = 1 << 14;
    pub const PAUSE_ASYM: u32 = 1 << 15;
}

/// `ofp_port`: a port's description (FEATURES, PORT_DESC, PORT_STATUS).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Port {
    /// OpenFlow port number.
    pub port_no: u32,
    /// MAC address.
    pub hw_addr: [u8; 6],
    /// Name: at most 15 bytes on the wire (cut at a character boundary), NUL padded.
    pub name: String,
    /// `OFPPC_*` bits.
    pub config: u32,
    /// `OFPPS_*` bits.
    pub state: u32,
    /// Current features (`OFPPF_*`).
    pub curr: u32,
    /// Advertised features.
    pub advertised: u32,
    /// Supported features.
    pub supported: u32,
    /// The peer's advertised features.
    pub peer: u32,
    /// Current bit rate in kbps.
    pub curr_speed: u32,
    /// Maximum bit rate in kbps.
    pub max_speed: u32,
}

impl Port {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(self.port_no);
        out.put_zeros(4);
        out.extend_from_slice(&self.hw_addr);
        out.put_zeros(2);
        out.put_string(&self.name, PORT_NAME_LEN);
        for v in [
            self.config,
            self.state,
            self.curr,
            self.advertised,
            self.supported,
            self.peer,
            self.curr_speed,
            self.max_speed,
        ] {
            out.put_u32(v);
        }
    }

    /// OpenFlow 1.4's `ofp14_port`: 40 bytes (number, length, MAC, name, config, state),
    /// then the Ethernet property (`OFPPDPT14_ETHERNET`, 32 bytes: the features and
    /// speeds).
    pub(crate) fn encode14(&self, out: &mut Vec<u8>) {
        out.put_u32(self.port_no);
        out.put_u16(PORT14_LEN as u16);
        out.put_zeros(2);
        out.extend_from_slice(&self.hw_addr);
        out.put_zeros(2);
        out.put_string(&self.name, PORT_NAME_LEN);
        out.put_u32(self.config);
        out.put_u32(self.state);
        out.put_u16(0); // OFPPDPT14_ETHERNET
        out.put_u16(32);
        out.put_zeros(4);
        for v in [
            self.curr,
            self.advertised,
            self.supported,
            self.peer,
            self.curr_speed,
            self.max_speed,
        ] {
            out.put_u32(v);
        }
    }

    /// Decodes an `ofp14_port` (its length must cover its 40 bytes and tile its
    /// properties; an Ethernet property gives the features, others are skipped).
    pub(crate) fn decode14(r: &mut Reader<'_>) -> Result<Port, OfError> {
        let bad = OfError::request(brc::BAD_LEN, "port description length wrong");
        let port_no = r.u32()?;
        let len = usize::from(r.u16()?);
        if len < 40 || len % 8 != 0 || len - 6 > r.remaining() {
            return Err(bad);
        }
        r.skip(2)?;
        let hw_addr = r.array()?;
        r.skip(2)?;
        let name = r.string(
            PORT_NAME_LEN,
            OfError::request(brc::EPERM, "port name is not UTF-8"),
        )?;
        let mut p = Port {
            port_no,
            hw_addr,
            name,
            config: r.u32()?,
            state: r.u32()?,
            ..Port::default()
        };
        let mut props = Reader::new(r.bytes(len - 40)?, bad);
        while !props.is_empty() {
            let t = props.u16()?;
            let plen = usize::from(props.u16()?);
            if plen < 4 || plen % 8 != 0 || plen - 4 > props.remaining() {
                return Err(bad);
            }
            let mut v = Reader::new(props.bytes(plen - 4)?, bad);
            if t == 0 {
                if plen != 32 {
                    return Err(bad);
                }
                v.skip(4)?;
                p.curr = v.u32()?;
                p.advertised = v.u32()?;
                p.supported = v.u32()?;
                p.peer = v.u32()?;
                p.curr_speed = v.u32()?;
                p.max_speed = v.u32()?;
            }
        }
        Ok(p)
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Port, OfError> {
        let port_no = r.u32()?;
        r.skip(4)?;
        let hw_addr = r.array()?;
        r.skip(2)?;
        let name = r.string(
            PORT_NAME_LEN,
            OfError::request(brc::EPERM, "port name is not UTF-8"),
        )?;
        Ok(Port {
            port_no,
            hw_addr,
            name,
            config: r.u32()?,
            state: r.u32()?,
            curr: r.u32()?,
            advertised: r.u32()?,
            supported: r.u32()?,
            peer: r.u32()?,
            curr_speed: r.u32()?,
            max_speed: r.u32()?,
        })
    }
}
