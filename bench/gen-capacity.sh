#!/usr/bin/env bash
# Is ferrovs-gen fast enough not to be the bottleneck? Its own transmit rate beside DPDK
# testpmd's virtio-user txonly, in one run, against the same sink: a testpmd net_vhost
# backend in rxonly mode on the last core (it only counts and frees). The generator runs on
# the other core. The rate is read from the sink's own per-second Rx-pps, for both.
#
#   bench/gen-capacity.sh [--rounds 3] [--seconds 5] [--size 64]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 secs=5 size=64
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --seconds) secs=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
bash scripts/deps.sh >/dev/null
cargo build --release --quiet
bin=$PWD/target/release
ncpu=$(nproc); sink_core=$((ncpu - 1)); gen=0; [ "$ncpu" -gt 1 ] && gen=$((ncpu - 2))
work=$(mktemp -d /tmp/ferrovs-gencap.XXXXXX)
trap 'pkill -f "gencap$$" 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

# Starts the sink; echoes its pid.
start_sink() {
    # Both sink lcores on the sink core: the main one only wakes once a second to print
    # Rx-pps, and must not be starved by the generator.
    setsid stdbuf -oL dpdk-testpmd --lcores "0@$sink_core,1@$sink_core" --main-lcore 0 --no-pci --no-huge -m 1024 \
        --file-prefix "gencap$$-$RANDOM" --vdev "net_vhost0,iface=$work/sink.sock,queues=1" -- \
        --forward-mode=rxonly --nb-cores=1 --total-num-mbufs=32768 --stats-period 1 \
        --auto-start >"$work/sink.log" 2>&1 &
    echo $!
    for _ in $(seq 200); do [ -S "$work/sink.sock" ] && return; sleep 0.05; done
}

# Median of the sink's per-second Rx-pps while traffic ran (the first and last non-zero
# seconds are partial and dropped).
sink_rate() {
    local samples
    samples=$(grep -a "Rx-pps:" "$work/sink.log" | awk '$2 > 0 {print $2}')
    [ "$(wc -l <<<"$samples")" -ge 3 ] && samples=$(sed '1d;$d' <<<"$samples")
    sort -n <<<"$samples" | awk 'NF {a[++n]=$1} END {if (n) print a[int((n+1)/2)] / 1e6; else print 0}'
}

stop_sink() { kill -INT "$1" 2>/dev/null; for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done; kill -9 "$1" 2>/dev/null || true; rm -f "$work/sink.sock"; }

results=()
for round in $(seq "$rounds"); do
    p=$(start_sink)
    setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$work/sink.sock" --size "$size" \
        --duration "$secs" --quiet --ring "${GEN_RING:-256}" txonly >/dev/null
    stop_sink "$p"
    ours=$(sink_rate)
    p=$(start_sink)
    timeout -s INT $((secs + 3)) setsid dpdk-testpmd -l "$gen,$sink_core" --main-lcore "$sink_core" \
        --no-pci --no-huge -m 512 --single-file-segments --file-prefix "gencap$$g" \
        --vdev "net_virtio_user0,path=$work/sink.sock,queues=1" -- --forward-mode=txonly \
        --txpkts="$size" --nb-cores=1 --total-num-mbufs=16384 --stats-period 1 >"$work/gen.log" 2>&1 || true
    stop_sink "$p"
    theirs=$(sink_rate)
    echo "gen-capacity: round $round: ferrovs-gen $ours Mpps, testpmd virtio-user $theirs Mpps" >&2
    results+=("{\"round\":$round,\"ferrovs_gen_mpps\":$ours,\"testpmd_mpps\":$theirs}")
done
printf '%s\n' "${results[@]}" | jq -s --argjson size "$size" '{
  benchmark: "gen-capacity", size: $size,
  ferrovs_gen_mpps: (map(.ferrovs_gen_mpps) | sort | .[(length - 1) / 2 | floor]),
  testpmd_mpps: (map(.testpmd_mpps) | sort | .[(length - 1) / 2 | floor]),
  rounds: .} | . + {ratio: ((.ferrovs_gen_mpps / .testpmd_mpps) * 1000 | round / 1000)}'
