#!/usr/bin/env bash
# What dirty-page logging (live migration, source side) costs the datapath.
#
# vhost → vhost forwarding through ferrovs as in bench/vhost-fwd.sh (PMD on the last core,
# ferrovs-gen txonly --sink on the other: one process, every packet accounted for), three
# setups interleaved round by round:
#   base  by default (--base nolog): this source with live-migration support compiled out
#         (the dirty-log choice per burst made constant "off", the postcopy checks of rings
#         and copies constant "no"; the compiler then drops those paths), i.e. the datapath
#         as it would be without migration support; or (--base REV) ferrovsd built at REV
#   off   this ferrovsd, logging off                       ("nothing while off": off/base)
#   on    this ferrovsd with both ports logging, as during a migration: ferrovs-gen --log
#         sets VHOST_F_LOG_ALL and a shared log on both ports and takes (clears) the log
#         every 10 ms as QEMU's migration thread does              ("< 5 % while on": on/off)
# Prints JSON: per setup and frame size the median Mpps and PMD busy cycles per packet over
# the rounds, every run, and the ratios. Results: bench/results-dirty-log-DATE.json.
#
#   bench/dirty-log.sh [--rounds N] [--seconds S] [--sizes "64 1518"] [--base nolog|REV]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=5 secs=5 sizes="64 1518" base_rev=nolog
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --seconds) secs=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --base) base_rev=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
log() { echo "bench: $*" >&2; }
bash scripts/deps.sh >/dev/null
cargo build --release --quiet
bin=$root/target/release
# The baseline daemon, built once per revision in its own worktree and target directory.
rev=$base_rev
[ "$base_rev" = nolog ] && rev=HEAD
sha=$(git rev-parse --short "$rev")
base_dir=/tmp/ferrovs-bench-base-$base_rev-$sha
if [ ! -x "$base_dir/target/release/ferrovsd" ]; then
    log "building ferrovsd at $sha ($base_rev, the baseline) in $base_dir"
    rm -rf "$base_dir"
    git worktree prune
    git worktree add --detach "$base_dir" "$sha" >/dev/null
    if [ "$base_rev" = nolog ]; then
        # Compile live-migration support out: each replacement must apply exactly once.
        python3 - "$base_dir" <<'PATCH'
import sys
root = sys.argv[1]
edits = [
    ("crates/vhost/src/virtqueue/dirty_log.rs",
     "        if self.log_all {\n            self.log.as_ref()\n        } else {\n            None\n        }",
     "        None"),
    ("crates/vhost/src/virtqueue/mod.rs",
     "        if !self.pending_sync && !mem.in_postcopy() {\n            return true;\n        }",
     "        let _ = mem;\n        return true;"),
    ("crates/sys/src/guest/memory.rs",
     "        if self.in_postcopy() {\n            self.check_resident(ri, off, len)?;\n        }",
     ""),
]
for path, old, new in edits:
    p = f"{root}/{path}"
    s = open(p).read()
    if s.count(old) != 1:
        sys.exit(f"nolog baseline: the code of {path} changed; update bench/dirty-log.sh")
    open(p, "w").write(s.replace(old, new))
PATCH
    fi
    (cd "$base_dir" && CARGO_TARGET_DIR=$base_dir/target cargo build --release --quiet -p ferrovsd)
fi
base_bin=$base_dir/target/release
ncpu=$(nproc)
pmd=$((ncpu - 1)); gen=0; [ "$ncpu" -gt 1 ] && gen=$((ncpu - 2))
work=$(mktemp -d /tmp/ferrovs-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT INT TERM

wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; log "no socket $1"; return 1; }

gen_run() {
    local d=$1 size=$2 extra=${3:-}
    # shellcheck disable=SC2086
    setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$d/vm1.sock" --sink "$d/vm2.sock" \
        --size "$size" --duration "$secs" --quiet --ring 1024 $extra txonly 2>"$d/gen.err"
}

# run SETUP SIZE: one measurement; prints a JSON line.
run() {
    local setup=$1 size=$2 d=$work/$1 daemon=$bin/ferrovsd extra=""
    [ "$setup" = base ] && daemon=$base_bin/ferrovsd
    [ "$setup" = on ] && extra=--log
    rm -rf "$d"; mkdir -p "$d"
    setsid taskset -c "$pmd" "$daemon" --run-dir "$d" --pmd-cores "$pmd" >"$d/log" 2>&1 &
    local p=$!; pids+=("$p")
    wait_sock "$d/vm2.sock"
    gen_run "$d" "$size" >/dev/null || true   # warm-up: MAC learning, pages touched
    "$bin/ferrovs" --run-dir "$d" pmd-stats-clear
    local r; r=$(gen_run "$d" "$size" "$extra")
    local st; st=$("$bin/ferrovs" --run-dir "$d" pmd-stats --json)
    local ps; ps=$("$bin/ferrovs" --run-dir "$d" port-stats --json)
    local cpp; cpp=$(jq '.[0].cycles_per_packet' <<<"$st")
    local dirty; dirty=$(jq '[.[] | (.rx.dirty_pages_logged // 0) + (.tx.dirty_pages_logged // 0)] | add' <<<"$ps")
    kill "$p"; wait "$p" 2>/dev/null || true
    jq -c --argjson cpp "$cpp" --argjson dirty "${dirty:-0}" \
        '{mpps, received, sent, lost, cycles_per_packet: $cpp, dirty_pages_logged: $dirty}' <<<"$r"
}

results=$work/results.jsonl
: >"$results"
for round in $(seq "$rounds"); do
    for size in $sizes; do
        for setup in base off on; do
            r=$(run "$setup" "$size")
            log "round $round size $size $setup: $r"
            jq -c --arg setup "$setup" --argjson size "$size" --argjson round "$round" \
                '. + {setup: $setup, size: $size, round: $round}' <<<"$r" >>"$results"
        done
    done
done

out=$(jq -s --argjson rounds "$rounds" --argjson secs "$secs" --arg base "$base_rev" '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def ratio(a; b): if a and b and b > 0 then (a / b * 1000 | round / 1000) else null end;
  group_by(.size) | map(
    (.[0].size) as $size
    | (group_by(.setup) | map({key: .[0].setup, value: {
          mpps: (map(.mpps) | median),
          cycles_per_packet: (map(.cycles_per_packet // empty) | median),
          lost: (map(.lost) | add),
          dirty_pages_logged: (map(.dirty_pages_logged) | add),
          runs: map(.mpps)}}) | from_entries) as $by
    # Per round ratios too: rounds are interleaved, so a ratio within a round is the least
    # disturbed by the host'"'"'s noise.
    | (group_by(.round) | map(
          (map({key: .setup, value: .mpps}) | from_entries) as $r
          | {on_over_off: ratio($r.on; $r.off), off_over_base: ratio($r.off; $r.base)})) as $per_round
    | {size: $size, results: $by,
       on_over_off: ratio($by.on.mpps; $by.off.mpps),
       off_over_base: ratio($by.off.mpps; $by.base.mpps),
       per_round: $per_round,
       on_over_off_median_of_rounds: ($per_round | map(.on_over_off // empty) | median),
       off_over_base_median_of_rounds: ($per_round | map(.off_over_base // empty) | median)})
  | {benchmark: "dirty-log", rounds: $rounds, seconds: $secs, base_rev: $base,
     generator: "ferrovs-gen txonly --sink (one core); on: --log (both ports logging, log taken every 10 ms)",
     sizes: .}
' "$results")
echo "$out"
echo "$out" >"bench/results-dirty-log-$(date +%F).json"
