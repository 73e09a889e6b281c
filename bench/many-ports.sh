#!/usr/bin/env bash
# Many ports, one PMD: how the throughput between two busy vhost-user ports falls as idle
# vhost-user ports are added to the same PMD (issue 16). ferrovs vs OVS-DPDK (netdev bridge,
# NORMAL), interleaved in one run.
#
# Busy traffic: DPDK testpmd with two net_virtio_user ports on one core, --forward-mode=mac,
# queue_size=1024, `start tx_first 32` (the frontend of bench/vhost-fwd.sh, written by none
# of us), attached to the switch's two server ports (ferrovs vm1/vm2, OVS dpdkvhostuser
# vhu1/vhu2). Its rate is the sum of both ports' Rx-pps over the measured interval.
# Idle ports: N-2 further vhost-user ports on the same bridge and the same (only) PMD, in
# the switch's client mode (ferrovs vhost-user-client, OVS dpdkvhostuserclient) towards one
# `ferrovs-gen idle --server --socket-dir DIR --ports N-2` process: every frontend attached,
# both rings set up and enabled, receive buffers posted, then silent (idle VMs whose NIC is
# up). The switch's PMD polls their queues every iteration and finds nothing.
#
# Each backend's only PMD runs on the last core; testpmd and the idle frontends on the other.
# Every process under test is started with setsid (own session). Prints JSON: per port
# count and backend the median Mpps over the rounds, the ratio to the same backend's 2-port
# rate (median, and per round against that round's 2-port run), PMD busy cycles per packet
# (ferrovs pmd-stats; OVS pmd-stats-show "avg processing cycles per packet") and, for
# ferrovs, all cycles (busy + idle) per packet.
#
# Every run also carries the host's core-to-core round trip just before and after it
# (host_rtt_ns), and each port count its best run against the best 2-port run
# (ratio_best_to_2_ports): on this VM the host changes a switch's cost per packet from run to
# run (docs/datapath.md, "One frontend per round"), so medians of a few rounds compare host
# states as often as port counts.
#
# --base REV adds "ferrovs-base": ferrovsd and ferrovs built at REV in their own worktree,
# interleaved with this tree's build (an A/B test of a PMD change).
# --quiet-us US sets this tree's pmd-quiet-rxq-poll-us (docs/pmd.md, "Quiet rx queues"); each
# ferrovs result reports the polls skipped and the measured gaps between sweeps.
#
#   bench/many-ports.sh [--rounds N] [--seconds S] [--ports "2 16 64 256"] [--size 64]
#                       [--peers "ovs"] [--base REV] [--quiet-us US]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=3 secs=5 counts="2 16 64 256" size=64 peers="ovs" base_rev= quiet_us=
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --seconds) secs=$2; shift 2 ;;
        --ports) counts=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        --peers) peers=$2; shift 2 ;;
        --base) base_rev=$2; shift 2 ;;
        --quiet-us) quiet_us=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
for n in $counts; do [ "$n" -ge 2 ] || { echo "--ports: each count is >= 2 (the busy pair)" >&2; exit 2; }; done
bash scripts/deps.sh >/dev/null
cargo build --release --quiet -p ferrovsd -p ferrovs -p ferrovs-gen
bin=$root/target/release
if [ -n "$base_rev" ]; then
    sha=$(git rev-parse --short "$base_rev")
    base_dir=/tmp/ferrovs-bench-base-$sha
    if [ ! -x "$base_dir/target/release/ferrovsd" ]; then
        echo "bench: building $sha (the baseline) in $base_dir" >&2
        rm -rf "$base_dir"; git worktree prune
        git worktree add --detach "$base_dir" "$sha" >/dev/null
        (cd "$base_dir" && cargo build --release --quiet -p ferrovsd -p ferrovs)
    fi
    peers="base $peers"
fi
ncpu=$(nproc)
pmd=$((ncpu - 1)); gen=0; [ "$ncpu" -gt 1 ] && gen=$((ncpu - 2))
work=$(mktemp -d /tmp/ferrovs-bench-mp.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
cleanup() { stop_all; [ -n "${_ovs_dir:-}" ] && ovs_stop; rm -rf "$work"; }
trap cleanup EXIT INT TERM

# testpmd as the busy frontend, as bench/vhost-fwd.sh runs it: two net_virtio_user ports
# (clients of the backend's sockets $1 and $2) mac-forwarding into each other; each port's
# address is the other's peer address, so both switches learn both and forward known unicast
# (nothing is flooded to the idle ports once learned). Prints {mpps}.
testpmd_fe_run() {
    local a=$1 b=$2 d; d=$(dirname "$a")/fe
    mkdir -p "$d"
    {
        sleep 2; echo "start tx_first 32"; sleep 1; echo "show port stats all"
        sleep "$secs"; echo "show port stats all"; echo "stop"; sleep 0.5; echo "quit"
    } | setsid dpdk-testpmd -l "$gen,$pmd" --main-lcore "$pmd" --no-pci --no-huge -m 1024 \
        --single-file-segments --file-prefix "fbmp$$" \
        --vdev "net_virtio_user0,path=$a,queues=1,queue_size=1024,mac=02:00:00:00:00:01" \
        --vdev "net_virtio_user1,path=$b,queues=1,queue_size=1024,mac=02:00:00:00:00:00" -- \
        -i --forward-mode=mac \
        --nb-cores=1 --rxd=1024 --txd=1024 --txpkts="$size" --total-num-mbufs=32768 \
        >"$d/log" 2>&1 || true
    pkill -9 -f "fbmp$$" 2>/dev/null || true
    local pps; pps=$(grep -a "Rx-pps:" "$d/log" | tail -2 | awk '{s += $2} END {print s + 0}')
    [ "$pps" -gt 0 ] || log "testpmd frontend forwarded nothing: $(grep -a -m3 -i 'error\|cause' "$d/log" | tr '\n' ' ')"
    jq -n -c --argjson pps "$pps" '{mpps: ($pps / 1e6 * 1000 | round / 1000)}'
}

# Starts `ferrovs-gen idle --server` with $1 frontends in directory $2 (their sockets
# $2/idle<i>.sock); the caller adds the switch's client ports, then calls idle_wait.
idle_start() {
    local n=$1 d=$2
    mkdir -p "$d"
    setsid taskset -c "$gen" "$bin/ferrovs-gen" idle --server --socket-dir "$d" --ports "$n" \
        --duration 100000 >"$d/out" 2>"$d/err" &
    track $!
    for _ in $(seq 200); do [ -S "$d/idle$((n - 1)).sock" ] && return 0; sleep 0.05; done
    log "idle frontends: no sockets in $d"; return 1
}
# Waits until every idle frontend is attached (its log line), then a moment for the switch
# to set the last rings up.
idle_wait() {
    local d=$1
    for _ in $(seq 1200); do
        grep -q "frontends attached" "$d/err" 2>/dev/null && { sleep 1; return 0; }
        grep -q ERROR "$d/err" 2>/dev/null && break
        sleep 0.05
    done
    log "idle frontends not attached: $(tail -2 "$d/err")"; return 1
}

run_ferrovs() {
    local n=$1 bin_sw=${2:-$bin} d=$work/ferrovs
    rm -rf "$d"; mkdir -p "$d"
    setsid "$bin_sw/ferrovsd" --run-dir "$d" --pmd-cores "$pmd" >"$d/log" 2>&1 &
    local p=$!; track "$p"
    wait_sock "$d/vm2.sock"
    if [ "$n" -gt 2 ]; then
        idle_start $((n - 2)) "$d/idle"
        local i
        for i in $(seq 0 $((n - 3))); do
            "$bin_sw/ferrovs" --run-dir "$d" add-port br0 "idle$i" type=vhost-user-client \
                path="$d/idle/idle$i.sock" >/dev/null
        done
        idle_wait "$d/idle"
    fi
    # This tree's ferrovs only (the baseline may predate the setting).
    if [ -n "$quiet_us" ] && [ "$bin_sw" = "$bin" ]; then
        "$bin_sw/ferrovs" --run-dir "$d" config set pmd-quiet-rxq-poll-us "$quiet_us" >/dev/null
    fi
    "$bin_sw/ferrovs" --run-dir "$d" pmd-stats-clear
    local r; r=$(testpmd_fe_run "$d/vm1.sock" "$d/vm2.sock")
    local st; st=$("$bin_sw/ferrovs" --run-dir "$d" pmd-stats --json)
    stop_all
    jq -c --argjson st "$st" '. + {
        cycles_per_packet: $st[0].cycles_per_packet,
        quiet_skips: $st[0].quiet_skips,
        quiet_sweeps: $st[0].quiet_sweeps,
        quiet_gap_p99_us: $st[0].quiet_gap_p99_us,
        quiet_gap_p999_us: $st[0].quiet_gap_p999_us,
        quiet_gap_max_us: $st[0].quiet_gap_max_us,
        total_cycles_per_packet: ($st[0] | if .rx_packets > 0 then ((.busy_cycles + .idle_cycles) / .rx_packets * 10 | round / 10) else null end),
        rxqs: $st[0].rx_queues}' <<<"$r"
}

ovs_available() { [ -f scripts/peers/ovs-dpdk.sh ]; }
run_ovs() {
    local n=$1
    # shellcheck source=/dev/null
    source scripts/peers/ovs-dpdk.sh
    local dir=$work/ovs
    ovs_start "$dir" "$pmd" >/dev/null 2>&1
    local a b; a=$(ovs_port_path "$dir" 1); b=$(ovs_port_path "$dir" 2)
    wait_sock "$a"; wait_sock "$b"
    if [ "$n" -gt 2 ]; then
        idle_start $((n - 2)) "$work/ovs-idle"
        local i args=()
        for i in $(seq 0 $((n - 3))); do
            args+=(-- add-port br0 "idle$i" -- set Interface "idle$i" type=dpdkvhostuserclient
                   "options:vhost-server-path=$work/ovs-idle/idle$i.sock")
        done
        _ovs_ctl "${args[@]}"
        idle_wait "$work/ovs-idle"
    fi
    local rxqs; rxqs=$(ovs_appctl dpif-netdev/pmd-rxq-show | grep -c "queue-id" || true)
    ovs_pmd_clear "$dir"
    local r; r=$(testpmd_fe_run "$a" "$b")
    local cpp; cpp=$(ovs_cycles_per_packet "$dir")
    local tpp; tpp=$(ovs_total_cycles_per_packet "$dir")
    ovs_stop
    stop_all
    rm -rf "$work/ovs-idle"
    jq -c --argjson cpp "${cpp:-null}" --argjson tpp "${tpp:-null}" --argjson rxqs "${rxqs:-null}" \
        '. + {cycles_per_packet: $cpp, total_cycles_per_packet: $tpp, rxqs: $rxqs}' <<<"$r"
}

# The host's core-to-core round trip (bench/lib.sh) before and after each run, both cores
# idle, as in bench/vhost-fwd.sh.
pingpong_bin >/dev/null

results=$work/results.jsonl
: >"$results"
for round in $(seq "$rounds"); do
    for n in $counts; do
        for who in ferrovs $peers; do
            rtt_before=$(host_rtt "$gen" "$pmd")
            case $who in
                ferrovs) r=$(run_ferrovs "$n") ;;
                base) r=$(run_ferrovs "$n" "$base_dir/target/release"); who=ferrovs-base ;;
                ovs) ovs_available || { log "scripts/peers/ovs-dpdk.sh missing: skipping OVS"; continue; }
                     r=$(run_ovs "$n") ;;
            esac
            r=$(jq -c --argjson a "$rtt_before" --argjson b "$(host_rtt "$gen" "$pmd")" '. + {host_rtt_ns: [$a, $b]}' <<<"$r")
            log "round $round ports $n $who: $r"
            jq -c --arg who "$who" --argjson n "$n" --argjson round "$round" \
                '. + {who: $who, ports: $n, round: $round}' <<<"$r" >>"$results"
        done
    done
done

jq -s --argjson rounds "$rounds" --argjson secs "$secs" --argjson size "$size" \
      --arg base "${base_rev:+$(git rev-parse --short "$base_rev")}" '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def ratio($a; $b): if $a and $b and $b > 0 then (($a / $b) * 1000 | round / 1000) else null end;
  . as $all
  | (map(.ports) | min) as $lo
  | (group_by(.who) | map({key: .[0].who, value: (
        (map(select(.ports == $lo)) | map({key: (.round | tostring), value: .mpps}) | from_entries) as $base_by_round
        | (map(select(.ports == $lo)) | map(.mpps) | median) as $base_med
        | (map(select(.ports == $lo)) | map(.mpps) | max) as $base_best
        | group_by(.ports) | map({
            ports: .[0].ports,
            mpps: (map(.mpps) | median),
            ratio_to_2_ports: ratio((map(.mpps) | median); $base_med),
            ratio_per_round: map(ratio(.mpps; $base_by_round[.round | tostring])),
            # Best run against the best 2-port run: what each reaches when the host does not
            # get in the way.
            best: (map(.mpps) | max),
            ratio_best_to_2_ports: ratio((map(.mpps) | max); $base_best),
            cycles_per_packet: (map(.cycles_per_packet // empty) | median),
            total_cycles_per_packet: (map(.total_cycles_per_packet // empty) | median),
            rxqs: (map(.rxqs // empty) | max),
            runs: map(.mpps),
            host_rtt_ns: map(.host_rtt_ns)}))}) | from_entries) as $by
  | {benchmark: "many-ports", rounds: $rounds, seconds: $secs, size: $size,
     base: (if $base == "" then null else $base end),
     busy_frontend: "DPDK testpmd, two net_virtio_user ports, --forward-mode=mac, queue_size=1024, start tx_first 32 (one core)",
     idle_frontend: "ferrovs-gen idle --server --socket-dir DIR --ports N-2 (switch client-mode ports: ferrovs vhost-user-client, OVS dpdkvhostuserclient)",
     results: $by}
' "$results"
