#!/usr/bin/env bash
# OpenFlow's control path, ferrovs beside OVS (ovs-vswitchd-dpdk, a netdev bridge) in one run,
# rounds interleaved: both are driven through their bridge's management socket
# RUN_DIR/br0.mgmt by the same client (bench/of_client.py, OpenFlow 1.3; what it sends is
# encoded before the clock starts).
#
#   flow-mods   N rules added (FLOW_MOD add, one ipv4 nw_dst each, output:1) with a BARRIER
#               after every BATCH (1: as a controller that waits for each; 100; N: one bulk
#               load), then all deleted (one FLOW_MOD delete + barrier). Reported: rules/s.
#   packet-in   a table-miss rule actions=CONTROLLER:65535; PACKET_OUT (in_port CONTROLLER,
#               output TABLE) of a 60-byte UDP frame comes back as a PACKET_IN: latency with one
#               outstanding (p50/p99), then rate with --window outstanding.
#
# Each switch has a bridge br0 with one port vhu1 (vhost-user, ofport 1, no guest); its PMD
# runs on the last core; every process under test starts with setsid.
#
# Prints JSON: per cell the median over rounds for each switch and the ratio ferrovs/OVS
# (flow-mods/s and packet-ins/s: above 1 is ferrovs faster; latency: below 1 is).
#
#   bench/openflow.sh [--rounds 3] [--rules "1000 10000"] [--batches "1 100 all"]
#                     [--seconds 6] [--window 64] [--peers "ferrovs ovs"]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=3 rules="1000 10000" batches="1 100 all" seconds=6 window=64 who_list="ferrovs ovs"
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --rules) rules=$2; shift 2 ;;
        --batches) batches=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --window) window=$2; shift 2 ;;
        --peers) who_list=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
for t in ovsdb-server ovsdb-tool ovs-vsctl jq python3; do
    command -v "$t" >/dev/null || { echo "bench: $t is missing (scripts/deps.sh)" >&2; exit 1; }
done
bash scripts/deps.sh >/dev/null
cargo build --release --quiet -p ferrovsd -p ferrovs
bin=${CARGO_TARGET_DIR:-$root/target}/release
pmd=$(($(nproc) - 1))
work=$(mktemp -d /tmp/ferrovs-bench-openflow.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
# shellcheck source=scripts/peers/ovs-dpdk.sh
source scripts/peers/ovs-dpdk.sh
ovs_up=
cleanup() { [ -n "$ovs_up" ] && ovs_stop; stop_all; rm -rf "$work"; }
trap cleanup EXIT INT TERM

start_switch() {
    dir=$work/$who
    rm -rf "$dir"; mkdir -p "$dir"
    case $who in
        ferrovs)
            echo '{"bridges": [{"name": "br0"}]}' >"$dir/empty.json"
            setsid "$bin/ferrovsd" --run-dir "$dir" --config "$dir/empty.json" --pmd-cores "$pmd" >"$dir/ferrovsd.log" 2>&1 &
            track $!
            wait_sock "$dir/ferrovs.ctl"
            "$bin/ferrovs" --run-dir "$dir" add-port br0 vhu1 type=vhost-user "path=$dir/vhu1" ofport=1 >/dev/null
            ;;
        ovs)
            ovs_start_bare "$dir" "$pmd" >/dev/null 2>&1 || { log "OVS did not start: $(tail -3 "$dir/ovs-vswitchd.log")"; return 1; }
            ovs_up=1
            ovs-vsctl --db="unix:$dir/db.sock" --timeout=20 add-br br0 -- set bridge br0 datapath_type=netdev \
                -- add-port br0 vhu1 -- set Interface vhu1 type=dpdkvhostuser ofport_request=1 >/dev/null
            ;;
    esac
    wait_sock "$dir/br0.mgmt"
}
stop_switch() {
    case $who in
        ferrovs) stop_all ;;
        ovs) ovs_stop; ovs_up= ;;
    esac
}

results=$work/results.jsonl
: >"$results"
for round in $(seq "$rounds"); do
    for who in $who_list; do
        start_switch || { log "round $round: $who did not start"; stop_switch; continue; }
        for n in $rules; do
            for b in $batches; do
                [ "$b" = all ] && bb=$n || bb=$b
                r=$({ timeout 600 python3 bench/of_client.py flowmods "$dir/br0.mgmt" "$n" "$bb" 2>&1 || true; } | tail -1)
                jq -e . >/dev/null 2>&1 <<<"$r" || r=$(jq -n -c --arg e "$r" '{error: $e}')
                log "round $round $who flow-mods N=$n batch=$b: $r"
                jq -c --arg who "$who" --arg b "$b" --argjson n "$n" --argjson round "$round" \
                    '. + {who: $who, cell: "flow-mods", rules: $n, batch: $b, round: $round}' <<<"$r" >>"$results"
            done
        done
        r=$({ timeout 120 python3 bench/of_client.py packetin "$dir/br0.mgmt" "$seconds" "$window" 2>&1 || true; } | tail -1)
        jq -e . >/dev/null 2>&1 <<<"$r" || r=$(jq -n -c --arg e "$r" '{error: $e}')
        log "round $round $who packet-in: $r"
        jq -c --arg who "$who" --argjson round "$round" '. + {who: $who, cell: "packet-in", round: $round}' \
            <<<"$r" >>"$results"
        stop_switch
    done
done

jq -s --argjson rounds "$rounds" --argjson core "$pmd" --argjson window "$window" '
  def median: map(select(. != null)) | sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def ratio($a; $b): if $a and $b and $b > 0 then (($a / $b) * 1000 | round / 1000) else null end;
  def fm: {flow_mods_per_s: (map(.flow_mods_per_s) | median), add_s: (map(.add_s) | median),
           delete_all_s: (map(.delete_all_s) | median), errors: (map(.error // empty) | unique)};
  def pi: {packet_ins_per_s: (map(.packet_ins_per_s) | median),
           latency_us_p50: (map(.latency_us_p50) | median), latency_us_p99: (map(.latency_us_p99) | median),
           lost_sequential: (map(.lost_sequential) | max), errors: (map(.error // empty) | unique)};
  (map(select(.cell == "flow-mods")) | group_by([.rules, .batch]) | map(
     (.[0]) as $c | (group_by(.who) | map({key: .[0].who, value: fm}) | from_entries) as $by
     | {rules: $c.rules, batch: $c.batch, results: $by,
        ratio_ferrovs_to_ovs: {flow_mods_per_s: ratio($by.ferrovs.flow_mods_per_s; $by.ovs.flow_mods_per_s),
                               delete_all_s: ratio($by.ferrovs.delete_all_s; $by.ovs.delete_all_s)}})) as $fm
  | (map(select(.cell == "packet-in")) | (group_by(.who) | map({key: .[0].who, value: pi}) | from_entries)) as $pi
  | {bench: "openflow",
     source: "bench/of_client.py (our own OpenFlow 1.3 client, same bytes to both) over RUN_DIR/br0.mgmt; ferrovsd vs ovs-vswitchd-dpdk 3.1 netdev bridge",
     pmd_core: $core, rounds: $rounds,
     flow_mods: $fm,
     packet_in: {window: $window, results: $pi,
                 ratio_ferrovs_to_ovs: {packet_ins_per_s: ratio($pi.ferrovs.packet_ins_per_s; $pi.ovs.packet_ins_per_s),
                                        latency_us_p50: ratio($pi.ferrovs.latency_us_p50; $pi.ovs.latency_us_p50),
                                        latency_us_p99: ratio($pi.ferrovs.latency_us_p99; $pi.ovs.latency_us_p99)}}}
' "$results"
