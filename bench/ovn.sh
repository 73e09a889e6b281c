#!/usr/bin/env bash
# OVN's data and control paths with ferrovs beside OVS as the chassis switch, in one run
# (issue 20's benchmark). Each round brings the OVN lab (tests/ovn/lab.sh: central NB/SB and
# ovn-northd, two chassis in namespaces, each with its own ovsdb-server, switch and
# ovn-controller, a veth underlay, Geneve between them) up with one switch, builds the same
# logical network with ovn-nbctl, measures, and takes it down; switches alternate round by
# round.
#
# Logical network: switch ls1, vm1 on chassis 1 (10.0.1.11), vm2 on chassis 2 (10.0.1.12),
# each a namespace behind a veth port of br-int; a load balancer VIP 10.0.1.100:5201 -> vm2
# (conntrack with DNAT in both chassis's pipelines) and ACLs to vm2: allow-related from vm1,
# drop all other IPv4 (stateful: every packet through conntrack).
#
# Figures (traffic from iperf3 and ping, programs none of us wrote):
#   tcp_mbps       iperf3 TCP vm1 -> VIP (load balancer, ACL, Geneve across chassis), --seconds
#   udp64_kpps     iperf3 UDP, 18-byte payload (64-byte frames with the FCS), unlimited rate,
#                  vm1 -> vm2: packets received per second (sent minus lost)
#   nb_to_fwd_ms   an ACL that drops ICMP to vm2 is deleted with ovn-nbctl while vm1 pings
#                  vm2 every 5 ms: time from the ovn-nbctl call to the first echo reply
#                  (northd, the southbound DB, ovn-controller and the switch's flow update),
#                  median of 3 per round
# The switches' datapaths read the VMs' veths with AF_PACKET (OVS: netdev "system" ports;
# ferrovs: AF_PACKET uplinks), both on this 2-core machine with the VMs' stacks: the rates
# measure the whole host, the same for both.
#
#   bench/ovn.sh [--rounds N] [--seconds S] [--switches "ovs ferrovs"]
# Prints JSON: per switch the median of each figure, and ferrovs/OVS ratios.
# Needs what the lab needs (root, ovn-central, ovn-host, OVS, iperf3: scripts/deps.sh) and a
# release build of ferrovs. Only one OVN lab can be up on a machine.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=2 secs=5 switches="ovs ferrovs"
while [ $# -gt 0 ]; do
    case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --seconds) secs=$2; shift 2 ;;
    --switches) switches=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
LABSH=$PWD/tests/ovn/lab.sh
# shellcheck source=../tests/ovn/lab.sh
source "$LABSH"
blog() { echo "bench: $*" >&2; }

# The logical network above; returns non-zero when its ports do not come up.
network_up() {
    nbctl ls-add ls1
    lsp ls1 vm1 0a:00:00:00:01:01 10.0.1.11
    lsp ls1 vm2 0a:00:00:00:01:02 10.0.1.12
    nbctl lb-add lb1 10.0.1.100:5201 10.0.1.12:5201 tcp -- ls-lb-add ls1 lb1
    nbctl acl-add ls1 to-lport 1000 'outport == "vm2" && ip4 && ip4.src == 10.0.1.11' allow-related
    nbctl acl-add ls1 to-lport 900 'outport == "vm2" && ip4' drop
    vm_add 1 vm1 0a:00:00:00:01:01 10.0.1.11/24
    vm_add 2 vm2 0a:00:00:00:01:02 10.0.1.12/24
    # A VIP on a logical switch has no ARP responder (a router's would answer): vm1 sends
    # to the backend's MAC, and the LB stage rewrites the address (DNAT).
    ip -n ovl-vm1 neigh replace 10.0.1.100 lladdr 0a:00:00:00:01:02 dev eth0
    NOT_UP=0
    ports_up vm1 vm2 || return 1
    ping_ok vm1 10.0.1.12 >/dev/null
}

tcp_mbps() {
    local pid out
    in_ns ovl-vm2 timeout $((secs + 15)) iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
    pid=$!
    wait_for 5 "iperf3 server" listening vm2 5201 || return 1
    out=$(in_ns ovl-vm1 timeout $((secs + 10)) iperf3 -c 10.0.1.100 -p 5201 -t "$secs" -J 2>/dev/null |
        jq '.end.sum_received.bits_per_second / 1e6 | round') || out=null
    wait $pid 2>/dev/null || true
    echo "${out:-null}"
}

udp64_kpps() {
    local pid out
    in_ns ovl-vm2 timeout $((secs + 15)) iperf3 -s -1 -p 5202 >/dev/null 2>&1 &
    pid=$!
    wait_for 5 "iperf3 server" listening vm2 5202 || true
    sleep 0.3
    out=$(in_ns ovl-vm1 timeout $((secs + 10)) iperf3 -u -c 10.0.1.12 -p 5202 -l 18 -b 0 -t "$secs" -J 2>/dev/null |
        jq '.end.sum | ((.packets - .lost_packets) / .seconds / 1000 * 10 | round / 10)') || out=null
    wait $pid 2>/dev/null || true
    echo "${out:-null}"
}

# One ACL change to forwarding: the time from ovn-nbctl's call to the first echo reply.
nb_to_fwd_once() {
    local pfile=$LAB/ping.out pid t0 first
    nbctl --wait=hv acl-add ls1 to-lport 2000 'outport == "vm2" && icmp4' drop
    # Not through in_ns: $! must be ping itself (ip netns exec execs it), to stop it.
    ip netns exec ovl-vm1 ping -D -n -i 0.005 -W 1 10.0.1.12 >"$pfile" 2>/dev/null &
    pid=$!
    sleep 1
    if grep -aq 'bytes from' "$pfile"; then
        kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true
        blog "the drop ACL did not drop"; echo null; return 0
    fi
    t0=$(date +%s.%N)
    nbctl acl-del ls1 to-lport 2000 'outport == "vm2" && icmp4'
    wait_for 20 "a reply" grep -aq 'bytes from' "$pfile" || true
    kill $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
    first=$(grep -a -m1 'bytes from' "$pfile" | sed -E 's/^\[([0-9.]+)\].*/\1/')
    [ -n "$first" ] || { echo null; return 0; }
    awk -v a="$t0" -v b="$first" 'BEGIN { printf "%.1f\n", (b - a) * 1000 }'
}

nb_to_fwd_ms() {
    local v=() i
    for i in 1 2 3; do v+=("$(nb_to_fwd_once)"); done
    printf '%s\n' "${v[@]}" | grep -v null | sort -n | awk '{a[NR] = $1} END { if (NR) print a[int((NR + 1) / 2)]; else print "null" }'
}

results=$(mktemp)
trap '"$LABSH" down >/dev/null 2>&1 || true; rm -f "$results"' EXIT
for round in $(seq "$rounds"); do
    for sw in $switches; do
        blog "round $round: $sw"
        "$LABSH" up --switch "$sw" --no-of-trace >/dev/null 2>&1 || { blog "lab up failed ($sw)"; continue; }
        load_state
        if network_up; then
            tcp=$(tcp_mbps); udp=$(udp64_kpps); lat=$(nb_to_fwd_ms)
        else
            blog "$sw: the logical ports did not come up"
            tcp=null udp=null lat=null
        fi
        r=$(jq -n -c --arg who "$sw" --argjson round "$round" --argjson tcp "${tcp:-null}" \
            --argjson udp "${udp:-null}" --argjson lat "${lat:-null}" \
            '{who: $who, round: $round, tcp_mbps: $tcp, udp64_kpps: $udp, nb_to_fwd_ms: $lat}')
        blog "$r"
        echo "$r" >>"$results"
        vm_del_all >/dev/null 2>&1 || true
        "$LABSH" down >/dev/null 2>&1 || true
    done
done

jq -s --argjson rounds "$rounds" --argjson secs "$secs" '
  def median: map(select(. != null)) | sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def ratio($a; $b): if $a and $b and $b != 0 then (($a / $b) * 1000 | round / 1000) else null end;
  (group_by(.who) | map({key: .[0].who, value: {
      tcp_mbps: (map(.tcp_mbps) | median), udp64_kpps: (map(.udp64_kpps) | median),
      nb_to_fwd_ms: (map(.nb_to_fwd_ms) | median), runs: map(del(.who))}}) | from_entries) as $by
  | {benchmark: "ovn", rounds: $rounds, seconds: $secs,
     sources: {tcp: "iperf3 TCP vm1 -> load balancer VIP (backend vm2 on the other chassis)",
               udp64: "iperf3 UDP -l 18 -b 0 vm1 -> vm2 (64-byte frames)",
               nb_to_fwd: "ovn-nbctl acl-del to the first ping -D reply (ping every 5 ms)"},
     results: $by,
     ferrovs_to_ovs: (if $by.ferrovs and $by.ovs then {
        tcp: ratio($by.ferrovs.tcp_mbps; $by.ovs.tcp_mbps),
        udp64: ratio($by.ferrovs.udp64_kpps; $by.ovs.udp64_kpps),
        nb_to_fwd_time: ratio($by.ferrovs.nb_to_fwd_ms; $by.ovs.nb_to_fwd_ms)} else null end)}
' "$results"
