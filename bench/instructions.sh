#!/usr/bin/env bash
# Instructions per forwarded packet of the PMD thread, this tree against an older build (A/B):
# the figure that settles "within noise" questions on a host whose packet rates swing 2x between
# runs (shared, 2 cores, no hardware performance counters). Valgrind's callgrind counts every
# instruction the PMD thread retires, whatever else the machine does.
#
# Each build runs under callgrind (one PMD thread, its core unset: valgrind serialises threads
# anyway) with ferrovs-gen as the traffic (txonly on vm1.sock with --sink on vm2.sock, 64 B, max
# rate: under valgrind the PMD is ~50x slower than the generator, so it is saturated and every
# poll finds a full burst, as at line rate natively). After a warm-up (MAC learning), callgrind's
# counters and the PMD's are zeroed, the generator runs --seconds, then both are read: the PMD
# thread's instructions (Ir) divided by the packets it received. Also reported: packets per PMD
# iteration (the burst fill, which amortises per-iteration work: it must match between builds for
# the comparison to hold).
#
# Source of traffic: ferrovs-gen (our own generator; what matters here is the instruction count
# of the same work in both builds, not a rate).
#
# --keep DIR keeps each run's callgrind dump of the PMD thread there (WHO-ROUND.callgrind), for
# `callgrind_annotate` to say where the instructions went.
#
#   bench/instructions.sh --base REV [--rounds N] [--seconds S] [--keep DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=2 secs=8 base_rev= keep=
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --seconds) secs=$2; shift 2 ;;
        --base) base_rev=$2; shift 2 ;;
        --keep) keep=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -n "$base_rev" ] || { echo "usage: bench/instructions.sh --base REV [--rounds N] [--seconds S]" >&2; exit 2; }
bash scripts/deps.sh >/dev/null
cargo build --release --quiet
bin=$root/target/release
sha=$(git rev-parse --short "$base_rev")
base_dir=/tmp/ferrovs-bench-base-$sha
if [ ! -x "$base_dir/target/release/ferrovsd" ]; then
    echo "bench: building $sha (the baseline) in $base_dir" >&2
    rm -rf "$base_dir"; git worktree prune
    git worktree add --detach "$base_dir" "$sha" >/dev/null
    (cd "$base_dir" && cargo build --release --quiet -p ferrovsd -p ferrovs)
fi
work=$(mktemp -d /tmp/ferrovs-instr.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT INT TERM
log() { echo "bench: $*" >&2; }

# One measurement of the build in $1; prints {ir_per_packet, packets, packets_per_iteration}.
measure() {
    local b=$1 d=$work/run
    rm -rf "$d" "$work"/cg.*; mkdir -p "$d"
    setsid valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$work/cg.%p" \
        "$b/ferrovsd" --run-dir "$d" >"$work/vg.log" 2>&1 &
    local p=$!; pids+=("$p")
    for _ in $(seq 300); do [ -S "$d/vm2.sock" ] && break; sleep 0.1; done
    [ -S "$d/vm2.sock" ] || { log "ferrovsd under valgrind did not start: $(tail -3 "$work/vg.log")"; return 1; }
    local gen=("$bin/ferrovs-gen" --socket "$d/vm1.sock" --sink "$d/vm2.sock" --size 64 --quiet --ring 1024)
    setsid "${gen[@]}" --duration 2 txonly >/dev/null
    # valgrind's own pid is the daemon's: callgrind_control finds it by pid.
    callgrind_control -z "$p" >/dev/null 2>&1
    "$b/ferrovs" --run-dir "$d" pmd-stats-clear >/dev/null
    setsid "${gen[@]}" --duration "$secs" txonly >"$work/gen.json"
    local st; st=$("$b/ferrovs" --run-dir "$d" pmd-stats --json)
    callgrind_control -d "$p" >/dev/null 2>&1
    kill -INT "$p"; wait "$p" 2>/dev/null || true
    # The dump of the PMD thread: the thread whose counts are by far the largest.
    local f pmd= ir=0 n
    for f in "$work"/cg.*.1-*; do
        n=$(sed -n 's/^summary: //p' "$f")
        [ "${n:-0}" -gt "$ir" ] && { ir=$n; pmd=$f; }
    done
    [ -n "$keep" ] && [ -n "$pmd" ] && cp "$pmd" "$keep/$2.callgrind"
    local pk it; pk=$(jq '.[0].rx_packets' <<<"$st"); it=$(jq '.[0].iterations' <<<"$st")
    jq -n -c --argjson ir "${ir:-0}" --argjson pk "$pk" --argjson it "$it" \
        '{ir_per_packet: (if $pk > 0 then ($ir / $pk * 10 | round / 10) else null end), packets: $pk,
          packets_per_iteration: (if $it > 0 then ($pk / $it * 10 | round / 10) else null end)}'
}

[ -z "$keep" ] || mkdir -p "$keep"
results=$work/results.jsonl
: >"$results"
for round in $(seq "$rounds"); do
    for who in ferrovs ferrovs-base; do
        case $who in
            ferrovs) r=$(measure "$bin" "$who-$round") ;;
            ferrovs-base) r=$(measure "$base_dir/target/release" "$who-$round") ;;
        esac
        log "round $round $who: $r"
        jq -c --arg who "$who" --argjson round "$round" '. + {who: $who, round: $round}' <<<"$r" >>"$results"
    done
done
jq -s -c --arg base "$sha" --arg head "$(git rev-parse --short HEAD)" --argjson secs "$secs" '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  (map(select(.who == "ferrovs")) | map(.ir_per_packet) | median) as $a
  | (map(select(.who == "ferrovs-base")) | map(.ir_per_packet) | median) as $b
  | {bench: "instructions", source: "ferrovs-gen txonly --sink, 64 B, PMD under valgrind callgrind (saturated)",
     head: $head, base: $base, seconds: $secs, rounds: ., ir_per_packet: $a, base_ir_per_packet: $b,
     ratio_to_base: (if $b > 0 then ($a / $b * 1000 | round / 1000) else null end)}' "$results"
