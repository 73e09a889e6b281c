#!/usr/bin/env bash
# os-ken's switch test tool (os_ken/tests/switch/tester.py, the OpenFlow 1.3 cases of
# os_ken/tests/switch/of13: match, action, group, meter) against ferrovs or, for the
# reference, against OVS.
#
#   scripts/osken-switch-tests.sh [--target ferrovs|ovs] [--cases GLOB] [--json OUT]
#                                 [--keep] [--interval SECONDS]
#
#   --cases GLOB   the case files, relative to of13/ (default '*/*': all of them), e.g.
#                  'match/0*', 'action/00_OUTPUT.json', '{match,action}/*'
#   --json OUT     per-case results and per-group counts as JSON
#   --keep         leave the work directory (logs of every daemon and of os-ken)
#   --no-target-controller-rule   diagnostics, not the suite: the tester installs
#                  in_port=2,actions=CONTROLLER in the target before every case; this leaves
#                  that one rule out (for a target that refuses output to the controller)
#
# Topology (tester.py's defaults):
#
#     os-ken (127.0.0.1:PORT, root namespace)
#        |                 |
#     target switch      tester switch: OVS, netdev bridge, dpid 2, in namespace osk-tst-TAG
#     dpid 1 (OVS) or      port 1 ---- veth ---- target port 1 (target_recv_port)
#     ferrovs's own        port 2 ---- veth ---- target port 2 (target_send_port_1)
#                          port 3 ---- veth ---- target port 3 (target_send_port_2)
#
# The tester switch sends each case's packet by PACKET_OUT from its port 1; the target's
# rule under test sends it on (or to os-ken as PACKET_IN), and the tester sees it arrive on
# port 2 or 3 (its rule: in_port=2 -> CONTROLLER) and tells os-ken, which compares.
#
# ferrovs (release build, root namespace, its own run directory) gets the veth ends as
# AF_PACKET uplinks with ofport=1..3. It reaches os-ken with `ferrovs set-controller` when
# that command exists, else through socat between its management socket and os-ken's port.
# A target OVS runs in a namespace of its own (each netdev datapath creates a TAP named
# ovs-netdev); the OVS bridges reach os-ken through a unix socket that socat forwards to
# os-ken's TCP port.
#
# Needs root, OVS (openvswitch-switch), socat and os-ken's venv: scripts/deps.sh.
# Exit status: 0 when the run completed (whatever the counts), 1 on a setup failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=ferrovs cases='*/*' json="" keep=0 interval=0
while [ $# -gt 0 ]; do
    case $1 in
    --target) target=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    --json) json=$(realpath -m "$2"); shift 2 ;;
    --keep) keep=1; shift ;;
    --no-target-controller-rule) export OSKEN_TARGET_NO_CONTROLLER_RULE=1; shift ;;
    --interval) interval=$2; shift 2 ;;
    -h | --help) sed -n '2,39p' "$0"; exit 0 ;;
    *) echo "osken-switch-tests: unknown argument '$1'" >&2; exit 1 ;;
    esac
done
case $target in ferrovs | ovs) ;; *) echo "--target: ferrovs or ovs" >&2; exit 1 ;; esac

VENV=${OSKEN_VENV:-$ROOT/target/osken/venv}
PY=$VENV/bin/python3
[ -x "$PY" ] && "$PY" -c 'import os_ken, eventlet' 2>/dev/null || {
    echo "osken-switch-tests: no os-ken in $VENV (run scripts/deps.sh)" >&2; exit 1; }
OF13=$("$PY" -c 'import os, os_ken.tests.switch as s; print(os.path.join(os.path.dirname(s.__file__), "of13"))')
BIN=${FERROVS_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}

tag=$(( $$ % 100000 ))
W=${OSKEN_WORK_DIR:-/tmp/ferrovs-osken-$tag}
NS_TST=osk-tst-$tag NS_TGT=osk-tgt-$tag
BR_TGT=br-osk$tag
rm -rf "$W"
mkdir -p "$W/cases" "$W/tester" "$W/target"
pids=()

cleanup() {
    set +e
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for d in "$W/tester" "$W/target"; do
        for f in "$d"/ovs-vswitchd.pid "$d"/ovsdb-server.pid; do
            [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
        done
    done
    for i in 1 2 3; do ip link del "osk${tag}t$i" 2>/dev/null; done
    ip netns del "$NS_TST" 2>/dev/null
    ip netns del "$NS_TGT" 2>/dev/null
    sleep 0.3
    if [ $keep = 0 ]; then rm -rf "$W"; else echo "work directory: $W"; fi
}
trap cleanup EXIT

# The cases: a tree of links to the chosen files, their group (directory) kept.
n=0
for f in $(cd "$OF13" && eval "ls -d $cases" 2>/dev/null); do
    for g in $( [ -d "$OF13/$f" ] && (cd "$OF13" && find "$f" -name '*.json') || echo "$f"); do
        case $g in *.json) ;; *) continue ;; esac
        mkdir -p "$W/cases/$(dirname "$g")"
        ln -sf "$OF13/$g" "$W/cases/$g"
        n=$((n + 1))
    done
done
[ $n -gt 0 ] || { echo "osken-switch-tests: no case matches '$cases' in $OF13" >&2; exit 1; }

# os-ken's port: a free one.
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

# A private ovsdb-server and ovs-vswitchd (in namespace $2) in directory $1.
ovs_up() {
    local d=$1 ns=$2 role=$3
    ovsdb-tool create "$d/conf.db" /usr/share/openvswitch/vswitch.ovsschema
    ovsdb-server "$d/conf.db" --remote="punix:$d/db.sock" --unixctl="$d/ovsdb-server.ctl" \
        --pidfile="$d/ovsdb-server.pid" --log-file="$d/ovsdb-server.log" --detach --no-chdir 2>>"$d/start.log"
    ovs-vsctl --db="unix:$d/db.sock" --no-wait init
    # A target OVS gets no datapath flow cache: its revalidators update cached flows after a
    # FLOW_MOD asynchronously (BARRIER does not wait for them), and the tester sends its
    # packet right after the barrier, so a stale cached flow of the previous case could
    # forward it. With flow-limit=0 every packet is looked up in the current tables (exact
    # semantics; slower, which the throughput cases of group and meter may feel).
    [ "$role" = tester ] ||
        ovs-vsctl --db="unix:$d/db.sock" --no-wait set Open_vSwitch . other_config:flow-limit=0
    ip netns exec "$ns" env OVS_RUNDIR="$d" OVS_LOGDIR="$d" OVS_DBDIR="$d" \
        /usr/sbin/ovs-vswitchd "unix:$d/db.sock" --unixctl="$d/ovs-vswitchd.ctl" \
        --pidfile="$d/ovs-vswitchd.pid" --log-file="$d/ovs-vswitchd.log" --detach --no-chdir 2>>"$d/start.log"
}
vsctl() { local d=$1; shift; ovs-vsctl --db="unix:$d/db.sock" --timeout=20 "$@"; }

# An OVS netdev bridge $3 with dpid $4, the veth ends $5.. as ports 1.., controller os-ken.
ovs_bridge() {
    local d=$1 ns=$2 br=$3 dpid=$4; shift 4
    ovs_up "$d" "$ns" "$br"
    vsctl "$d" add-br "$br" -- set bridge "$br" datapath_type=netdev \
        "other-config:datapath-id=$dpid" protocols=OpenFlow13 fail_mode=secure
    local i=1
    for p in "$@"; do
        vsctl "$d" add-port "$br" "$p" -- set Interface "$p" "ofport_request=$i"
        i=$((i + 1))
    done
    # OVS in a namespace cannot reach os-ken's loopback: a unix socket forwarded by socat.
    socat "UNIX-LISTEN:$d/osken.sock,fork" "TCP:127.0.0.1:$port" 2>>"$d/socat.log" &
    pids+=($!)
    vsctl "$d" set-controller "$br" "unix:$d/osken.sock" -- \
        set controller "$br" max_backoff=1000
}

# Links: tester port i <-> target port i.
ip netns add "$NS_TST"
[ $target = ovs ] && ip netns add "$NS_TGT"
for i in 1 2 3; do
    a=osk${tag}t$i b=osk${tag}s$i
    ip link add "$a" type veth peer name "$b"
    ip link set "$b" netns "$NS_TST"
    [ $target = ovs ] && ip link set "$a" netns "$NS_TGT"
done
# No IPv6 on the test links: the kernel's own router/neighbour solicitations would reach
# the tester as stray packets.
tgt_exec() { if [ $target = ovs ]; then ip netns exec "$NS_TGT" "$@"; else "$@"; fi; }
for i in 1 2 3; do
    ip netns exec "$NS_TST" sysctl -qw "net.ipv6.conf.osk${tag}s$i.disable_ipv6=1"
    ip netns exec "$NS_TST" ip link set "osk${tag}s$i" up
    tgt_exec sysctl -qw "net.ipv6.conf.osk${tag}t$i.disable_ipv6=1"
    tgt_exec ip link set "osk${tag}t$i" up
done
ip netns exec "$NS_TST" ip link set lo up

tester_dpid=0000000000000002
ovs_bridge "$W/tester" "$NS_TST" tester "$tester_dpid" "osk${tag}s1" "osk${tag}s2" "osk${tag}s3"

if [ $target = ovs ]; then
    target_dpid=0000000000000001
    ovs_bridge "$W/target" "$NS_TGT" br-target "$target_dpid" "osk${tag}t1" "osk${tag}t2" "osk${tag}t3"
else
    [ -x "$BIN/ferrovsd" ] && [ -x "$BIN/ferrovs" ] || {
        echo "osken-switch-tests: build first: cargo build --release -p ferrovsd -p ferrovs" >&2
        exit 1; }
    d=$W/target
    fv() { "$BIN/ferrovs" --run-dir "$d" "$@"; }
    core=$(( $(nproc) - 1 ))
    setsid "$BIN/ferrovsd" --run-dir "$d" --pmd-cores "$core" >"$d/ferrovsd.out" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do fv show >/dev/null 2>&1 && break; sleep 0.1; done
    fv add-bridge "$BR_TGT" >/dev/null
    for i in 1 2 3; do
        fv add-port "$BR_TGT" "osk${tag}t$i" type=uplink "dev=osk${tag}t$i" mode=af_packet \
            "ofport=$i" >/dev/null
    done
    for _ in $(seq 100); do [ -S "$d/$BR_TGT.mgmt" ] && break; sleep 0.1; done
    if fv help 2>&1 | grep -q set-controller; then
        fv set-bridge "$BR_TGT" datapath-id=0000000000000001 fail-mode=secure \
            protocols=OpenFlow13 >/dev/null ||
            echo "osken-switch-tests: ferrovs set-bridge failed (dpid and mode left as they are)" >&2
    fi
    # The dpid os-ken is told to expect: what the switch says.
    target_dpid=$(ovs-ofctl -O OpenFlow13 show "unix:$d/$BR_TGT.mgmt" |
        sed -n 's/.*dpid:\([0-9a-f]*\).*/\1/p')
    [ -n "$target_dpid" ] || { echo "osken-switch-tests: ferrovs's dpid unknown" >&2; exit 1; }
    if fv help 2>&1 | grep -q set-controller; then
        # Connected below, once os-ken listens (ferrovs reconnects with backoff anyway).
        (sleep 2; fv set-controller "$BR_TGT" "tcp:127.0.0.1:$port" >/dev/null) &
        pids+=($!)
    else
        # The management socket is passive: socat connects it to os-ken once os-ken listens
        # (below), and again whenever either side closes.
        (
            while true; do
                socat "UNIX-CONNECT:$d/$BR_TGT.mgmt" "TCP:127.0.0.1:$port" 2>>"$d/socat.log" || true
                sleep 0.5
            done
        ) &
        pids+=($!)
    fi
fi

echo "osken-switch-tests: target $target (dpid $target_dpid), $n case files, os-ken on 127.0.0.1:$port"
log=$W/osken.log
"$PY" "$ROOT/scripts/osken_switch_test.py" run \
    --ofp-listen-host 127.0.0.1 --ofp-tcp-listen-port "$port" \
    --test-switch-dir "$W/cases" --test-switch-target "$target_dpid" \
    --test-switch-tester "$tester_dpid" --test-switch-interval "$interval" \
    >"$log" 2>&1 &
osken=$!
pids+=($osken)
# The tester ends itself (SIGTERM) after its report; a run that stalls is ended after
# 3 minutes without a new line.
last=0
while kill -0 $osken 2>/dev/null; do
    sleep 5
    now=$(wc -l <"$log")
    if [ "$now" = "$last" ]; then
        stall=$(( ${stall:-0} + 5 ))
        [ $stall -ge 180 ] && { echo "osken-switch-tests: os-ken stalled (180 s without output)"; kill $osken; break; }
    else
        stall=0 last=$now
    fi
done
wait $osken 2>/dev/null || true
[ -z "$json" ] || cp "$log" "${json%.json}.log"
grep -q -- '--- Test start ---' "$log" || {
    echo "osken-switch-tests: os-ken did not start its tests:" >&2; tail -20 "$log" >&2; exit 1; }
"$PY" "$ROOT/scripts/osken_switch_test.py" report "$log" "$W/cases" ${json:+--json "$json"}
