#!/usr/bin/env bash
# The PMD's cost of `ferrovs capture` (issue 21): vhost → vhost forwarding (ferrovs-gen txonly
# on vm1, --sink on vm2, one core; ferrovsd's PMD on the last core) with the capture
#   off      no capture (the hook's one relaxed load per burst per port)
#   nomatch  `ferrovs capture vm1 -w /dev/null tcp port 9`: the filter runs on every packet
#            and rejects it (gen sends UDP)
#   all      `ferrovs capture vm1 -w /dev/null --snaplen S`: every packet copied into the
#            ring (or counted as a capture drop when the ring is full)
# interleaved round by round. Prints JSON: per mode the median Mpps and PMD busy cycles per
# packet (pmd-stats), and their ratios to `off`.
#
#   bench/capture.sh [--rounds N] [--seconds S] [--size BYTES] [--snaplen S]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=3 secs=5 size=64 snaplen=128
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --seconds) secs=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        --snaplen) snaplen=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
command -v jq >/dev/null || bash scripts/deps.sh >/dev/null
cargo build --release --quiet -p ferrovsd -p ferrovs -p ferrovs-gen
bin=$root/target/release
ncpu=$(nproc)
pmd=$((ncpu - 1)); gen=0; [ "$ncpu" -gt 1 ] && gen=$((ncpu - 2))
work=$(mktemp -d /tmp/ferrovs-bench-capture.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
trap 'stop_all; rm -rf "$work"' EXIT INT TERM

# One measurement in mode $1; prints {mpps, lost, cycles_per_packet, capture}.
run() {
    local mode=$1 d=$work/ferrovs
    rm -rf "$d"; mkdir -p "$d"
    setsid "$bin/ferrovsd" --run-dir "$d" --pmd-cores "$pmd" >"$d/log" 2>&1 &
    track $!
    wait_sock "$d/vm2.sock"
    # Warm up (MAC learning).
    setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$d/vm1.sock" --sink "$d/vm2.sock" \
        --size "$size" --duration 1 --quiet --ring 1024 txonly >/dev/null 2>&1 || true
    local cap=
    case $mode in
        nomatch) setsid "$bin/ferrovs" --run-dir "$d" capture vm1 -w /dev/null tcp port 9 2>"$d/capture.err" & cap=$! ;;
        all) setsid "$bin/ferrovs" --run-dir "$d" capture vm1 -w /dev/null --snaplen "$snaplen" 2>"$d/capture.err" & cap=$! ;;
    esac
    if [ -n "$cap" ]; then
        track "$cap"
        for _ in $(seq 100); do grep -q "capturing on" "$d/capture.err" 2>/dev/null && break; sleep 0.05; done
    fi
    "$bin/ferrovs" --run-dir "$d" pmd-stats-clear
    local r; r=$(setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$d/vm1.sock" --sink "$d/vm2.sock" \
        --size "$size" --duration "$secs" --quiet --ring 1024 txonly)
    local st; st=$("$bin/ferrovs" --run-dir "$d" pmd-stats --json)
    local cpp; cpp=$(jq '.[0].cycles_per_packet' <<<"$st")
    stop_all
    jq -c --argjson cpp "$cpp" --arg mode "$mode" '{mode: $mode, mpps, lost, cycles_per_packet: $cpp}' <<<"$r"
}

results=$work/results.jsonl
for round in $(seq "$rounds"); do
    for mode in off nomatch all; do
        r=$(run "$mode")
        log "round $round $mode: $r"
        jq -c --argjson round "$round" '. + {round: $round}' <<<"$r" >>"$results"
    done
done

jq -s --argjson rounds "$rounds" --argjson secs "$secs" --argjson size "$size" --argjson snaplen "$snaplen" '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def ratio($a; $b): if $a and $b then (($a / $b) * 1000 | round / 1000) else null end;
  (group_by(.mode) | map({key: .[0].mode, value: {
      mpps: (map(.mpps) | median),
      cycles_per_packet: (map(.cycles_per_packet // empty) | median),
      lost: (map(.lost // empty) | add),
      runs: map(.mpps)}}) | from_entries) as $by
  | {benchmark: "capture", rounds: $rounds, seconds: $secs, size: $size, snaplen: $snaplen,
     source: "ferrovs-gen txonly vm1 --sink vm2 (one core), capture on vm1 -w /dev/null",
     results: $by,
     ratio_to_off: ($by | to_entries | map({key: .key, value: {
        mpps: ratio(.value.mpps; $by.off.mpps),
        cycles_per_packet: ratio(.value.cycles_per_packet; $by.off.cycles_per_packet)}}) | from_entries)}
' "$results"
