//! Packet headers as checked views.
//!
//! [`EthView::new_checked`] validates once that the bytes hold an Ethernet header (and a VLAN
//! tag when the ethertype says so); its accessors cannot panic afterwards. Nothing here
//! allocates: the datapath calls it per packet.
#![forbid(unsafe_code)]

pub mod build;
pub mod offload;

pub const ETH_HLEN: usize = 14;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_IPV4: u16 = 0x0800;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_RARP: u16 = 0x8035;

/// A MAC address as a 48-bit integer (cheap to hash and compare).
pub type Mac = u64;

/// The broadcast address.
pub const BROADCAST: Mac = 0xffff_ffff_ffff;

/// `aa:bb:cc:dd:ee:ff` formatting.
pub fn mac_to_string(m: Mac) -> String {
    let b = m.to_be_bytes();
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<Mac> {
    let parts: Vec<_> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    let mut m = 0u64;
    for p in parts {
        if p.is_empty() || p.len() > 2 {
            return None;
        }
        m = (m << 8) | u64::from(u8::from_str_radix(p, 16).ok()?);
    }
    Some(m)
}

fn mac_at(b: &[u8], at: usize) -> Mac {
    let mut v = [0u8; 8];
    v[2..].copy_from_slice(&b[at..at + 6]);
    u64::from_be_bytes(v)
}

/// A validated Ethernet header view.
#[derive(Debug, Clone, Copy)]
pub struct EthView<'a> {
    b: &'a [u8],
    vlan: Option<u16>,
}

impl<'a> EthView<'a> {
    /// Checks length (and the tag, if tagged); `None` for a runt.
    #[inline]
    pub fn new_checked(b: &'a [u8]) -> Option<EthView<'a>> {
        if b.len() < ETH_HLEN {
            return None;
        }
        let et = u16::from_be_bytes([b[12], b[13]]);
        let vlan = if et == ETH_P_8021Q {
            if b.len() < ETH_HLEN + 4 {
                return None;
            }
            Some(u16::from_be_bytes([b[14], b[15]]) & 0x0fff)
        } else {
            None
        };
        Some(EthView { b, vlan })
    }

    #[inline]
    pub fn dst(&self) -> Mac {
        mac_at(self.b, 0)
    }

    #[inline]
    pub fn src(&self) -> Mac {
        mac_at(self.b, 6)
    }

    /// VLAN id of an 802.1Q tag, if present.
    #[inline]
    pub fn vlan(&self) -> Option<u16> {
        self.vlan
    }

    /// The ethertype after any VLAN tag.
    #[inline]
    pub fn ethertype(&self) -> u16 {
        let at = if self.vlan.is_some() { 16 } else { 12 };
        u16::from_be_bytes([self.b[at], self.b[at + 1]])
    }
}

/// The RARP request a migrated guest's new location is announced with (as QEMU and DPDK
/// send it): broadcast from the guest's MAC, "who is `mac`", padded to the 60-byte minimum.
/// Every switch on the way learns `mac` behind the port it came from.
pub fn rarp_announce(mac: [u8; 6]) -> [u8; 60] {
    let mut f = [0u8; 60];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETH_P_RARP.to_be_bytes());
    f[14..16].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
    f[16..18].copy_from_slice(&ETH_P_IPV4.to_be_bytes());
    f[18] = 6;
    f[19] = 4;
    f[20..22].copy_from_slice(&3u16.to_be_bytes()); // reverse request
    f[22..28].copy_from_slice(&mac); // sender hardware address
    f[32..38].copy_from_slice(&mac); // target hardware address
    f
}

/// Whether `m` is a group (multicast/broadcast) address.
#[inline]
pub fn is_multicast(m: Mac) -> bool {
    m & 0x0100_0000_0000 != 0
}

/// Inserts an 802.1Q tag into `frame` (which has 4 spare bytes at the front: `frame[4..]` is
/// the untagged packet), returning the tagged frame. Used with a buffer's headroom.
pub fn push_vlan_in_place(frame: &mut [u8], vlan: u16) {
    if frame.len() < ETH_HLEN + 4 {
        return;
    }
    frame.copy_within(4..16, 0);
    frame[12..14].copy_from_slice(&ETH_P_8021Q.to_be_bytes());
    frame[14..16].copy_from_slice(&(vlan & 0x0fff).to_be_bytes());
}

/// Removes an 802.1Q tag: moves the MAC addresses 4 bytes forward; the packet then starts at
/// `frame[4..]`.
pub fn pop_vlan_in_place(frame: &mut [u8]) {
    if frame.len() < ETH_HLEN + 4 {
        return;
    }
    frame.copy_within(0..12, 4);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_and_vlan_edits() {
        let mut f = vec![0u8; 4];
        f.extend_from_slice(&[0xff; 6]);
        f.extend_from_slice(&[2, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&ETH_P_IPV4.to_be_bytes());
        f.extend_from_slice(&[0u8; 46]);
        let e = EthView::new_checked(&f[4..]).unwrap();
        assert_eq!(e.dst(), BROADCAST);
        assert_eq!(e.src(), 0x0200_0000_0001);
        assert!(is_multicast(e.dst()) && !is_multicast(e.src()));
        push_vlan_in_place(&mut f, 42);
        let t = EthView::new_checked(&f).unwrap();
        assert_eq!(t.vlan(), Some(42));
        assert_eq!(t.ethertype(), ETH_P_IPV4);
        assert_eq!(t.src(), 0x0200_0000_0001);
        pop_vlan_in_place(&mut f);
        let u = EthView::new_checked(&f[4..]).unwrap();
        assert_eq!(u.vlan(), None);
        assert_eq!(u.dst(), BROADCAST);
        assert!(EthView::new_checked(&f[..10]).is_none());
        assert_eq!(parse_mac("02:00:00:00:00:01"), Some(0x0200_0000_0001));
        assert_eq!(mac_to_string(0x0200_0000_0001), "02:00:00:00:00:01");
        assert_eq!(parse_mac("02:00:00:00:00"), None);
    }
}
