#!/usr/bin/env bash
# A private OVS-DPDK instance for benchmarks (sourced by bench/*.sh): its own ovsdb-server
# and ovs-vswitchd (the DPDK build from Debian's openvswitch-switch-dpdk) inside a run
# directory, a netdev bridge with two vhost-user server ports (dpdkvhostuser) and the NORMAL
# action, its PMD pinned to one core. Needs 1 GiB of 2 MiB hugepages (OVS's EAL refuses
# --no-huge together with the --in-memory it adds): scripts/deps.sh --hugepages 600.
#
#   source scripts/peers/ovs-dpdk.sh
#   ovs_start DIR CORE          # ports at $(ovs_port_path DIR 1) and $(ovs_port_path DIR 2)
#   ovs_start DIR CORE client SOCK1 SOCK2   # dpdkvhostuserclient ports: OVS connects to the
#                                           # guests' sockets (QEMU server=on), reconnects
#   ovs_restart_vswitchd DIR CORE           # stop and start ovs-vswitchd, database kept
#   ovs_start_bare DIR CORE     # ovsdb-server and ovs-vswitchd only: no bridge, no port
#                               # (vhost-sock-dir is DIR; the database at unix:DIR/db.sock)
#   ovs_pmd_clear DIR; ovs_cycles_per_packet DIR; ovs_total_cycles_per_packet DIR; ovs_stop

OVS_VSWITCHD=/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk
_ovs_dir=

_ovs_ctl() { ovs-vsctl --db="unix:$_ovs_dir/db.sock" --timeout=20 "$@"; }
ovs_appctl() { ovs-appctl -t "$_ovs_dir/ovs-vswitchd.ctl" "$@"; }

ovs_port_path() { echo "$1/vhu$2"; }

ovs_start_bare() {
    local dir=$1 core=$2
    _ovs_dir=$dir
    # Everything OVS puts in its run directory (vhost sockets, bridge mgmt sockets) goes here.
    export OVS_RUNDIR=$dir OVS_LOGDIR=$dir OVS_DBDIR=$dir
    bash "$(dirname "${BASH_SOURCE[0]}")/../deps.sh" --hugepages 600 >/dev/null
    mkdir -p "$dir"
    rm -f "$dir"/conf.db "$dir"/*.ctl "$dir"/*.sock "$dir"/vhu*
    ovsdb-tool create "$dir/conf.db" /usr/share/openvswitch/vswitch.ovsschema
    setsid ovsdb-server "$dir/conf.db" --remote="punix:$dir/db.sock" --unixctl="$dir/ovsdb-server.ctl" \
        --pidfile="$dir/ovsdb-server.pid" --log-file="$dir/ovsdb-server.log" --detach --no-chdir
    _ovs_ctl --no-wait init
    _ovs_ctl --no-wait set Open_vSwitch . other_config:dpdk-init=true \
        "other_config:dpdk-extra=--no-pci" other_config:dpdk-socket-mem=1024 \
        "other_config:pmd-cpu-mask=$(printf '0x%x' $((1 << core)))" \
        other_config:dpdk-lcore-mask="$(printf '0x%x' $((1 << core)))" \
        other_config:vhost-sock-dir=.
    _ovs_vswitchd "$dir" || return 1
}

ovs_start() {
    ovs_start_bare "$1" "$2" || return 1
    _ovs_ctl add-br br0 -- set bridge br0 datapath_type=netdev
    if [ "${3:-}" = client ]; then
        _ovs_ctl add-port br0 vhu1 -- set Interface vhu1 type=dpdkvhostuserclient \
            "options:vhost-server-path=$4"
        _ovs_ctl add-port br0 vhu2 -- set Interface vhu2 type=dpdkvhostuserclient \
            "options:vhost-server-path=$5"
    else
        for i in 1 2; do
            _ovs_ctl add-port br0 "vhu$i" -- set Interface "vhu$i" type=dpdkvhostuser
        done
    fi
    _ovs_ctl set Interface vhu1 ofport_request=1 -- set Interface vhu2 ofport_request=2
    # The bridge's default flow table is one rule: actions=NORMAL (MAC learning).
}

_ovs_vswitchd() {
    local dir=$1
    setsid "$OVS_VSWITCHD" "unix:$dir/db.sock" --unixctl="$dir/ovs-vswitchd.ctl" \
        --pidfile="$dir/ovs-vswitchd.pid" --log-file="$dir/ovs-vswitchd.log" --detach --no-chdir ||
        { tail -5 "$dir/ovs-vswitchd.log" >&2; return 1; }
}

# A plain restart of the switch daemon, as a package upgrade does it: exit, start again.
ovs_restart_vswitchd() {
    local dir=$1 pid
    pid=$(cat "$dir/ovs-vswitchd.pid" 2>/dev/null || true)
    ovs_appctl exit >/dev/null 2>&1 || true
    [ -n "$pid" ] && for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    _ovs_vswitchd "$dir"
}

ovs_pmd_clear() { ovs_appctl dpif-netdev/pmd-stats-clear >/dev/null; }

# "avg processing cycles per packet" of the first PMD, as pmd-stats-show prints it.
ovs_cycles_per_packet() {
    ovs_appctl dpif-netdev/pmd-stats-show | awk '/avg processing cycles per packet:/ {print $6; exit}'
}

# All cycles of the PMD (busy and idle) per packet.
ovs_total_cycles_per_packet() {
    ovs_appctl dpif-netdev/pmd-stats-show | awk '/avg cycles per packet:/ {print $5; exit}'
}

ovs_stop() {
    [ -n "$_ovs_dir" ] || return 0
    # Read the pids first: each daemon unlinks its pidfile as it exits, so a pidfile looked for
    # after `exit` may be gone while its process still runs (and would then delete the pidfile
    # of the next instance started in the same directory).
    local p pid pids=()
    for p in "$_ovs_dir"/*.pid; do [ -f "$p" ] && pids+=("$(cat "$p")"); done
    ovs_appctl exit >/dev/null 2>&1 || true
    ovs-appctl -t "$_ovs_dir/ovsdb-server.ctl" exit >/dev/null 2>&1 || true
    # Wait until the processes are really gone: a PMD still spinning would skew the next run.
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
    # The netdev datapath's TAP devices outlive a vswitchd that exits without deleting its
    # bridge. With a `br0` left up and promiscuous in the root namespace, the os-ken switch
    # tests run afterwards missed packet-ins (2026-11-29: 9-18 cases, twice); with the
    # devices deleted they passed.
    ip link del br0 2>/dev/null || true
    ip link del ovs-netdev 2>/dev/null || true
    _ovs_dir=
}
