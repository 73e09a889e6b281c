//! Bridges and ports: adding and removing them, and opening the kernel side of TAP,
//! uplink (AF_XDP or AF_PACKET) and tunnel (VXLAN, Geneve) ports.

use ferrovs_sys::kernel::af_packet::AfPacketError;
use ferrovs_sys::kernel::af_xdp::XskError;
use ferrovs_sys::kernel::tap::TapError;

use super::*;

/// Why a kernel port could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum KernelPortError {
    #[error("cannot bind {local}")]
    VxlanBind {
        local: SocketAddrV4,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Tap(#[from] TapError),
    #[error(transparent)]
    AfPacket(#[from] AfPacketError),
    #[error(transparent)]
    AfXdp(#[from] XskError),
    /// `mode=af_xdp` was asked for and AF_XDP cannot be set up.
    #[error("mode=af_xdp")]
    ForcedAfXdp(#[source] XskError),
    #[error("{0} is not a kernel port type")]
    NotKernel(&'static str),
}

/// A kernel port's side as opened.
pub(super) struct KernelSide {
    pub io: PortIo,
    /// An uplink on AF_PACKET although AF_XDP was not ruled out by `mode=`: why.
    pub fallback: Option<String>,
}

impl From<PortIo> for KernelSide {
    fn from(io: PortIo) -> KernelSide {
        KernelSide { io, fallback: None }
    }
}

/// Opens the kernel side of a TAP, uplink or tunnel port (a tunnel port reads the bridge's
/// option map `tlv`). An uplink without `mode=` tries AF_XDP and falls back to AF_PACKET,
/// saying why AF_XDP was not used.
pub(super) fn open_kernel_port(
    cfg: &PortConfig,
    tlv: Arc<dp::TlvTable>,
) -> Result<KernelSide, KernelPortError> {
    let dev = cfg.dev.as_deref().unwrap_or_default();
    let af_packet = || {
        AfPacket::open(dev, RingGeometry::DEFAULT)
            .map(|(sock, ring)| PortIo::Uplink(UplinkIo::new(sock, ring)))
    };
    let af_xdp = || {
        XskSocket::open(dev, XskGeometry::DEFAULT)
            .map(|(sock, rx, tx)| PortIo::Xdp(Box::new(XdpIo::new(sock, rx, tx))))
    };
    match (cfg.kind, cfg.mode) {
        (PortType::Vxlan | PortType::Geneve, _) => {
            let (encap, local, remote, vni) = tunnel_endpoints(cfg);
            dp::TunnelIo::bind(encap, local, remote, vni, tlv)
                .map(|v| PortIo::Tunnel(v).into())
                .map_err(|source| KernelPortError::VxlanBind { local, source })
        }
        (PortType::Tap, _) => {
            Ok(PortIo::Tap(TapIo::new(ferrovs_sys::kernel::tap::Tap::open(dev)?)).into())
        }
        (PortType::Uplink, Some(UplinkMode::AfPacket)) => Ok(af_packet()?.into()),
        (PortType::Uplink, Some(UplinkMode::AfXdp)) => af_xdp()
            .map(KernelSide::from)
            .map_err(KernelPortError::ForcedAfXdp),
        (PortType::Uplink, None) if !ferrovs_sys::kernel::netdev::is_physical(dev) => {
            // What comes from this host's own stack (the peer of a veth) may be a partial
            // checksum or a GSO packet: only PACKET_VNET_HDR says so; AF_XDP frames carry no
            // such metadata and would forward pseudo-header sums as checksums.
            let why = format!(
                "{dev} is a virtual device: its peer may send partial checksums and GSO \
                 packets, whose metadata only AF_PACKET carries (mode=af_xdp forces AF_XDP)"
            );
            Ok(KernelSide {
                io: af_packet()?,
                fallback: Some(why),
            })
        }
        (PortType::Uplink, None) => match af_xdp() {
            Ok(io) => Ok(io.into()),
            // No such device: AF_PACKET would say the same.
            Err(e) if netdev_missing(dev) => Err(e.into()),
            Err(e) => {
                let why = with_sources(&e);
                let io = af_packet()?;
                log::warn!(
                    "port {}: AF_XDP unavailable ({why}); using AF_PACKET",
                    cfg.name
                );
                Ok(KernelSide {
                    io,
                    fallback: Some(why),
                })
            }
        },
        (PortType::VhostUser | PortType::VhostUserClient, _) => {
            Err(KernelPortError::NotKernel(cfg.kind.name()))
        }
    }
}

/// A tunnel port's (encapsulation, local, remote, VNI).
pub(super) fn tunnel_endpoints(
    cfg: &PortConfig,
) -> (dp::Encap, SocketAddrV4, SocketAddrV4, dp::TunnelVni) {
    let (encap, default) = match cfg.kind {
        PortType::Geneve => (dp::Encap::Geneve, dp::tunnel::GENEVE_PORT),
        _ => (dp::Encap::Vxlan, dp::tunnel::VXLAN_PORT),
    };
    let port = cfg.dst_port.unwrap_or(default);
    let vni = if cfg.key_flow {
        dp::TunnelVni::Flow
    } else {
        dp::TunnelVni::Fixed(cfg.key.unwrap_or(0))
    };
    (
        encap,
        SocketAddrV4::new(cfg.local_ip.unwrap_or(Ipv4Addr::UNSPECIFIED), port),
        SocketAddrV4::new(cfg.remote_ip.unwrap_or(Ipv4Addr::UNSPECIFIED), port),
        vni,
    )
}

pub(super) fn netdev_missing(dev: &str) -> bool {
    ferrovs_sys::kernel::netdev::ifindex(dev).is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
}

impl Daemon {
    pub(super) fn cfg_bridge(&mut self, name: &str) -> Option<&mut BridgeConfig> {
        self.config.bridges.iter_mut().find(|b| b.name == name)
    }

    pub(super) fn add_bridge(&mut self, name: &str) -> Result<(), ConfigError> {
        self.add_bridge_as(name, None, None)
    }

    /// Adds a bridge, with datapath id `id` when given (a takeover keeps the old ids) and its
    /// saved rules (`None`: the default NORMAL rule).
    pub(super) fn add_bridge_as(
        &mut self,
        name: &str,
        id: Option<u32>,
        flows: Option<&[String]>,
    ) -> Result<(), ConfigError> {
        config::validate_name("bridge", name)?;
        if self.bridges.contains_key(name) {
            return Err(ConfigError::Invalid(format!(
                "bridge {name} already exists"
            )));
        }
        let mut rules = match flows {
            Some(t) => BridgeRules::from_texts(t).map_err(|e| {
                ConfigError::Invalid(format!("bridge {name}: {}", with_sources(&e)))
            })?,
            None => BridgeRules::new(),
        };
        let groups = self
            .cfg_bridge(name)
            .map(|b| b.groups.clone())
            .unwrap_or_default();
        rules
            .load_groups(&groups)
            .map_err(|e| ConfigError::Invalid(format!("bridge {name}: {}", with_sources(&e))))?;
        let id = match id {
            Some(id) => claim_slot(&mut self.bridge_slots, id)?,
            None => alloc_slot(&mut self.bridge_slots),
        };
        let size = self.config.setting_u32("mac-table-size", 8192) as usize;
        let aging = self.config.setting_u32("mac-aging", 300);
        self.bridges.insert(
            name.into(),
            BridgeState {
                id,
                macs: Arc::new(MacTable::new(size, aging)),
                cache: Arc::new(MegaflowCache::new(id)),
                pipeline: None,
                gen: 0,
                dirty: !rules.is_plain_normal(),
                rules,
                built_ports: vec![],
                meters: Default::default(),
                meter_specs: BTreeMap::new(),
                tlv: Arc::default(),
            },
        );
        self.apply_flow_limit();
        if self.cfg_bridge(name).is_none() {
            self.config.bridges.push(BridgeConfig {
                name: name.into(),
                ports: vec![],
                flows: None,
                ..Default::default()
            });
        }
        self.sync_flows_config(name);
        self.publish();
        self.of_listen(name);
        Ok(())
    }

    pub(super) fn del_bridge(&mut self, name: &str) -> Result<(), ConfigError> {
        let Some(b) = self.bridges.get(name) else {
            return Err(ConfigError::Invalid(format!("no bridge named {name}")));
        };
        let id = b.id;
        let members: Vec<String> = self
            .ports
            .values()
            .filter(|p| p.bridge == name)
            .map(|p| p.cfg.name.clone())
            .collect();
        for p in members {
            self.del_port(name, &p)?;
        }
        if let Some(b) = self.bridges.remove(name) {
            b.cache.flush();
        }
        self.of_unlisten(name);
        self.bridge_slots[id as usize] = false;
        self.config.bridges.retain(|b| b.name != name);
        self.publish();
        Ok(())
    }

    pub(super) fn add_port(&mut self, bridge: &str, cfg: PortConfig) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        config::validate_port(&cfg)?;
        if !self.bridges.contains_key(bridge) {
            return bad(format!("no bridge named {bridge}"));
        }
        if let Some(p) = self.ports.get(&cfg.name) {
            return bad(format!(
                "port {} already exists on bridge {}",
                cfg.name, p.bridge
            ));
        }
        if let Some(other) = self
            .ports
            .values()
            .find(|p| p.cfg.path.is_some() && p.cfg.path == cfg.path)
        {
            return bad(format!(
                "port {}: socket path is already used by port {}",
                cfg.name, other.cfg.name
            ));
        }
        if cfg.kind.is_kernel() {
            return self.add_kernel_port(bridge, cfg);
        }
        let path = cfg.path.clone().unwrap_or_default();
        let listener = if cfg.kind == PortType::VhostUser {
            let l = bind_socket(&path).map_err(|e| {
                ConfigError::Invalid(format!("port {}: {}", cfg.name, with_sources(&e)))
            })?;
            Some(l)
        } else {
            None
        };
        let id = alloc_slot(&mut self.port_slots);
        let mut device = Device::new(&cfg.name, cfg.queues as usize);
        device.set_packed_rings(self.config.packed_rings());
        let link = if listener.is_some() {
            Link::Listening
        } else {
            Link::Reconnecting {
                at: Instant::now(),
                backoff: BACKOFF_MIN,
            }
        };
        let io = PortIo::Vhost {
            queues: device.queues().to_vec(),
        };
        let res = self.insert_port(
            bridge,
            cfg.clone(),
            (id, None),
            io,
            Some(device),
            listener,
            None,
            link,
        );
        if let Err(e) = res {
            self.port_slots[id as usize] = false;
            return Err(e);
        }
        if cfg.kind == PortType::VhostUserClient {
            self.try_connect(&cfg.name);
        }
        Ok(())
    }

    /// Adds a TAP or uplink port: opens its netdev, then wires it in.
    pub(super) fn add_kernel_port(
        &mut self,
        bridge: &str,
        cfg: PortConfig,
    ) -> Result<(), ConfigError> {
        let dev = cfg.dev.clone().unwrap_or_default();
        if let Some(other) = self
            .ports
            .values()
            .find(|p| p.cfg.kind.is_kernel() && p.cfg.dev.as_deref() == Some(dev.as_str()))
        {
            return Err(ConfigError::Invalid(format!(
                "port {}: dev {dev} is already used by port {}",
                cfg.name, other.cfg.name
            )));
        }
        let tlv = self.bridge_tlv(bridge);
        let KernelSide { io, fallback } = match self.shared_endpoint(&cfg)? {
            // Another tunnel port's endpoint: this port shares its socket.
            Some(ep) => {
                let (_, _, remote, vni) = tunnel_endpoints(&cfg);
                PortIo::Tunnel(dp::TunnelIo::on_endpoint(ep, remote, vni, tlv)).into()
            }
            None => open_kernel_port(&cfg, tlv).map_err(|e| {
                ConfigError::Invalid(format!("port {}: {}", cfg.name, with_sources(&e)))
            })?,
        };
        let id = alloc_slot(&mut self.port_slots);
        let name = cfg.name.clone();
        let res = self.insert_port(
            bridge,
            cfg,
            (id, None),
            io,
            None,
            None,
            None,
            Link::Attached,
        );
        if res.is_err() {
            self.port_slots[id as usize] = false;
        }
        if let Some(st) = self.ports.get_mut(&name) {
            st.fallback = fallback;
        }
        res
    }

    /// The endpoint a new tunnel port `cfg` shares with a port already on the same local
    /// address, port and encapsulation (OVN: one port per remote chassis, all on `:6081`);
    /// `None`: it opens its own. Two ports to the same remote on one endpoint are refused.
    pub(super) fn shared_endpoint(
        &self,
        cfg: &PortConfig,
    ) -> Result<Option<Arc<dp::TunnelEndpoint>>, ConfigError> {
        if !cfg.kind.is_tunnel() {
            return Ok(None);
        }
        let (encap, local, remote, _) = tunnel_endpoints(cfg);
        let mut shared = None;
        for p in self.ports.values() {
            let PortIo::Tunnel(t) = &p.port.io else {
                continue;
            };
            if t.ep.local != local || t.ep.encap != encap {
                continue;
            }
            if t.remote.ip() == remote.ip() {
                return Err(ConfigError::Invalid(format!(
                    "port {}: port {} already tunnels to {} from {local}",
                    cfg.name,
                    p.cfg.name,
                    remote.ip()
                )));
            }
            shared = Some(t.ep.clone());
        }
        Ok(shared)
    }

    /// `bridge`'s tunnel option map (a fresh empty one for a bridge that does not exist).
    pub(super) fn bridge_tlv(&self, bridge: &str) -> Arc<dp::TlvTable> {
        self.bridges
            .get(bridge)
            .map(|b| b.tlv.clone())
            .unwrap_or_default()
    }

    /// Replaces `bridge`'s tunnel option map (what `NXT_TLV_TABLE_MOD` builds): its tunnel
    /// ports map received Geneve options to `tun_metadataN`, and emit set ones, with it
    /// from their next burst. False when there is no such bridge.
    pub fn set_tlv_map(&self, bridge: &str, map: ferrovs_flow::TlvMap) -> bool {
        match self.bridges.get(bridge) {
            Some(b) => {
                b.tlv.store(Arc::new(map));
                true
            }
            None => false,
        }
    }

    /// `bridge`'s tunnel option map now.
    pub fn tlv_map(&self, bridge: &str) -> Option<ferrovs_flow::TlvMap> {
        self.bridges.get(bridge).map(|b| (**b.tlv.load()).clone())
    }

    /// The OpenFlow port number for a new port `cfg` of `bridge`: `OFPP_LOCAL` for the
    /// bridge's own port (a TAP named as the bridge), else `want` (a takeover's old number)
    /// or the number the port asks for when no port of the bridge has it, else the one it
    /// had before (OVSDB's `ofport`, as OVS keeps it), else the lowest free one from 1.
    pub(super) fn pick_ofport(&self, bridge: &str, cfg: &PortConfig, want: Option<u16>) -> u16 {
        if cfg.kind == PortType::Tap && cfg.name == bridge {
            return config::OFPP_LOCAL;
        }
        let used: std::collections::HashSet<u16> = self
            .ports
            .values()
            .filter(|p| p.bridge == bridge)
            .map(|p| p.ofport)
            .collect();
        let free = |n: &u16| (1..=config::OFPORT_MAX).contains(n) && !used.contains(n);
        want.filter(free)
            .or(cfg.ofport.filter(free))
            .or(self.ofport_hint.filter(free))
            .or_else(|| (1..=config::OFPORT_MAX).find(free))
            .unwrap_or(0)
    }

    /// Wires a port into the daemon and the datapath (new, or handed over by a takeover
    /// with its old OpenFlow port number in `(id, ofport)`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn insert_port(
        &mut self,
        bridge: &str,
        cfg: PortConfig,
        (id, ofport): (u32, Option<u16>),
        io: PortIo,
        device: Option<Device>,
        listener: Option<UnixListener>,
        conn: Option<Conn>,
        link: Link,
    ) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        let Some(b) = self.bridges.get(bridge) else {
            return bad(format!("no bridge named {bridge}"));
        };
        let bridge_id = b.id;
        let vlan = match (cfg.tag, cfg.trunks.is_empty()) {
            (Some(t), _) => VlanMode::Access(t),
            (None, true) => VlanMode::Trunk,
            (None, false) => VlanMode::TrunkOf(cfg.trunks.clone()),
        };
        if let Some(d) = &device {
            d.set_coalesce(cfg.coalesce());
        }
        let port = Arc::new(Port {
            id,
            name: cfg.name.clone(),
            bridge: bridge_id,
            vlan,
            io,
            rx_drops: Default::default(),
            tx_not_ready: Default::default(),
            offload: Default::default(),
            inject: Default::default(),
            capture: Default::default(),
            rxq_load: Default::default(),
        });
        let listener = match listener {
            Some(l) => {
                let t = self.token(Source::VhostListener, &cfg.name);
                if let Err(e) = self.epoll.add(l.as_fd(), t, false) {
                    return bad(format!("port {}: epoll: {e}", cfg.name));
                }
                Some((l, t))
            }
            None => None,
        };
        let conn = match conn {
            Some(c) => {
                let t = self.token(Source::VhostConn, &cfg.name);
                if let Err(e) = self.epoll.add(c.as_fd(), t, c.wants_write()) {
                    return bad(format!("port {}: epoll: {e}", cfg.name));
                }
                Some((c, t))
            }
            None => None,
        };
        let ofport = self.pick_ofport(bridge, &cfg, ofport);
        let st = PortState {
            id,
            ofport,
            bridge: bridge.into(),
            cfg: cfg.clone(),
            device,
            port,
            listener,
            conn,
            link,
            connects: 0,
            disconnects: 0,
            refused_connections: 0,
            broken_logged: 0,
            last_error: None,
            fallback: None,
        };
        self.ports.insert(cfg.name.clone(), st);
        if let Some(b) = self.cfg_bridge(bridge) {
            if !b.ports.iter().any(|p| p.name == cfg.name) {
                b.ports.push(cfg.clone());
            }
        }
        self.publish();
        if let Some((b, d)) = self.of_port_desc(&cfg.name) {
            self.of_port_status(&b, d, 0);
        }
        Ok(())
    }

    pub(super) fn del_port(&mut self, bridge: &str, name: &str) -> Result<(), ConfigError> {
        match self.ports.get(name) {
            None => return Err(ConfigError::Invalid(format!("no port named {name}"))),
            Some(p) if p.bridge != bridge => {
                return Err(ConfigError::Invalid(format!(
                    "port {name} is on bridge {}, not {bridge}",
                    p.bridge
                )))
            }
            Some(_) => {}
        }
        self.disconnect(name, None);
        let desc = self.of_port_desc(name);
        let Some(mut p) = self.ports.remove(name) else {
            return Ok(());
        };
        if let Some((l, t)) = p.listener.take() {
            let _ = self.epoll.delete(l.as_fd());
            self.tokens.remove(&t);
            if let Some(path) = &p.cfg.path {
                let _ = std::fs::remove_file(path);
            }
        }
        self.port_slots[p.id as usize] = false;
        if let Some(b) = self.bridges.get(bridge) {
            b.macs.flush_port(p.id);
        }
        if let Some(b) = self.cfg_bridge(bridge) {
            b.ports.retain(|x| x.name != name);
        }
        self.publish();
        if let Some((b, d)) = desc {
            self.of_port_status(&b, d, 1);
        }
        Ok(())
    }

    /// `ferrovs set-port`: changes a live port's settings (coalescing), saved with the
    /// configuration and applied at once.
    pub(super) fn set_port(&mut self, name: &str, options: &[String]) -> Result<(), ConfigError> {
        let p = self
            .ports
            .get_mut(name)
            .ok_or_else(|| ConfigError::Invalid(format!("no port named {name}")))?;
        let mut cfg = p.cfg.clone();
        options::port_set_options(&mut cfg, options)?;
        if let Some(d) = &p.device {
            d.set_coalesce(cfg.coalesce());
        }
        let repin = cfg.pmd_rxq_affinity != p.cfg.pmd_rxq_affinity;
        // The saved configuration lists ports under their bridges.
        for b in &mut self.config.bridges {
            for c in &mut b.ports {
                if c.name == name {
                    *c = cfg.clone();
                }
            }
        }
        p.cfg = cfg;
        if repin {
            // New pins: the queues are dealt again (`rxqs.rs`).
            self.publish_snapshot();
        }
        Ok(())
    }

    /// Reads the kernel's AF_XDP drop counters into the ports' counters.
    pub(super) fn poll_kernel_drops(&self) {
        for p in self.ports.values() {
            if let PortIo::Xdp(x) = &p.port.io {
                x.poll_kernel_drops();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Tunnel ports of a real daemon (no traffic): a Geneve port as OVN asks for it, and the
    //! bridge's option map reaching it.
    use super::*;
    use ferrovs_flow::{TlvEntry, TlvMap};
    use ferrovs_proto::Request;

    fn daemon(name: &str) -> (Daemon, PathBuf) {
        let dir = std::env::temp_dir().join(format!("ferrovs-tun-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut opts = DaemonOptions::in_dir(&dir);
        opts.pmd_cores = Some(vec![*os::allowed_cpus().last().unwrap_or(&0)]);
        (Daemon::start(opts).expect("daemon starts"), dir)
    }

    #[test]
    fn a_geneve_key_flow_port_opens_and_reads_the_bridge_s_option_map() {
        let (mut d, dir) = daemon("geneve");
        let r = d.handle(Request::AddPort {
            bridge: "br0".into(),
            port: "gv".into(),
            options: [
                "type=geneve",
                "remote_ip=127.0.0.2",
                "local_ip=127.0.0.1",
                "dst_port=16081",
                "key=flow",
                "csum=true",
            ]
            .map(String::from)
            .to_vec(),
        });
        assert!(r.ok, "{:?}", r.error);
        let st = &d.ports["gv"];
        assert!(st.cfg.key_flow && st.cfg.csum == Some(true));
        let PortIo::Tunnel(t) = &st.port.io else {
            panic!("not a tunnel port")
        };
        assert_eq!(t.encap, dp::Encap::Geneve);
        assert!(t.takes_metadata() && st.port.takes_tunnel_metadata());
        assert_eq!(t.local, "127.0.0.1:16081".parse().unwrap());
        assert!(t.tlv.load().is_empty());
        let ovn = TlvEntry {
            class: 0x0102,
            kind: 0x80,
            len: 4,
            index: 0,
        };
        assert!(d.set_tlv_map("br0", TlvMap::new([ovn]).unwrap()));
        assert!(!d.set_tlv_map("nope", TlvMap::default()));
        // The port reads the bridge's table: the new map without a new port.
        assert_eq!(t.tlv.load().entries(), &[ovn]);
        assert_eq!(d.tlv_map("br0").unwrap().entries(), &[ovn]);
        // A fixed-key VXLAN port beside it on another endpoint.
        let r = d.handle(Request::AddPort {
            bridge: "br0".into(),
            port: "vx".into(),
            options: [
                "type=vxlan",
                "remote_ip=127.0.0.3",
                "dst_port=14790",
                "key=9",
            ]
            .map(String::from)
            .to_vec(),
        });
        assert!(r.ok, "{:?}", r.error);
        let PortIo::Tunnel(v) = &d.ports["vx"].port.io else {
            panic!("not a tunnel port")
        };
        assert_eq!(
            (v.encap, v.vni),
            (dp::Encap::Vxlan, dp::TunnelVni::Fixed(9))
        );
        assert!(!v.takes_metadata());
        // A second Geneve port on gv's endpoint shares its socket; one to a remote the
        // endpoint has already is refused.
        let add = |d: &mut Daemon, name: &str, remote: &str| {
            d.handle(Request::AddPort {
                bridge: "br0".into(),
                port: name.into(),
                options: [
                    "type=geneve".to_string(),
                    format!("remote_ip={remote}"),
                    "local_ip=127.0.0.1".into(),
                    "dst_port=16081".into(),
                    "key=flow".into(),
                ]
                .to_vec(),
            })
        };
        let r = add(&mut d, "gv2", "127.0.0.4");
        assert!(r.ok, "{:?}", r.error);
        let (PortIo::Tunnel(a), PortIo::Tunnel(b)) =
            (&d.ports["gv"].port.io, &d.ports["gv2"].port.io)
        else {
            panic!("not tunnel ports")
        };
        assert!(Arc::ptr_eq(&a.ep, &b.ep));
        let r = add(&mut d, "gv3", "127.0.0.4");
        let e = r.error.unwrap_or_default();
        assert!(e.contains("port gv2 already tunnels to 127.0.0.4"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
