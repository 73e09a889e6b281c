#!/usr/bin/env bash
# vhost → vhost forwarding benchmark: ferrovs vs DPDK testpmd (io-forwarding, the raw upper
# bound: no switching) vs OVS-DPDK (netdev bridge, NORMAL), interleaved in one run, with two
# traffic sources (frontends):
#   testpmd  (the default, the headline figures) DPDK testpmd with two net_virtio_user ports on
#            one core, --forward-mode=mac, queue_size=1024, `start tx_first 32`: the frontend
#            the DPDK and OVS communities benchmark with, written by none of us. Its rate is
#            the sum of both ports' Rx-pps over the measured interval (testpmd's own
#            `show port stats all`), i.e. everything the backend forwarded, both directions.
#   gen      ferrovs-gen (one process, one core: txonly on port 1 with --sink on port 2, every
#            packet accounted for). Our own generator: it shapes the rings in a way that suits
#            our backend (issue 16), so it is reported beside, never as the headline.
#
# Each backend runs its PMD on the last core; the frontend runs on the other core. Every
# process under test is started with setsid (own session) so autogroup scheduling treats
# them alike. Prints JSON: per frontend, frame size and backend the median Mpps over the
# rounds, the ratio to testpmd's backend, and PMD cycles per packet: busy cycles per packet
# (ferrovs: pmd-stats; OVS: pmd-stats-show) and all cycles of the PMD core per packet
# (ferrovs: busy + idle; testpmd: --record-core-cycles).
#
# --base REV adds a second ferrovs backend, "ferrovs-base": ferrovsd and ferrovs built at REV
# in their own worktree, interleaved with this tree's build round by round (an A/B test of a
# change; the JSON then carries ratio_to_base).
#
#   bench/vhost-fwd.sh [--rounds N] [--seconds S] [--sizes "64 1518"] [--peers "testpmd ovs"]
#                      [--frontend "testpmd gen"] [--base REV]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=3 secs=5 sizes="64 1518" peers="testpmd ovs" frontends="testpmd gen" base_rev=
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --seconds) secs=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --peers) peers=$2; shift 2 ;;
        --frontend) frontends=$2; shift 2 ;;
        --base) base_rev=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
bash scripts/deps.sh >/dev/null
cargo build --release --quiet
bin=$root/target/release
# The A/B baseline: this repository at REV, built once per revision in its own worktree.
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
work=$(mktemp -d /tmp/ferrovs-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; [ -n "${ovs_dir:-}" ] && ovs_stop; rm -rf "$work"; }
trap cleanup EXIT INT TERM
log() { echo "bench: $*" >&2; }

# Runs ferrovs-gen through the backend whose sockets are $1 and $2; prints its JSON.
gen_run() {
    local a=$1 b=$2 size=$3 extra=${4:-}
    # shellcheck disable=SC2086
    setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$a" --sink "$b" --size "$size" \
        --duration "$secs" --quiet --ring 1024 $extra txonly
}

# testpmd as the frontend: two net_virtio_user ports (clients of the backend's sockets $1 and
# $2) mac-forwarding into each other on the traffic core; 32 bursts started per port, then the
# rate of the measured interval. Prints {mpps}. Each port's own address is the other's peer
# address (testpmd's default peers 02:00:00:00:00:0N), so after the first packets both switches
# have learned both and forward known unicast, as between two VMs: with random port addresses
# every packet went to an unknown destination and was flooded, which costs OVS a write to its
# bridge's internal (TAP) port whenever that is up (measured 2026-11-28: 0.6 Mpps flooding,
# 337 instead of ~7 000 cycles per packet with learned addresses).
testpmd_fe_run() {
    local a=$1 b=$2 size=$3 d; d=$(dirname "$a")/fe
    mkdir -p "$d"
    {
        sleep 2; echo "start tx_first 32"; sleep 1; echo "show port stats all"
        sleep "$secs"; echo "show port stats all"; echo "stop"; sleep 0.5; echo "quit"
    } | setsid dpdk-testpmd -l "$gen,$pmd" --main-lcore "$pmd" --no-pci --no-huge -m 1024 \
        --single-file-segments --file-prefix "fbfe$$" \
        --vdev "net_virtio_user0,path=$a,queues=1,queue_size=1024,mac=02:00:00:00:00:01" \
        --vdev "net_virtio_user1,path=$b,queues=1,queue_size=1024,mac=02:00:00:00:00:00" -- \
        -i --forward-mode=mac \
        --nb-cores=1 --rxd=1024 --txd=1024 --txpkts="$size" --total-num-mbufs=32768 \
        >"$d/log" 2>&1 || true
    pkill -9 -f "fbfe$$" 2>/dev/null || true
    # The second `show port stats all`: Rx-pps per port over the measured interval.
    local pps; pps=$(grep -a "Rx-pps:" "$d/log" | tail -2 | awk '{s += $2} END {print s + 0}')
    [ "$pps" -gt 0 ] || { log "testpmd frontend forwarded nothing: $(grep -a -m3 -i 'error\|cause' "$d/log" | tr '\n' ' ')"; }
    jq -n -c --argjson pps "$pps" '{mpps: ($pps / 1e6 * 1000 | round / 1000)}'
}

# Runs the frontend $frontend through the backend whose sockets are $1 and $2; prints JSON.
fe_run() {
    case $frontend in
        gen) gen_run "$@" ;;
        testpmd) testpmd_fe_run "$@" ;;
    esac
}

wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; log "no socket $1"; return 1; }

run_ferrovs() {
    local size=$1 bin=${2:-$bin} d=$work/ferrovs
    rm -rf "$d"; mkdir -p "$d"
    setsid "$bin/ferrovsd" --run-dir "$d" --pmd-cores "$pmd" >"$d/log" 2>&1 &
    local p=$!; pids+=("$p")
    wait_sock "$d/vm2.sock"
    # Warm up (MAC learning), then measure with clean PMD counters.
    [ "$frontend" = gen ] && { gen_run "$d/vm1.sock" "$d/vm2.sock" "$size" >/dev/null 2>&1 || true; }
    "$bin/ferrovs" --run-dir "$d" pmd-stats-clear
    local r; r=$(fe_run "$d/vm1.sock" "$d/vm2.sock" "$size")
    local st; st=$("$bin/ferrovs" --run-dir "$d" pmd-stats --json)
    local cpp; cpp=$(jq '.[0].cycles_per_packet' <<<"$st")
    # Busy + idle cycles per packet: the figure testpmd's --record-core-cycles reports.
    local tpp; tpp=$(jq '.[0] | if .rx_packets > 0 then ((.busy_cycles + .idle_cycles) / .rx_packets * 10 | round / 10) else null end' <<<"$st")
    kill "$p"; wait "$p" 2>/dev/null || true
    jq -c --argjson cpp "$cpp" --argjson tpp "$tpp" '{mpps, lost, cycles_per_packet: $cpp, total_cycles_per_packet: $tpp}' <<<"$r"
}

run_testpmd() {
    local size=$1 d=$work/testpmd
    rm -rf "$d"; mkdir -p "$d"
    setsid dpdk-testpmd -l "$gen,$pmd" --main-lcore "$gen" --no-pci --no-huge -m 1024 \
        --file-prefix "fbench$$" --vdev "net_vhost0,iface=$d/a.sock,queues=1" \
        --vdev "net_vhost1,iface=$d/b.sock,queues=1" -- --forward-mode=io --nb-cores=1 \
        --total-num-mbufs=32768 --stats-period 1 --auto-start --record-core-cycles >"$d/log" 2>&1 &
    local p=$!; pids+=("$p")
    wait_sock "$d/b.sock"
    local r; r=$(fe_run "$d/a.sock" "$d/b.sock" "$size")
    kill -INT "$p"; wait "$p" 2>/dev/null || true
    pgrep -f "fbench$$" >/dev/null && { sleep 1; pkill -9 -f "fbench$$" || true; }
    # testpmd's own figure: all cycles of the forwarding core (busy and idle) per packet.
    local tpp; tpp=$(sed -n 's/.*CPU cycles\/packet=\([0-9.]*\).*/\1/p' "$d/log" | tail -1)
    jq -c --argjson tpp "${tpp:-null}" '{mpps, lost, total_cycles_per_packet: $tpp}' <<<"$r"
}

ovs_available() { [ -f scripts/peers/ovs-dpdk.sh ]; }
run_ovs() {
    local size=$1
    # shellcheck source=/dev/null
    source scripts/peers/ovs-dpdk.sh
    ovs_dir=$work/ovs
    ovs_start "$ovs_dir" "$pmd" >/dev/null 2>&1
    local a b; a=$(ovs_port_path "$ovs_dir" 1); b=$(ovs_port_path "$ovs_dir" 2)
    wait_sock "$a"; wait_sock "$b"
    [ "$frontend" = gen ] && { gen_run "$a" "$b" "$size" >/dev/null 2>&1 || true; }
    ovs_pmd_clear "$ovs_dir"
    local r; r=$(fe_run "$a" "$b" "$size")
    local cpp; cpp=$(ovs_cycles_per_packet "$ovs_dir")
    local tpp; tpp=$(ovs_total_cycles_per_packet "$ovs_dir")
    ovs_stop; ovs_dir=
    jq -c --argjson cpp "${cpp:-null}" --argjson tpp "${tpp:-null}" '{mpps, lost, cycles_per_packet: $cpp, total_cycles_per_packet: $tpp}' <<<"$r"
}

results=$work/results.jsonl
: >"$results"
for round in $(seq "$rounds"); do
    for frontend in $frontends; do
        for size in $sizes; do
            for who in ferrovs $peers; do
                case $who in
                    ferrovs) r=$(run_ferrovs "$size") ;;
                    base) r=$(run_ferrovs "$size" "$base_dir/target/release"); who=ferrovs-base ;;
                    testpmd) r=$(run_testpmd "$size") ;;
                    ovs) ovs_available || { log "scripts/peers/ovs-dpdk.sh missing: skipping OVS"; continue; }
                         r=$(run_ovs "$size") ;;
                esac
                log "round $round frontend $frontend size $size $who: $r"
                jq -c --arg who "$who" --arg fe "$frontend" --argjson size "$size" --argjson round "$round" \
                    '. + {who: $who, frontend: $fe, size: $size, round: $round}' <<<"$r" >>"$results"
            done
        done
    done
done

jq -s --argjson rounds "$rounds" --argjson secs "$secs" --arg base "${base_rev:+$(git rev-parse --short "$base_rev")}" '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def ratio($a; $b): if $a and $b then (($a / $b) * 1000 | round / 1000) else null end;
  group_by(.frontend) | map(
    (.[0].frontend) as $fe
    | {frontend: $fe,
       source: (if $fe == "testpmd" then "DPDK testpmd, two net_virtio_user ports, --forward-mode=mac, start tx_first 32 (one core)" else "ferrovs-gen txonly --sink (one core)" end),
       sizes: (group_by(.size) | map(
         (.[0].size) as $size
         | (group_by(.who) | map({key: .[0].who, value: {
               mpps: (map(.mpps) | median),
               cycles_per_packet: (map(.cycles_per_packet // empty) | median),
               total_cycles_per_packet: (map(.total_cycles_per_packet // empty) | median),
               lost: (map(.lost // empty) | add),
               runs: map(.mpps)}}) | from_entries) as $by
         | {size: $size, results: $by,
            ratio_to_testpmd: ($by | to_entries | map({key: .key, value: ratio(.value.mpps; $by.testpmd.mpps)}) | from_entries)}
           + (if $by["ferrovs-base"] then {ratio_to_base: {median: ratio($by.ferrovs.mpps; $by["ferrovs-base"].mpps),
                  per_round: [range(0; [($by.ferrovs.runs | length), ($by["ferrovs-base"].runs | length)] | min) as $i
                               | ratio($by.ferrovs.runs[$i]; $by["ferrovs-base"].runs[$i])]}} else {} end)))})
  | {benchmark: "vhost-fwd", rounds: $rounds, seconds: $secs, base: (if $base == "" then null else $base end), frontends: .}
' "$results"
