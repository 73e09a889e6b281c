//! virtio and vhost-user feature bits used by ferrovs.

pub const VIRTIO_NET_F_CSUM: u64 = 1 << 0;
pub const VIRTIO_NET_F_GUEST_CSUM: u64 = 1 << 1;
pub const VIRTIO_NET_F_MTU: u64 = 1 << 3;
pub const VIRTIO_NET_F_MAC: u64 = 1 << 5;
pub const VIRTIO_NET_F_GUEST_TSO4: u64 = 1 << 7;
pub const VIRTIO_NET_F_GUEST_TSO6: u64 = 1 << 8;
pub const VIRTIO_NET_F_GUEST_ECN: u64 = 1 << 9;
pub const VIRTIO_NET_F_HOST_TSO4: u64 = 1 << 11;
pub const VIRTIO_NET_F_HOST_TSO6: u64 = 1 << 12;
pub const VIRTIO_NET_F_HOST_ECN: u64 = 1 << 13;
pub const VIRTIO_NET_F_MRG_RXBUF: u64 = 1 << 15;
pub const VIRTIO_NET_F_STATUS: u64 = 1 << 16;
pub const VIRTIO_NET_F_CTRL_VQ: u64 = 1 << 17;
pub const VIRTIO_NET_F_GUEST_ANNOUNCE: u64 = 1 << 21;
pub const VIRTIO_NET_F_MQ: u64 = 1 << 22;
pub const VIRTIO_F_NOTIFY_ON_EMPTY: u64 = 1 << 24;
pub const VHOST_F_LOG_ALL: u64 = 1 << 26;
pub const VIRTIO_F_ANY_LAYOUT: u64 = 1 << 27;
pub const VIRTIO_RING_F_INDIRECT_DESC: u64 = 1 << 28;
pub const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
pub const VIRTIO_F_ACCESS_PLATFORM: u64 = 1 << 33;
pub const VIRTIO_F_RING_PACKED: u64 = 1 << 34;
/// The device uses buffers in the order they were made available (virtio 1.1 §6.3). Ours
/// always does, on both ring layouts: chains are taken, completed and their used entries
/// written in available order, a packet that does not fit is taken back whole, and a
/// broken queue stops. A driver that knows it (DPDK's) then runs its in-order paths.
pub const VIRTIO_F_IN_ORDER: u64 = 1 << 35;

/// Offload features: checksum and TCP segmentation, both directions.
pub const OFFLOADS: u64 = VIRTIO_NET_F_CSUM
    | VIRTIO_NET_F_GUEST_CSUM
    | VIRTIO_NET_F_HOST_TSO4
    | VIRTIO_NET_F_HOST_TSO6
    | VIRTIO_NET_F_HOST_ECN
    | VIRTIO_NET_F_GUEST_TSO4
    | VIRTIO_NET_F_GUEST_TSO6
    | VIRTIO_NET_F_GUEST_ECN;

/// Virtio features ferrovs offers on a vhost-user net port. `VHOST_F_LOG_ALL` is what a
/// frontend sets while it migrates the VM (dirty-page logging: QEMU blocks migration without
/// it); `VIRTIO_NET_F_GUEST_ANNOUNCE` lets the guest announce itself after a migration (its
/// control queue is the frontend's, not ours).
pub const OFFERED: u64 = OFFLOADS
    | VHOST_F_LOG_ALL
    | VIRTIO_NET_F_GUEST_ANNOUNCE
    | VIRTIO_F_VERSION_1
    | VIRTIO_NET_F_MRG_RXBUF
    | VIRTIO_RING_F_EVENT_IDX
    | VIRTIO_RING_F_INDIRECT_DESC
    | VIRTIO_NET_F_MQ
    | VIRTIO_F_NOTIFY_ON_EMPTY
    | VIRTIO_F_ANY_LAYOUT
    | VIRTIO_F_IN_ORDER
    | VHOST_USER_F_PROTOCOL_FEATURES;

pub const PROTOCOL_F_MQ: u64 = 1 << 0;
pub const PROTOCOL_F_LOG_SHMFD: u64 = 1 << 1;
pub const PROTOCOL_F_RARP: u64 = 1 << 2;
pub const PROTOCOL_F_REPLY_ACK: u64 = 1 << 3;
pub const PROTOCOL_F_MTU: u64 = 1 << 4;
pub const PROTOCOL_F_BACKEND_REQ: u64 = 1 << 5;
pub const PROTOCOL_F_PAGEFAULT: u64 = 1 << 8;
pub const PROTOCOL_F_CONFIG: u64 = 1 << 9;
pub const PROTOCOL_F_RESET_DEVICE: u64 = 1 << 13;
pub const PROTOCOL_F_CONFIGURE_MEM_SLOTS: u64 = 1 << 15;
pub const PROTOCOL_F_STATUS: u64 = 1 << 16;

/// Protocol features ferrovs offers: with LOG_SHMFD (dirty log in shared memory), RARP
/// (announce a migrated guest for it) and PAGEFAULT (postcopy through userfaultfd), a VM on a
/// ferrovs port can be live-migrated (`docs/migration.md`).
pub const PROTOCOL_OFFERED: u64 = PROTOCOL_F_MQ
    | PROTOCOL_F_LOG_SHMFD
    | PROTOCOL_F_RARP
    | PROTOCOL_F_REPLY_ACK
    | PROTOCOL_F_PAGEFAULT
    | PROTOCOL_F_RESET_DEVICE;

/// Most queue pairs a port supports.
pub const MAX_QUEUE_PAIRS: usize = 16;

/// Length of the virtio-net header in front of every packet: 12 bytes with VERSION_1 or
/// MRG_RXBUF (`num_buffers` present), 10 bytes for a legacy device without them.
pub fn net_hdr_len(features: u64) -> usize {
    if features & (VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF) != 0 {
        12
    } else {
        10
    }
}

/// What the guest accepts on its receive queues ([`ferrovs_sys::kernel::vnet::caps`] bits).
pub fn guest_rx_caps(f: u64) -> u8 {
    use ferrovs_sys::kernel::vnet::caps;
    let mut c = 0;
    if f & VIRTIO_NET_F_GUEST_CSUM != 0 {
        c |= caps::CSUM;
        if f & VIRTIO_NET_F_GUEST_TSO4 != 0 {
            c |= caps::TSO4;
        }
        if f & VIRTIO_NET_F_GUEST_TSO6 != 0 {
            c |= caps::TSO6;
        }
        if f & VIRTIO_NET_F_GUEST_ECN != 0 && c & (caps::TSO4 | caps::TSO6) != 0 {
            c |= caps::TSO_ECN;
        }
    }
    c
}

/// What the guest may ask of us on its transmit queues ([`ferrovs_sys::kernel::vnet::caps`] bits).
pub fn guest_tx_caps(f: u64) -> u8 {
    use ferrovs_sys::kernel::vnet::caps;
    let mut c = 0;
    if f & VIRTIO_NET_F_CSUM != 0 {
        c |= caps::CSUM;
        if f & VIRTIO_NET_F_HOST_TSO4 != 0 {
            c |= caps::TSO4;
        }
        if f & VIRTIO_NET_F_HOST_TSO6 != 0 {
            c |= caps::TSO6;
        }
        if f & VIRTIO_NET_F_HOST_ECN != 0 && c & (caps::TSO4 | caps::TSO6) != 0 {
            c |= caps::TSO_ECN;
        }
    }
    c
}

/// Names of the bits set in `features`, for `ferrovs show`.
pub fn names(features: u64) -> Vec<&'static str> {
    const NAMES: &[(u64, &str)] = &[
        (VIRTIO_NET_F_CSUM, "csum"),
        (VIRTIO_NET_F_GUEST_CSUM, "guest_csum"),
        (VIRTIO_NET_F_GUEST_TSO4, "guest_tso4"),
        (VIRTIO_NET_F_GUEST_TSO6, "guest_tso6"),
        (VIRTIO_NET_F_HOST_TSO4, "host_tso4"),
        (VIRTIO_NET_F_HOST_TSO6, "host_tso6"),
        (VIRTIO_NET_F_GUEST_ECN, "guest_ecn"),
        (VIRTIO_NET_F_HOST_ECN, "host_ecn"),
        (VIRTIO_NET_F_MRG_RXBUF, "mrg_rxbuf"),
        (VIRTIO_NET_F_MQ, "mq"),
        (VIRTIO_NET_F_GUEST_ANNOUNCE, "guest_announce"),
        (VHOST_F_LOG_ALL, "log_all"),
        (VIRTIO_RING_F_INDIRECT_DESC, "indirect_desc"),
        (VIRTIO_RING_F_EVENT_IDX, "event_idx"),
        (VHOST_USER_F_PROTOCOL_FEATURES, "protocol_features"),
        (VIRTIO_F_VERSION_1, "version_1"),
        (VIRTIO_F_RING_PACKED, "ring_packed"),
        (VIRTIO_F_IN_ORDER, "in_order"),
    ];
    NAMES
        .iter()
        .filter(|(b, _)| features & b != 0)
        .map(|(_, n)| *n)
        .collect()
}
