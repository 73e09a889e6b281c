#!/usr/bin/env bash
# The OVN multi-chassis lab (issue 20): OVN's central services and two or more chassis in
# network namespaces, joined by a veth underlay, each chassis with its own ovsdb-server,
# switch and ovn-controller. The switch is OVS (ovs-vswitchd, netdev datapath, userspace
# Geneve: the reference) or ferrovs (ferrovsd --ovsdb: the system under test); the same
# scenarios run on either.
#
#   tests/ovn/lab.sh up [--switch ovs|ferrovs] [--chassis N] [--no-of-trace]
#   tests/ovn/lab.sh run [--keep] SCENARIO...     1 to 8 or all (scenarios below)
#   tests/ovn/lab.sh inventory [OUT.md]           what ovn-controller used (docs/ovn.md)
#   tests/ovn/lab.sh status                       chassis, tunnels, ports, bindings
#   tests/ovn/lab.sh down [--keep-logs]
#   tests/ovn/lab.sh test [up options] [SCENARIO...]   up, run, down (down even on failure)
#
# Scenarios (each sets up its logical network and VMs, checks, dumps the flows every chassis
# has into the lab's flows/ directory, and removes what it set up):
#   1  one logical switch, a VM on chassis 1 and one on chassis 2: ping both ways across
#      the Geneve tunnel, then TCP (1 MiB echoed through socat, compared) and iperf3 for 2 s
#   2  a logical router between two logical switches, a VM on each (chassis 1 and 2): ping
#      the router and across it both ways, TCP across
#   3  ACLs on one logical switch: to vm2 allow-related from vm1, to either VM drop the rest
#      of IPv4: vm1 -> vm2 ping and TCP work (replies come back), vm2 -> vm1 neither
#   4  OVN's native DHCP (ovn-controller's pinctrl: packet-in, continuation): vm1 (ch1)
#      gets its address and router from OVN with busybox udhcpc, then pings vm2 (ch2)
#   5  a load balancer (VIP 10.0.0.100:80 over be1 on ch1 and be2 on ch2, servers that
#      answer their name): 20 connections from vm1 (ch1, behind a router) spread over both,
#      each connection stays on its backend, and hairpin (be1 to the VIP reaches itself too)
#   6  QEMU guests (TCG, the e2e tests' image) on one logical switch, g1 on chassis 1 and g2
#      on chassis 2: their virtio-net NICs are vhost-user ports of ferrovs, or TAPs on OVS's
#      br-int; each pings the other from inside, then 2 s of TCP guest to guest
#   7  an upgrade under OVN: a TCP stream vm1 (ch1) -> vm2 (ch2) while chassis 1's switch is
#      upgraded (ferrovs: a hot upgrade; OVS: ovs-vswitchd restarted, as a package upgrade
#      does): the stream goes on; with ferrovs also ovn-controller keeps its OpenFlow
#      connections (its log shows no reconnect) and the chassis has the same flows
#   8  ACLs over an address set and a port group (conjunctive flows: `conjunction(id,k/n)`,
#      `conj_id`, checked installed on both chassis): vm1..vm4 on ls1, to pg_srv {vm2, vm3}
#      allow-related TCP from $as_web {vm1, vm4} to {5001, 5002}, drop other IPv4: allowed
#      and dropped connections across and within chassis
#
# `run` exits 0 when every check passed; on a failure it prints the checks and the tails of
# the logs and takes the lab down (keeping its directory: --keep leaves the lab running).
# Its last line is "N passed, N failed".
#
# Layout (OVNLAB_DIR, default /tmp/ferrovs-ovnlab):
#   namespace ovl-central: bridge ul-br 172.31.0.1/24; NB and SB ovsdb-servers (unix sockets
#     central/nb.sock, central/sb.sock; SB also on tcp:172.31.0.1:6642) and ovn-northd
#   namespace ovl-chN (directory chN/: databases, sockets, pid and log files; OVS_RUNDIR):
#     eth1 (veth, its peer ulN on ul-br), encap IP 172.31.0.(10+N); ovsdb-server, the
#     switch, ovn-controller (system-id chN). OVS: eth1 in an OVS netdev bridge br-phy that
#     carries the encap IP (userspace tunnels need the kernel's route and ARP through an OVS
#     bridge: OVS Documentation/howto/userspace-tunneling.rst). ferrovs: the encap IP on eth1
#     (its tunnels go over the host stack). br-int is created by ovn-controller.
#   namespace ovl-VM for each VM: eth0 (veth, its peer p-VM a port of br-int with
#     external_ids:iface-id=VM), MTU 1400 (room for Geneve), no transmit offloads.
#   With the OpenFlow trace (default; --no-of-trace), ovn-controller reaches br-int.mgmt
#   through tests/ovn/ofproxy.py (chN/of/br-int.mgmt), which logs every message
#   (chN/oftrace.jsonl); chassis 1's ovn-controller logs its OVSDB JSON-RPC (jsonrpc:dbg).
#
# Nothing outside the lab directory and its namespaces is touched: no system service, no
# /var/run/openvswitch. Needs root, Debian's ovn-central, ovn-host, openvswitch-switch(-dpdk),
# socat, iperf3, ethtool: scripts/deps.sh. ferrovs: `cargo build --release` first
# (FERROVS_BIN_DIR overrides target/release).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/tests/ovn
LAB=${OVNLAB_DIR:-/tmp/ferrovs-ovnlab}
C=$LAB/central
NS_C=ovl-central
VM_MTU=1400
BIN=${FERROVS_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
if [ -z "${OVS_VSWITCHD:-}" ]; then
    OVS_VSWITCHD=/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk
    [ -x "$OVS_VSWITCHD" ] || OVS_VSWITCHD=/usr/sbin/ovs-vswitchd
fi

log() { echo "lab: $*" >&2; }
die() { log "$*"; exit 1; }

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.2 s until it succeeds.
wait_for() {
    local secs=$1 what=$2 end
    shift 2
    end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $end ]; then
            log "timed out after ${secs}s waiting for $what"
            return 1
        fi
        sleep 0.2
    done
}

load_state() {
    [ -f "$LAB/lab.env" ] || die "no lab is up ($LAB/lab.env missing): tests/ovn/lab.sh up"
    # shellcheck source=/dev/null
    . "$LAB/lab.env"
}

nbctl() { ovn-nbctl --db="unix:$C/nb.sock" --timeout=30 "$@"; }
sbctl() { ovn-sbctl --db="unix:$C/sb.sock" --timeout=30 "$@"; }
vsctl() { local n=$1; shift; ovs-vsctl --db="unix:$LAB/ch$n/db.sock" --timeout=30 "$@"; }
appctl() { local n=$1; shift; ovs-appctl -t "$LAB/ch$n/ovs-vswitchd.ctl" "$@"; }
in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
mac_of() { printf '02:31:00:00:00:%02x' $((10 + $1)); }
encap_ip() { echo "172.31.0.$((10 + $1))"; }

add_ns() {
    ip netns add "$1"
    echo "$1" >>"$LAB/netns"
    ip -n "$1" link set lo up
    in_ns "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
}

# start NS PIDFILE LOGFILE COMMAND...: a daemon that does not detach itself, in its own
# session, its pid written by the shell that becomes it.
start() {
    local ns=$1 pidfile=$2 logfile=$3
    shift 3
    if [ -n "$ns" ]; then
        setsid ip netns exec "$ns" bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" \
            </dev/null >>"$logfile" 2>&1 &
    else
        setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" </dev/null >>"$logfile" 2>&1 &
    fi
    wait_for 5 "$pidfile" test -s "$pidfile"
}

# ovs_daemon NS DIR NAME ARGS...: an OVS/OVN daemon that detaches, with its files in DIR.
ovs_daemon() {
    local ns=$1 d=$2 name=$3
    shift 3
    local envs=(env "OVS_RUNDIR=$d" "OVS_LOGDIR=$d" "OVS_DBDIR=$d" "OVN_RUNDIR=$d" "OVN_LOGDIR=$d"
        "OVN_DBDIR=$d")
    local cmd=("${envs[@]}" "$@" --pidfile="$d/$name.pid" --log-file="$d/$name.log"
        --detach --no-chdir)
    # ovn-controller 23.03 has no --unixctl: its socket is OVN_RUNDIR/ovn-controller.PID.ctl.
    [ "$name" = ovn-controller ] || cmd+=(--unixctl="$d/$name.ctl")
    if [ -n "$ns" ]; then in_ns "$ns" "${cmd[@]}"; else "${cmd[@]}"; fi 2>>"$d/start.log" ||
        { tail -n 5 "$d/start.log" "$d/$name.log" >&2 2>/dev/null; return 1; }
}

# ---------------------------------------------------------------- up

central_up() {
    mkdir -p "$C"
    add_ns "$NS_C"
    ip -n "$NS_C" link add ul-br type bridge
    ip -n "$NS_C" link set ul-br up
    ip -n "$NS_C" addr add 172.31.0.1/24 dev ul-br
    ovsdb-tool create "$C/nb.db" /usr/share/ovn/ovn-nb.ovsschema
    ovsdb-tool create "$C/sb.db" /usr/share/ovn/ovn-sb.ovsschema
    ovs_daemon "$NS_C" "$C" nb ovsdb-server "$C/nb.db" --remote="punix:$C/nb.sock"
    ovs_daemon "$NS_C" "$C" sb ovsdb-server "$C/sb.db" --remote="punix:$C/sb.sock" \
        --remote=ptcp:6642:172.31.0.1
    nbctl --no-wait init
    ovs_daemon "$NS_C" "$C" northd ovn-northd --ovnnb-db="unix:$C/nb.sock" \
        --ovnsb-db="unix:$C/sb.sock"
    wait_for 10 "ovn-northd to connect" sbctl get SB_Global . nb_cfg
}

chassis_up() {
    local n=$1 ns=ovl-ch$1 d=$LAB/ch$1 ip mac
    ip=$(encap_ip "$n") mac=$(mac_of "$n")
    mkdir -p "$d/of"
    add_ns "$ns"
    ip -n "$NS_C" link add "ul$n" type veth peer name eth1 netns "$ns"
    ip -n "$NS_C" link set "ul$n" master ul-br up
    ip -n "$ns" link set eth1 address "$mac" up
    # As for the VMs' veths: OVS reads eth1 with AF_PACKET and drops merged (GRO) frames
    # larger than the MTU ("Dropped packet: Too big").
    for f in tx tso gso gro; do
        in_ns "$ns" ethtool -K eth1 "$f" off >/dev/null 2>&1 || true
        in_ns "$NS_C" ethtool -K "ul$n" "$f" off >/dev/null 2>&1 || true
    done

    ovsdb-tool create "$d/conf.db" /usr/share/openvswitch/vswitch.ovsschema
    ovs_daemon "$ns" "$d" ovsdb-server ovsdb-server "$d/conf.db" --remote="punix:$d/db.sock"
    vsctl "$n" --no-wait init
    vsctl "$n" --no-wait set Open_vSwitch . other_config:dpdk-init=false \
        "external_ids:system-id=ch$n" "external_ids:hostname=ch$n" \
        external_ids:ovn-remote=tcp:172.31.0.1:6642 external_ids:ovn-encap-type=geneve \
        "external_ids:ovn-encap-ip=$ip" external_ids:ovn-bridge-datapath-type=netdev

    case $SWITCH in
    ovs)
        ovs_daemon "$ns" "$d" ovs-vswitchd "$OVS_VSWITCHD" "unix:$d/db.sock"
        vsctl "$n" add-br br-phy -- set Bridge br-phy datapath_type=netdev \
            fail_mode=standalone "other_config:hwaddr=$mac" -- add-port br-phy eth1
        ip -n "$ns" link set br-phy up
        ip -n "$ns" addr add "$ip/24" dev br-phy
        # OVS caches the kernel's routes; the tunnel's route must say dev br-phy.
        if ! wait_for 5 "OVS's route to the underlay" \
            bash -c "ovs-appctl -t $d/ovs-vswitchd.ctl ovs/route/lookup 172.31.0.1 | grep -q br-phy"; then
            appctl "$n" ovs/route/add 172.31.0.0/24 br-phy
        fi
        ;;
    ferrovs)
        [ -x "$BIN/ferrovsd" ] || die "no $BIN/ferrovsd: cargo build --release"
        ip -n "$ns" addr add "$ip/24" dev eth1
        start "$ns" "$d/ferrovsd.pid" "$d/ferrovsd.log" env "FERROVS_RUN_DIR=$d" \
            "$BIN/ferrovsd" --ovsdb "unix:$d/db.sock" --run-dir "$d" \
            --pmd-cores $(((n - 1) % $(nproc))) --log-level info
        wait_for 10 "ferrovsd to answer" "$BIN/ferrovs" --run-dir "$d" show
        ;;
    esac
    wait_for 10 "chassis $n to reach the central node" in_ns "$ns" ping -c 1 -W 1 172.31.0.1

    # ovn-controller; its OpenFlow connections through the tracing proxy when asked.
    local rundir=$d
    if [ "$OF_TRACE" = 1 ]; then
        start "" "$d/ofproxy.pid" "$d/ofproxy.log" python3 "$HERE/ofproxy.py" \
            "$d/of/br-int.mgmt" "$d/br-int.mgmt" "$d/oftrace.jsonl"
        wait_for 5 "the OpenFlow proxy" test -S "$d/of/br-int.mgmt"
        rundir=$d/of
    fi
    local dbg=()
    [ "$n" = 1 ] && dbg=(-vjsonrpc:file:dbg)
    ovs_daemon "$ns" "$d" ovn-controller env "OVS_RUNDIR=$rundir" ovn-controller \
        "unix:$d/db.sock" "${dbg[@]}"
    wait_for 20 "chassis ch$n in the southbound database" \
        bash -c "[ -n \"\$(ovn-sbctl --db=unix:$C/sb.sock --bare --columns=name find Chassis name=ch$n)\" ]"
    wait_for 20 "br-int on chassis $n" vsctl "$n" br-exists br-int
}

# For OVS: the peers' MACs in each chassis's tunnel ARP table (OVS would also learn them by
# ARPing itself; set, the first packets are not lost to it).
tunnel_arp() {
    local n m
    for n in $(seq "$NCH"); do
        for m in $(seq "$NCH"); do
            [ "$n" = "$m" ] || appctl "$n" tnl/arp/set br-phy "$(encap_ip "$m")" "$(mac_of "$m")" >/dev/null
        done
    done
}

tunnels_up() {
    local n want=$((NCH - 1))
    for n in $(seq "$NCH"); do
        wait_for 20 "chassis $n's $want Geneve tunnel(s) with an OpenFlow port" bash -c \
            "[ \$(ovs-vsctl --db=unix:$LAB/ch$n/db.sock --bare --columns=ofport find Interface type=geneve | grep -c '^[1-9]') -ge $want ]" ||
            { vsctl "$n" --columns=name,type,options,ofport,error list Interface >&2 || true; return 1; }
    done
}

do_up() {
    local sw=ovs nch=2 oftrace=1
    while [ $# -gt 0 ]; do
        case $1 in
        --switch) sw=$2; shift 2 ;;
        --chassis) nch=$2; shift 2 ;;
        --no-of-trace) oftrace=0; shift ;;
        *) die "up: unknown argument '$1'" ;;
        esac
    done
    case $sw in ovs | ferrovs) ;; *) die "--switch: ovs or ferrovs" ;; esac
    [ "$nch" -ge 2 ] && [ "$nch" -le 9 ] || die "--chassis: 2 to 9"
    [ "$(id -u)" = 0 ] || die "needs root"
    for t in ovn-northd ovn-controller ovn-nbctl ovsdb-server socat iperf3 ethtool; do
        command -v "$t" >/dev/null || die "no $t: scripts/deps.sh"
    done
    [ -f "$LAB/lab.env" ] && die "a lab is up in $LAB: tests/ovn/lab.sh down"
    rm -rf "$LAB"
    mkdir -p "$LAB/flows"
    SWITCH=$sw NCH=$nch OF_TRACE=$oftrace
    printf 'SWITCH=%s\nNCH=%s\nOF_TRACE=%s\n' "$sw" "$nch" "$oftrace" >"$LAB/lab.env"
    trap 'rc=$?; if [ $rc != 0 ]; then log "up failed: taking the lab down (logs kept in $LAB)"; do_down --keep-logs; fi' EXIT
    log "central node"
    central_up
    local n
    for n in $(seq "$nch"); do
        log "chassis $n ($sw)"
        chassis_up "$n"
    done
    if [ "$sw" = ovs ]; then
        tunnel_arp
        tunnels_up
    elif ! tunnels_up; then
        log "ferrovs: the Geneve tunnels did not come up (see chN/ferrovsd.log); the lab stays up"
    fi
    trap - EXIT
    log "up: $nch chassis with $sw in $LAB"
}

# ---------------------------------------------------------------- down

# alive PID: running, not a zombie (the daemons' parent is init, which may reap late).
alive() { [ -r "/proc/$1/stat" ] && [ "$(sed -E 's/.*\) (.).*/\1/' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

do_down() {
    local keep=0
    [ "${1:-}" = --keep-logs ] && keep=1
    [ -d "$LAB" ] || return 0
    local f p i
    # ovn-controller first (it would otherwise see its switch go), then the switches and
    # proxies, then the databases and the central node.
    for f in "$LAB"/ch*/ovn-controller.pid "$LAB"/ch*/ferrovsd.pid "$LAB"/ch*/ovs-vswitchd.pid \
        "$LAB"/ch*/ofproxy.pid "$LAB"/ch*/ovsdb-server.pid "$C"/northd.pid "$C"/sb.pid "$C"/nb.pid \
        "$LAB"/vm-*.pid; do
        [ -s "$f" ] || continue
        p=$(cat "$f")
        kill "$p" 2>/dev/null || true
        for i in $(seq 50); do alive "$p" || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
        rm -f "$f"
    done
    # A ferrovsd of the lab that its pid file does not name (a hot upgrade's new daemon
    # started outside switch_upgrade) would outlive the lab and fight the next one's for its
    # database's rows: every daemon whose run directory is the lab's goes.
    pkill -f "ferrovsd .*--run-dir $LAB/ch[0-9]" 2>/dev/null || true
    if [ -f "$LAB/netns" ]; then
        # VMs' namespaces go first: deleting one takes its veth pair with it.
        tac "$LAB/netns" | while read -r ns; do ip netns del "$ns" 2>/dev/null || true; done
        rm -f "$LAB/netns"
    fi
    rm -f "$LAB/lab.env"
    if [ $keep = 1 ]; then
        log "down; logs kept in $LAB"
    else
        rm -rf "$LAB"
        log "down"
    fi
}

# ---------------------------------------------------------------- VMs and checks

# vm_add CHASSIS NAME MAC IP/PLEN|- [GATEWAY]: a namespace ovl-NAME whose eth0 is a veth to
# port p-NAME of br-int on the chassis, bound to logical port NAME ("-": no address yet).
vm_add() {
    local n=$1 name=$2 mac=$3 addr=$4 gw=${5:-} ns=ovl-$2 port=p-$2 f
    add_ns "$ns"
    ip -n "ovl-ch$n" link add "$port" type veth peer name eth0 netns "$ns"
    ip -n "$ns" link set eth0 address "$mac" mtu $VM_MTU up
    [ "$addr" = - ] || ip -n "$ns" addr add "$addr" dev eth0
    [ -z "$gw" ] || ip -n "$ns" route add default via "$gw"
    ip -n "ovl-ch$n" link set "$port" mtu $VM_MTU up
    # The switches read the veths with AF_PACKET: full-sized frames with complete checksums.
    for f in tx tso gso gro; do
        in_ns "$ns" ethtool -K eth0 "$f" off >/dev/null 2>&1 || true
        in_ns "ovl-ch$n" ethtool -K "$port" "$f" off >/dev/null 2>&1 || true
    done
    vsctl "$n" add-port br-int "$port" -- set Interface "$port" "external_ids:iface-id=$name"
    echo "$n $name" >>"$LAB/vms"
}

vm_del_all() {
    [ -f "$LAB/vms" ] || return 0
    local n name
    while read -r n name; do
        vsctl "$n" --if-exists del-port br-int "p-$name" </dev/null || true
        # The veth pair goes now (a namespace's devices go some time after `ip netns del`,
        # and the next scenario's VM of the same name needs the names).
        ip -n "ovl-ch$n" link del "p-$name" </dev/null 2>/dev/null || true
        ip netns del "ovl-$name" </dev/null 2>/dev/null || true
        sed -i "/^ovl-$name\$/d" "$LAB/netns"
    done <"$LAB/vms"
    rm -f "$LAB/vms"
}

# ports_up PORT...: the logical ports bound and up, and every chassis caught up. When not,
# the scenario's later checks are not run (NOT_UP).
ports_up() {
    local p
    for p in "$@"; do
        wait_for 30 "logical port $p up" nbctl wait-until Logical_Switch_Port "$p" up=true ||
            { NOT_UP=1; return 1; }
    done
    timeout 30 ovn-nbctl --db="unix:$C/nb.sock" --wait=hv sync ||
        { log "ovn-nbctl --wait=hv sync did not return in 30 s"; NOT_UP=1; return 1; }
}

PASS=0 FAIL=0 FAILED=()
# check WHAT COMMAND...: one PASS or FAIL line. Once a scenario's ports did not come up
# (NOT_UP=1, set by run_scenario's first check), its traffic checks fail at once instead of
# each waiting for its timeout.
NOT_UP=0
check() {
    local what=$1
    shift
    if [ $NOT_UP = 1 ]; then
        FAIL=$((FAIL + 1))
        FAILED+=("$what")
        echo "FAIL $what (not run: the logical ports are not up)"
        return 0
    fi
    if "$@" >"$LAB/check.out" 2>&1; then
        PASS=$((PASS + 1))
        echo "PASS $what"
    else
        FAIL=$((FAIL + 1))
        FAILED+=("$what")
        echo "FAIL $what"
        sed 's/^/    /' "$LAB/check.out" | tail -8
    fi
}

# ping_ok SRC DST_IP: a first reply within 10 s, then 5 of 5.
ping_ok() {
    wait_for 10 "a first reply from $2" in_ns "ovl-$1" ping -c 1 -W 1 "$2" || return 1
    in_ns "ovl-$1" ping -c 5 -i 0.2 -W 2 -q "$2"
}
ping_blocked() { ! in_ns "ovl-$1" ping -c 3 -i 0.3 -W 1 -q "$2"; }

listening() { [ -n "$(in_ns "ovl-$1" ss -Hltn "sport = :$2")" ]; }

# tcp_ok SRC DST DST_IP [PORT]: 1 MiB through a TCP connection and back (socat echoing
# with cat).
tcp_ok() {
    local src=$1 dst=$2 ip=$3 port=${4:-$((20000 + RANDOM % 10000))} pid rc=0
    head -c 1048576 /dev/urandom >"$LAB/tcp.in"
    in_ns "ovl-$dst" timeout 30 socat -T 10 "TCP-LISTEN:$port,reuseaddr" EXEC:cat &
    pid=$!
    wait_for 5 "the listener" listening "$dst" "$port" || return 1
    in_ns "ovl-$src" timeout 20 socat -t 5 -T 10 - "TCP:$ip:$port,connect-timeout=5" \
        <"$LAB/tcp.in" >"$LAB/tcp.out" || rc=$?
    wait $pid 2>/dev/null || true
    [ $rc = 0 ] || { echo "socat client exit $rc"; return 1; }
    cmp "$LAB/tcp.in" "$LAB/tcp.out"
}

# tcp_blocked SRC DST DST_IP [PORT]: with a listener there, no connection within 3 s.
tcp_blocked() {
    local src=$1 dst=$2 ip=$3 port=${4:-$((20000 + RANDOM % 10000))} pid rc=0
    in_ns "ovl-$dst" timeout 10 socat -T 5 "TCP-LISTEN:$port,reuseaddr" EXEC:cat &
    pid=$!
    wait_for 5 "the listener" listening "$dst" "$port" || return 1
    echo hello | in_ns "ovl-$src" timeout 5 socat -T 3 - "TCP:$ip:$port,connect-timeout=3" || rc=$?
    kill $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
    [ $rc != 0 ]
}

# iperf SRC DST DST_IP: 2 s of TCP; prints Mbit/s (information, not a check).
iperf() {
    local src=$1 dst=$2 ip=$3 pid out
    [ $NOT_UP = 0 ] || return 0
    in_ns "ovl-$dst" timeout 15 iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
    pid=$!
    wait_for 5 "iperf3 server" listening "$dst" 5201 || return 0
    out=$(in_ns "ovl-$src" timeout 10 iperf3 -c "$ip" -p 5201 -t 2 -J 2>/dev/null |
        python3 -c 'import json,sys; print("%.0f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e6))' 2>/dev/null) || out=""
    wait $pid 2>/dev/null || true
    echo "INFO iperf3 $src -> $dst: ${out:-no result} Mbit/s ($SWITCH)"
}

# The flows (and groups, meters) every chassis's br-int has now, for the inventory.
dump_flows() {
    local s=$1 n d ver
    for n in $(seq "$NCH"); do
        d=$LAB/ch$n
        for ver in OpenFlow15 OpenFlow13; do
            if ovs-ofctl -O $ver dump-flows "unix:$d/br-int.mgmt" >"$LAB/flows/s$s-ch$n.flows" 2>"$LAB/flows/s$s-ch$n.err"; then
                ovs-ofctl -O $ver dump-groups "unix:$d/br-int.mgmt" >"$LAB/flows/s$s-ch$n.groups" 2>&1 || true
                ovs-ofctl -O $ver dump-meters "unix:$d/br-int.mgmt" >"$LAB/flows/s$s-ch$n.meters" 2>&1 || true
                break
            fi
        done
    done
}

# ---------------------------------------------------------------- scenarios

lsp() { # SWITCH PORT MAC IP
    nbctl lsp-add "$1" "$2" -- lsp-set-addresses "$2" "$3 $4"
}

scenario_1() {
    nbctl ls-add ls1
    lsp ls1 vm1 0a:00:00:00:01:01 10.0.1.11
    lsp ls1 vm2 0a:00:00:00:01:02 10.0.1.12
    vm_add 1 vm1 0a:00:00:00:01:01 10.0.1.11/24
    vm_add 2 vm2 0a:00:00:00:01:02 10.0.1.12/24
    check "s1: logical ports vm1 (ch1) and vm2 (ch2) bound and up" ports_up vm1 vm2
    check "s1: ping vm1 -> vm2 across chassis" ping_ok vm1 10.0.1.12
    check "s1: ping vm2 -> vm1 across chassis" ping_ok vm2 10.0.1.11
    check "s1: TCP vm1 -> vm2 (1 MiB echoed)" tcp_ok vm1 vm2 10.0.1.12
    check "s1: TCP vm2 -> vm1 (1 MiB echoed)" tcp_ok vm2 vm1 10.0.1.11
    iperf vm1 vm2 10.0.1.12
}
cleanup_1() { nbctl --if-exists ls-del ls1; }

scenario_2() {
    nbctl ls-add ls1 -- ls-add ls2 -- lr-add lr1
    nbctl lrp-add lr1 lr1-ls1 0a:00:00:00:ff:01 10.0.1.1/24
    nbctl lrp-add lr1 lr1-ls2 0a:00:00:00:ff:02 10.0.2.1/24
    local s
    for s in 1 2; do
        nbctl lsp-add "ls$s" "ls$s-lr1" -- lsp-set-type "ls$s-lr1" router \
            -- lsp-set-addresses "ls$s-lr1" router -- lsp-set-options "ls$s-lr1" "router-port=lr1-ls$s"
    done
    lsp ls1 vm1 0a:00:00:00:01:01 10.0.1.11
    lsp ls2 vm3 0a:00:00:00:02:03 10.0.2.13
    vm_add 1 vm1 0a:00:00:00:01:01 10.0.1.11/24 10.0.1.1
    vm_add 2 vm3 0a:00:00:00:02:03 10.0.2.13/24 10.0.2.1
    check "s2: logical ports vm1 (ch1, ls1) and vm3 (ch2, ls2) bound and up" ports_up vm1 vm3
    check "s2: ping vm1 -> its router port 10.0.1.1" ping_ok vm1 10.0.1.1
    check "s2: ping vm1 -> vm3 through the router, across chassis" ping_ok vm1 10.0.2.13
    check "s2: ping vm3 -> vm1 through the router, across chassis" ping_ok vm3 10.0.1.11
    check "s2: TCP vm1 -> vm3 through the router (1 MiB echoed)" tcp_ok vm1 vm3 10.0.2.13
}
cleanup_2() { nbctl --if-exists lr-del lr1 -- --if-exists ls-del ls1 -- --if-exists ls-del ls2; }

scenario_3() {
    nbctl ls-add ls1
    lsp ls1 vm1 0a:00:00:00:01:01 10.0.1.11
    lsp ls1 vm2 0a:00:00:00:01:02 10.0.1.12
    nbctl acl-add ls1 to-lport 1000 'outport == "vm2" && ip4.src == 10.0.1.11' allow-related
    nbctl acl-add ls1 to-lport 900 'outport == "vm2" && ip4' drop
    nbctl acl-add ls1 to-lport 900 'outport == "vm1" && ip4' drop
    vm_add 1 vm1 0a:00:00:00:01:01 10.0.1.11/24
    vm_add 2 vm2 0a:00:00:00:01:02 10.0.1.12/24
    check "s3: logical ports vm1 and vm2 bound and up" ports_up vm1 vm2
    check "s3: ping vm1 -> vm2 allowed (allow-related; replies pass)" ping_ok vm1 10.0.1.12
    check "s3: TCP vm1 -> vm2 allowed (1 MiB echoed)" tcp_ok vm1 vm2 10.0.1.12
    check "s3: ping vm2 -> vm1 dropped (drop default)" ping_blocked vm2 10.0.1.11
    check "s3: TCP vm2 -> vm1 dropped (drop default)" tcp_blocked vm2 vm1 10.0.1.11
}
cleanup_3() { nbctl --if-exists ls-del ls1; }

# conj_flows N: chassis N's br-int holds conjunctive flows (soft ones and their conj_id).
conj_flows() {
    local f=$LAB/conj-ch$1.flows
    ovs-ofctl -O OpenFlow15 dump-flows "unix:$LAB/ch$1/br-int.mgmt" >"$f" 2>&1 || { cat "$f"; return 1; }
    echo "$(grep -c 'conjunction(' "$f") soft flows, $(grep -c 'conj_id=' "$f") conj_id flows on ch$1"
    grep -q 'conjunction(' "$f" && grep -q 'conj_id=' "$f"
}

# ACLs over an address set and a port group of several ports: ovn-northd and
# ovn-controller compile them into conjunctive flows (`conjunction(id,k/n)`, `conj_id`).
scenario_8() {
    nbctl ls-add ls1
    lsp ls1 vm1 0a:00:00:00:01:01 10.0.1.11
    lsp ls1 vm2 0a:00:00:00:01:02 10.0.1.12
    lsp ls1 vm3 0a:00:00:00:01:03 10.0.1.13
    lsp ls1 vm4 0a:00:00:00:01:04 10.0.1.14
    nbctl create Address_Set name=as_web 'addresses="10.0.1.11","10.0.1.14"' >/dev/null
    nbctl pg-add pg_srv vm2 vm3
    nbctl acl-add pg_srv to-lport 1000 \
        'outport == @pg_srv && ip4.src == $as_web && tcp.dst == {5001, 5002}' allow-related
    nbctl acl-add pg_srv to-lport 1000 'outport == @pg_srv && arp' allow
    nbctl acl-add pg_srv to-lport 900 'outport == @pg_srv && ip4' drop
    vm_add 1 vm1 0a:00:00:00:01:01 10.0.1.11/24
    vm_add 2 vm2 0a:00:00:00:01:02 10.0.1.12/24
    vm_add 1 vm3 0a:00:00:00:01:03 10.0.1.13/24
    vm_add 2 vm4 0a:00:00:00:01:04 10.0.1.14/24
    check "s8: logical ports vm1..vm4 bound and up" ports_up vm1 vm2 vm3 vm4
    nbctl --wait=hv sync
    check "s8: conjunctive flows installed on ch1" conj_flows 1
    check "s8: conjunctive flows installed on ch2" conj_flows 2
    check "s8: TCP vm1 -> vm2:5001 allowed (address set x port set)" tcp_ok vm1 vm2 10.0.1.12 5001
    check "s8: TCP vm4 -> vm3:5002 allowed (across chassis)" tcp_ok vm4 vm3 10.0.1.13 5002
    check "s8: TCP vm4 -> vm2:5002 allowed (same chassis)" tcp_ok vm4 vm2 10.0.1.12 5002
    check "s8: TCP vm1 -> vm2:5003 dropped (port not in the set)" tcp_blocked vm1 vm2 10.0.1.12 5003
    check "s8: TCP vm3 -> vm2:5001 dropped (source not in the address set)" tcp_blocked vm3 vm2 10.0.1.12 5001
    check "s8: ping vm1 -> vm2 dropped (drop below)" ping_blocked vm1 10.0.1.12
    check "s8: ping vm2 -> vm1 allowed (vm1 not in the port group)" ping_ok vm2 10.0.1.11
}
cleanup_8() {
    # (OVN 23.03's pg-del has no --if-exists.)
    if [ -n "$(nbctl --bare --columns=_uuid find Port_Group name=pg_srv)" ]; then
        nbctl pg-del pg_srv
    fi
    nbctl --if-exists ls-del ls1
    nbctl --if-exists destroy Address_Set as_web 2>/dev/null ||
        nbctl -- --if-exists destroy Address_Set "$(nbctl --bare --columns=_uuid find Address_Set name=as_web)" 2>/dev/null || true
}

# dhcp_ok VM IP ROUTER: busybox udhcpc in the VM gets IP and ROUTER from OVN, and the VM
# takes the address.
dhcp_ok() {
    local vm=$1 want=$2 router=$3 script=$LAB/udhcpc.sh
    printf '#!/bin/sh\n[ "$1" = bound ] && echo "BOUND ip=$ip mask=$mask router=$router" || true\n' >"$script"
    chmod +x "$script"
    in_ns "ovl-$vm" timeout 30 busybox udhcpc -f -q -n -i eth0 -t 10 -T 1 -s "$script" >"$LAB/dhcp.out" 2>&1 ||
        { cat "$LAB/dhcp.out"; return 1; }
    cat "$LAB/dhcp.out"
    grep -q "BOUND ip=$want mask=24 router=$router" "$LAB/dhcp.out" || return 1
    ip -n "ovl-$vm" addr add "$want/24" dev eth0
}

scenario_4() {
    nbctl ls-add ls1
    lsp ls1 vm1 0a:00:00:00:01:01 10.0.1.11
    lsp ls1 vm2 0a:00:00:00:01:02 10.0.1.12
    local opts
    nbctl dhcp-options-create 10.0.1.0/24
    opts=$(nbctl --bare --columns=_uuid find DHCP_Options cidr=10.0.1.0/24)
    nbctl dhcp-options-set-options "$opts" lease_time=3600 router=10.0.1.1 \
        server_id=10.0.1.1 server_mac=0a:00:00:00:ff:01
    nbctl lsp-set-dhcpv4-options vm1 "$opts"
    vm_add 1 vm1 0a:00:00:00:01:01 -
    vm_add 2 vm2 0a:00:00:00:01:02 10.0.1.12/24
    check "s4: logical ports vm1 and vm2 bound and up" ports_up vm1 vm2
    check "s4: vm1 gets 10.0.1.11/24, router 10.0.1.1 from OVN's DHCP (pinctrl)" dhcp_ok vm1 10.0.1.11 10.0.1.1
    check "s4: ping vm1 -> vm2 with the leased address" ping_ok vm1 10.0.1.12
}
cleanup_4() {
    nbctl --if-exists ls-del ls1
    local u
    for u in $(nbctl --bare --columns=_uuid list DHCP_Options); do nbctl dhcp-options-del "$u"; done
}

# ---------------------------------------------------------------- QEMU guests

# guest_add CHASSIS NAME MAC IP/PLEN ARGS: a QEMU guest (TCG; the e2e tests' image: busybox,
# the host's kernel, tests/e2e/guest) whose virtio-net NIC is bound to logical port NAME, with
# its console commands on LAB/NAME.serial and its log in LAB/NAME.console. ARGS: more of the
# guest's kernel command line (ferrovs.cmd=..., see tests/e2e/guest/build-initramfs.sh).
# The NIC: with ferrovs a vhost-user port (dpdkvhostuserclient, QEMU the socket's server: a
# cloud host's usual attachment); with OVS a TAP made by QEMU in the chassis's namespace and
# added to br-int as a system port (this OVS's netdev datapath runs without DPDK here, so no
# vhost-user: a TAP is how libvirt attaches a guest to it). The TAP has no virtio-net
# header (vnet_hdr=off), so the guest is offered no TSO: OVS 3.1's userspace datapath reads
# the TAP with AF_PACKET and has no use for 64 KiB segments (userspace TSO is off).
guest_add() {
    local n=$1 name=$2 mac=$3 addr=$4 args=$5 img=$ROOT/target/guest nic port
    bash "$ROOT/tests/e2e/guest/build-initramfs.sh" "$img" >/dev/null
    if [ "$SWITCH" = ferrovs ]; then
        port=vhu-$name
        nic=(-chardev "socket,id=c0,path=$LAB/ch$n/$name.sock,server=on,wait=off"
            -netdev vhost-user,id=n0,chardev=c0)
    else
        port=tap-$name
        nic=(-netdev "tap,id=n0,ifname=$port,script=no,downscript=no,vnet_hdr=off")
    fi
    local q=(qemu-system-x86_64 -accel tcg -m 262152k -smp 1 -nographic -nodefaults -no-reboot
        -chardev "socket,id=con,path=$LAB/$name.serial,server=on,wait=off,logfile=$LAB/$name.console"
        -serial chardev:con -kernel "$img/vmlinuz" -initrd "$img/initramfs.gz"
        -append "console=ttyS0 quiet ferrovs.ip=$addr ferrovs.mtu=$VM_MTU $args"
        -object memory-backend-memfd,id=mem,size=268443648,share=on -numa node,memdev=mem
        "${nic[@]}" -device "virtio-net-pci,netdev=n0,mac=$mac,vectors=0")
    start "ovl-ch$n" "$LAB/vm-$name.pid" "$LAB/$name.qemu.log" "${q[@]}"
    if [ "$SWITCH" = ferrovs ]; then
        wait_for 10 "$name's vhost-user socket" test -S "$LAB/ch$n/$name.sock"
        vsctl "$n" add-port br-int "$port" -- set Interface "$port" type=dpdkvhostuserclient \
            "options:vhost-server-path=$LAB/ch$n/$name.sock" "external_ids:iface-id=$name"
    else
        wait_for 10 "$name's TAP" ip -n "ovl-ch$n" link show "$port"
        ip -n "ovl-ch$n" link set "$port" mtu $VM_MTU up
        vsctl "$n" add-port br-int "$port" -- set Interface "$port" "external_ids:iface-id=$name"
    fi
}

# guest_says NAME TEXT SECONDS: TEXT appears on the guest's console within SECONDS.
guest_says() {
    wait_for "$3" "'$2' from guest $1" grep -aq -- "$2" "$LAB/$1.console" ||
        { tail -n 15 "$LAB/$1.console"; return 1; }
}

# guest_cmd NAME COMMAND: a line to the guest's console (its /init's control loop).
guest_cmd() { echo "$2" | socat -t 1 - "UNIX-CONNECT:$LAB/$1.serial"; }

# guest_ping SRC DST_IP: the guest pings (5, 0.2 s apart) and says FERROVS-PING-OK.
guest_ping() {
    local before
    before=$(grep -ac 'FERROVS-PING-' "$LAB/$1.console" || true)
    guest_cmd "$1" "ping $2 5"
    wait_for 30 "guest $1's ping" test "$(grep -ac 'FERROVS-PING-' "$LAB/$1.console")" -gt "$before"
    grep -a 'FERROVS-PING-' "$LAB/$1.console" | tail -n 1 | grep -q 'FERROVS-PING-OK' ||
        { tail -n 12 "$LAB/$1.console"; return 1; }
}

# guest_tcp SRC DST DST_IP: 2 s of TCP from guest SRC to the receiver guest DST runs
# (tcp-recv on port 5001, started at boot): both report, the bytes agree and are more than 1 MB.
guest_tcp() {
    guest_cmd "$1" "tool tcp-send,$3,5001,2"
    guest_says "$2" FERROVS-RESULT 60 || return 1
    local got
    got=$(grep -a FERROVS-RESULT "$LAB/$2.console" | tail -n 1)
    echo "$2: $got"
    echo "$got" | grep -Eq 'bytes[^0-9]*[0-9]{7,}'
}

scenario_6() {
    nbctl ls-add ls1
    lsp ls1 g1 0a:00:00:00:06:01 10.0.1.21
    lsp ls1 g2 0a:00:00:00:06:02 10.0.1.22
    guest_add 1 g1 0a:00:00:00:06:01 10.0.1.21/24 \
        "ferrovs.cmd=tool ferrovs.control=1 ferrovs.args=sleep,0"
    guest_add 2 g2 0a:00:00:00:06:02 10.0.1.22/24 \
        "ferrovs.cmd=tool ferrovs.control=1 ferrovs.args=bg,tcp-recv,5001"
    check "s6: QEMU guests g1 (ch1) and g2 (ch2) booted" guest_says g1 FERROVS-GUEST-READY 120
    check "s6: logical ports g1 and g2 bound and up" ports_up g1 g2
    check "s6: guest g2 listening" guest_says g2 FERROVS-LISTENING 60
    check "s6: ping g1 -> g2 across chassis (from the guest)" guest_ping g1 10.0.1.22
    check "s6: ping g2 -> g1 across chassis (from the guest)" guest_ping g2 10.0.1.21
    check "s6: TCP g1 -> g2 across chassis for 2 s (guest to guest)" guest_tcp g1 g2 10.0.1.22
}
cleanup_6() {
    local g p
    for g in g1 g2; do
        p=$(cat "$LAB/vm-$g.pid" 2>/dev/null) || continue
        kill "$p" 2>/dev/null || true
        rm -f "$LAB/vm-$g.pid"
    done
    local n
    for n in 1 2; do
        vsctl "$n" --if-exists del-port br-int vhu-g$n -- --if-exists del-port br-int tap-g$n \
            >/dev/null 2>&1 || true
    done
    nbctl --if-exists ls-del ls1
}

# ---------------------------------------------------------------- an upgrade under OVN

# of_connects N: how many times chassis N's ovn-controller has connected to br-int.mgmt.
of_connects() { grep -ac 'br-int.mgmt: connected' "$LAB/ch$1/ovn-controller.log" || true; }

# switch_upgrade N: ferrovs: a hot upgrade of chassis N's ferrovsd (the same binary: what an
# upgrade to a new version does; ports, flows, conntrack and OpenFlow connections handed
# over). OVS: what a package upgrade does with ovs-vswitchd, as `ovs-ctl restart`: exit, start
# again on the same database, the underlay address put back on br-phy (its TAP went with
# the process).
switch_upgrade() {
    local n=$1 d=$LAB/ch$1
    if [ "$SWITCH" = ferrovs ]; then
        in_ns "ovl-ch$n" "$BIN/ferrovs" --run-dir "$d" upgrade --json >"$d/upgrade.json" || return 1
        # The new daemon's pid, for `down`.
        "$BIN/ferrovs" --run-dir "$d" show --json | jq -r .pid >"$d/ferrovsd.pid"
    else
        local old
        old=$(cat "$d/ovs-vswitchd.pid")
        appctl "$n" exit || true
        wait_for 10 "ovs-vswitchd to exit" bash -c "! kill -0 $old 2>/dev/null"
        ovs_daemon "ovl-ch$n" "$d" ovs-vswitchd "$OVS_VSWITCHD" "unix:$d/db.sock"
        wait_for 10 "br-phy again" ip -n "ovl-ch$n" link show br-phy
        ip -n "ovl-ch$n" link set br-phy up
        ip -n "ovl-ch$n" addr replace "$(encap_ip "$n")/24" dev br-phy
        appctl "$n" ovs/route/add 172.31.0.0/24 br-phy >/dev/null 2>&1 || true
    fi
}

# flow_count N: the rules on chassis N's br-int.
flow_count() {
    ovs-ofctl -O OpenFlow15 dump-flows "unix:$LAB/ch$1/br-int.mgmt" --no-stats 2>/dev/null |
        grep -vc 'NXST_FLOW\|OFPST_FLOW' || true
}

# stream_across_upgrade: 10 s of iperf3 TCP vm1 (ch1) -> vm2 (ch2); after 3 s chassis 1's
# switch is upgraded. The stream must end normally (no reset, no stall that kills it) and
# carry data in its last seconds. Leaves the flow and connection counts before/after in LAB.
stream_across_upgrade() {
    local pid cli rc=0 out
    flow_count 1 >"$LAB/flows.before"
    of_connects 1 >"$LAB/connects.before"
    in_ns ovl-vm2 timeout 30 iperf3 -s -1 -p 5203 >/dev/null 2>&1 &
    pid=$!
    wait_for 5 "iperf3 server" listening vm2 5203 || return 1
    in_ns ovl-vm1 timeout 25 iperf3 -c 10.0.1.12 -p 5203 -t 10 -i 1 -J >"$LAB/stream.json" 2>&1 &
    cli=$!
    sleep 3
    switch_upgrade 1 || { echo "the upgrade failed"; rc=1; }
    wait $cli || rc=$?
    wait $pid 2>/dev/null || true
    sleep 2
    flow_count 1 >"$LAB/flows.after"
    of_connects 1 >"$LAB/connects.after"
    out=$(jq -r '[.intervals[].sum.bytes] | map(tostring) | join(" ")' "$LAB/stream.json" 2>/dev/null) || out=
    echo "bytes per second: $out"
    echo "flows on ch1 before/after: $(cat "$LAB/flows.before")/$(cat "$LAB/flows.after")"
    [ $rc = 0 ] || { jq -r .error "$LAB/stream.json" 2>/dev/null; return 1; }
    jq -e '[.intervals[-3:][].sum.bytes] | min > 0' "$LAB/stream.json" >/dev/null
}

no_reconnect() {
    echo "ovn-controller's connections to br-int.mgmt: $(cat "$LAB/connects.before") before, $(cat "$LAB/connects.after") after"
    [ "$(cat "$LAB/connects.before")" = "$(cat "$LAB/connects.after")" ]
}

same_flows() {
    echo "flows on ch1 before/after: $(cat "$LAB/flows.before")/$(cat "$LAB/flows.after")"
    [ "$(cat "$LAB/flows.before")" = "$(cat "$LAB/flows.after")" ] && [ "$(cat "$LAB/flows.after")" -gt 0 ]
}

scenario_7() {
    nbctl ls-add ls1
    lsp ls1 vm1 0a:00:00:00:01:01 10.0.1.11
    lsp ls1 vm2 0a:00:00:00:01:02 10.0.1.12
    vm_add 1 vm1 0a:00:00:00:01:01 10.0.1.11/24
    vm_add 2 vm2 0a:00:00:00:01:02 10.0.1.12/24
    check "s7: logical ports vm1 (ch1) and vm2 (ch2) bound and up" ports_up vm1 vm2
    check "s7: ping vm1 -> vm2" ping_ok vm1 10.0.1.12
    if [ "$SWITCH" = ferrovs ]; then
        check "s7: a TCP stream vm1 -> vm2 goes on across an upgrade of chassis 1's switch" stream_across_upgrade
        check "s7: ovn-controller kept its OpenFlow connections (no reconnect)" no_reconnect
        check "s7: chassis 1 has the same flows after the upgrade" same_flows
    else
        # The reference: ovs-vswitchd restarted, which OVS does not promise a stream
        # survives (it did on a quiet machine, not always under load); ovn-controller
        # reconnects and installs every flow again. Reported, not checked.
        if stream_across_upgrade >"$LAB/check.out" 2>&1; then
            echo "INFO s7 (ovs): the TCP stream went on across the restart"
        else
            echo "INFO s7 (ovs): the TCP stream did not survive the restart: $(tail -n 2 "$LAB/check.out" | tr '\n' ' ')"
        fi
        echo "INFO s7 (ovs): $(no_reconnect | tail -n 1); flows before/after $(cat "$LAB/flows.before")/$(cat "$LAB/flows.after")"
    fi
    check "s7: ping vm2 -> vm1 after the upgrade" ping_ok vm2 10.0.1.11
}
cleanup_7() { nbctl --if-exists ls-del ls1; }
# The load balancer's servers and client (python3, standard library). lbserver.py NAME
# PORT answers every line of every connection with NAME. lbclient.py IP PORT spread N: N
# connections, one request each, prints each answer; session N: one connection, N requests
# 0.1 s apart, prints each answer.
lb_scripts() {
    cat >"$LAB/lbserver.py" <<'PY'
import socketserver, sys
name, port = sys.argv[1], int(sys.argv[2])
class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        for _ in self.rfile:
            self.wfile.write((name + "\n").encode())
            self.wfile.flush()
class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
Server(("0.0.0.0", port), Handler).serve_forever()
PY
    cat >"$LAB/lbclient.py" <<'PY'
import socket, sys, time
ip, port, mode, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
def ask(f, s):
    s.sendall(b"who\n")
    line = f.readline().decode().strip()
    print(line or "(no answer)", flush=True)
    return bool(line)
ok = True
if mode == "spread":
    for _ in range(n):
        try:
            with socket.create_connection((ip, port), timeout=5) as s:
                ok = ask(s.makefile("rb"), s) and ok
        except OSError as e:
            print("(error %s)" % e, flush=True)
            ok = False
else:
    with socket.create_connection((ip, port), timeout=5) as s:
        f = s.makefile("rb")
        for _ in range(n):
            ok = ask(f, s) and ok
            time.sleep(0.1)
sys.exit(0 if ok else 1)
PY
}

# lb_server VM: the VM's server on port 8080, answering its own name.
lb_server() {
    start "ovl-$1" "$LAB/vm-$1-lbserver.pid" "$LAB/$1-lbserver.log" python3 "$LAB/lbserver.py" "$1" 8080
    wait_for 5 "$1's server" listening "$1" 8080
}

# lb_servers: be1's and be2's servers up, each answering vm1 directly (through the router).
lb_servers() {
    lb_server be1 && lb_server be2 || return 1
    in_ns ovl-vm1 timeout 10 python3 "$LAB/lbclient.py" 10.0.2.21 8080 spread 1 &&
        in_ns ovl-vm1 timeout 10 python3 "$LAB/lbclient.py" 10.0.2.22 8080 spread 1
}

# lb_spread VM N: N connections from VM to the VIP all answered, by both backends.
lb_spread() {
    local out=$LAB/lb-spread.out
    in_ns "ovl-$1" timeout 60 python3 "$LAB/lbclient.py" 10.0.0.100 80 spread "$2" >"$out" || { sort "$out" | uniq -c; return 1; }
    sort "$out" | uniq -c
    grep -qx be1 "$out" && grep -qx be2 "$out"
}

# lb_sticky VM: 5 connections of 5 requests each; every connection answered by one backend.
lb_sticky() {
    local i
    for i in 1 2 3 4 5; do
        in_ns "ovl-$1" timeout 20 python3 "$LAB/lbclient.py" 10.0.0.100 80 session 5 >"$LAB/lb.out" || { cat "$LAB/lb.out"; return 1; }
        echo "connection $i: $(sort -u "$LAB/lb.out" | tr '\n' ' ')"
        [ "$(sort -u "$LAB/lb.out" | wc -l)" = 1 ] || return 1
    done
}

# lb_hairpin VM N: N connections from a backend to the VIP, all answered, at least one by
# the backend itself (OVN's hairpin: the reply comes back from the VIP).
lb_hairpin() {
    local out=$LAB/lb-hairpin.out
    in_ns "ovl-$1" timeout 60 python3 "$LAB/lbclient.py" 10.0.0.100 80 spread "$2" >"$out" || { sort "$out" | uniq -c; return 1; }
    sort "$out" | uniq -c
    grep -qx "$1" "$out"
}

# lb_info: the answers' tallies (information, not a check).
lb_info() {
    local f
    for f in spread hairpin; do
        [ -s "$LAB/lb-$f.out" ] || continue
        echo "INFO s5 $f: $(sort "$LAB/lb-$f.out" | uniq -c | awk '{printf "%s %s, ", $2, $1}' | sed 's/, $//') ($SWITCH)"
    done
}

# 5: a load balancer. lr1 joins ls1 (10.0.1.0/24: the client vm1 on ch1) and ls2
# (10.0.2.0/24: backends be1 on ch1 and be2 on ch2). lb1 (VIP 10.0.0.100:80 -> be1 and be2
# on port 8080, TCP) is on both switches: ls1's for the client (it reaches the VIP through
# its router), ls2's for the backends themselves (hairpin).
scenario_5() {
    lb_scripts
    nbctl ls-add ls1 -- ls-add ls2 -- lr-add lr1
    nbctl lrp-add lr1 lr1-ls1 0a:00:00:00:ff:01 10.0.1.1/24
    nbctl lrp-add lr1 lr1-ls2 0a:00:00:00:ff:02 10.0.2.1/24
    local s
    for s in 1 2; do
        nbctl lsp-add "ls$s" "ls$s-lr1" -- lsp-set-type "ls$s-lr1" router \
            -- lsp-set-addresses "ls$s-lr1" router -- lsp-set-options "ls$s-lr1" "router-port=lr1-ls$s"
    done
    lsp ls1 vm1 0a:00:00:00:01:01 10.0.1.11
    lsp ls2 be1 0a:00:00:00:02:21 10.0.2.21
    lsp ls2 be2 0a:00:00:00:02:22 10.0.2.22
    nbctl lb-add lb1 10.0.0.100:80 10.0.2.21:8080,10.0.2.22:8080 tcp
    nbctl ls-lb-add ls1 lb1 -- ls-lb-add ls2 lb1
    vm_add 1 vm1 0a:00:00:00:01:01 10.0.1.11/24 10.0.1.1
    vm_add 1 be1 0a:00:00:00:02:21 10.0.2.21/24 10.0.2.1
    vm_add 2 be2 0a:00:00:00:02:22 10.0.2.22/24 10.0.2.1
    check "s5: logical ports vm1 (ch1), be1 (ch1) and be2 (ch2) bound and up" ports_up vm1 be1 be2
    check "s5: backends be1 and be2 serve on 8080, vm1 reaches each directly" lb_servers
    check "s5: 20 connections vm1 -> VIP 10.0.0.100:80 answered, spread over be1 and be2" lb_spread vm1 20
    check "s5: each connection stays on its backend (5 connections x 5 requests)" lb_sticky vm1
    check "s5: hairpin: be1 -> VIP answered (20 connections), by be1 itself among them" lb_hairpin be1 20
    lb_info
}
cleanup_5() {
    local f
    for f in "$LAB"/vm-be*-lbserver.pid; do
        [ -s "$f" ] || continue
        kill "$(cat "$f")" 2>/dev/null || true
        rm -f "$f"
    done
    nbctl --if-exists lb-del lb1 -- --if-exists lr-del lr1 -- --if-exists ls-del ls1 -- --if-exists ls-del ls2
}

run_scenario() {
    local s=$1
    echo "== scenario $s ($SWITCH, $NCH chassis)"
    NOT_UP=0
    "scenario_$s" || check "s$s: set up" false
    local not_up=$NOT_UP
    NOT_UP=0
    dump_flows "$s"
    vm_del_all
    "cleanup_$s" || true
    # Every chassis done with the removal before the next scenario (not worth waiting for
    # when the chassis never caught up).
    [ "$not_up" = 1 ] || timeout 20 ovn-nbctl --db="unix:$C/nb.sock" --wait=hv sync >/dev/null 2>&1 || true
}

show_logs() {
    local f
    for f in "$LAB"/ch*/ovn-controller.log "$LAB"/ch*/ovs-vswitchd.log "$LAB"/ch*/ferrovsd.log \
        "$C"/northd.log; do
        [ -f "$f" ] || continue
        echo "--- ${f#$LAB/} (warnings and errors, last 10)"
        grep -E 'WARN|ERR|EMER' "$f" | tail -10 || true
    done
}

RUN_KEEP=0
do_run() {
    local scenarios=() s
    while [ $# -gt 0 ]; do
        case $1 in
        --keep) RUN_KEEP=1; shift ;;
        all) scenarios+=(1 2 3 4 5 6 7 8); shift ;;
        [1-8]) scenarios+=("$1"); shift ;;
        *) die "run: unknown scenario '$1' (1 to 8, all)" ;;
        esac
    done
    [ ${#scenarios[@]} -gt 0 ] || die "run: which scenario? (1 to 8, all)"
    load_state
    trap 'rc=$?; if [ $rc != 0 ]; then show_logs; [ $RUN_KEEP = 1 ] || do_down --keep-logs; fi' EXIT
    for s in "${scenarios[@]}"; do run_scenario "$s"; done
    if [ $FAIL -gt 0 ]; then
        echo "failed:"
        printf '  %s\n' "${FAILED[@]}"
    fi
    echo "$PASS passed, $FAIL failed"
    [ $FAIL = 0 ]
}

# ---------------------------------------------------------------- status, inventory

do_status() {
    load_state
    echo "lab $LAB: $SWITCH, $NCH chassis"
    sbctl show
    nbctl show
    local n
    for n in $(seq "$NCH"); do
        echo "--- chassis $n"
        vsctl "$n" --columns=name,type,ofport,error,external_ids list Interface 2>&1 | grep -v '^$' || true
    done
}

do_inventory() {
    load_state
    local out=${1:-/dev/stdout} n f
    {
        echo "# OVN lab inventory: $SWITCH, $NCH chassis, $(date -u +%Y-%m-%dT%H:%MZ)"
        echo
        echo "ovn-controller $(ovn-controller --version | head -1 | awk '{print $NF}'), OVS $(ovs-vsctl --version | head -1 | awk '{print $NF}')"
        if ls "$LAB"/ch*/oftrace.jsonl >/dev/null 2>&1; then
            echo
            echo "## OpenFlow messages (all chassis, ofproxy.py)"
            echo
            python3 "$HERE/tally.py" msgs "$LAB"/ch*/oftrace.jsonl
        fi
        for f in "$LAB"/flows/s*-ch1.flows; do
            [ -s "$f" ] || continue
            echo
            echo "## Flows on chassis 1 after scenario $(basename "$f" | sed 's/^s\([0-9]*\)-.*/\1/')"
            echo
            python3 "$HERE/tally.py" flows "$f"
            local g=${f%.flows}.groups m=${f%.flows}.meters
            [ -f "$g" ] && echo && echo "groups: $(grep -c 'group_id=' "$g" || true), meters: $(grep -c 'meter=' "$m" 2>/dev/null || true)"
        done
        echo
        echo "## OVSDB: what chassis 1's ovn-controller wrote and monitored"
        echo
        python3 "$HERE/tally.py" ovsdb "$LAB/ch1/ovn-controller.log"
        for n in $(seq "$NCH"); do
            echo
            echo "## Chassis $n: Open_vSwitch datapath_types, iface_types; Datapath rows"
            echo
            echo '```'
            vsctl "$n" get Open_vSwitch . datapath_types iface_types 2>&1 || true
            vsctl "$n" --columns=_uuid,capabilities,ct_zones,external_ids list Datapath 2>&1 || true
            vsctl "$n" --columns=name,type,options,ofport,error list Interface 2>&1 || true
            echo '```'
            if [ -f "$LAB/ch$n/ferrovsd.log" ]; then
                echo
                echo "ferrovsd's warnings and errors (distinct, first 40):"
                echo
                echo '```'
                grep -E ' (WARN|ERROR) ' "$LAB/ch$n/ferrovsd.log" | sed -E 's/^[^ ]+ +//' | sort | uniq -c | sort -rn | head -40 || true
                echo '```'
            fi
        done
    } >"$out"
}

do_test() {
    local up=() sc=()
    while [ $# -gt 0 ]; do
        case $1 in
        --switch | --chassis) up+=("$1" "$2"); shift 2 ;;
        --no-of-trace) up+=("$1"); shift ;;
        *) sc+=("$1"); shift ;;
        esac
    done
    [ ${#sc[@]} -gt 0 ] || sc=(1)
    local rc=0
    "$0" up "${up[@]}" || exit 1
    "$0" run "${sc[@]}" || rc=$?
    if [ $rc = 0 ]; then "$0" down; else "$0" down --keep-logs; fi
    return $rc
}

# Sourced (bench/ovn.sh): the functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
up) do_up "$@" ;;
down) do_down "$@" ;;
run) do_run "$@" ;;
status) do_status ;;
inventory) do_inventory "$@" ;;
test) do_test "$@" ;;
-h | --help | help | "") sed -n '2,51p' "$0" ;;
*) die "unknown command '$cmd' (up, run, inventory, status, down, test)" ;;
esac
