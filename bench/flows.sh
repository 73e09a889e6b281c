#!/usr/bin/env bash
# The flow pipeline under load: 64-byte forwarding through 1, 100 and 10 000 rules with 1,
# 1 000, 100 000 and 1 000 000 distinct flows, ferrovs beside OVS-DPDK on the same rules and
# the same traffic, interleaved in one run; and the time to install 100 000 rules.
#
# Rules (one file per count, for each system; ferrovs names ports vm1/vm2, OVS uses ofport
# 1/2): the rule the traffic hits, `priority=10,in_port=1,ip,nw_dst=10.0.0.2 actions=output:2`,
# plus R-1 rules it never matches but the classifier must consider, in three shapes (three
# subtables): `priority=20,in_port=1,ip,nw_dst=10.200.X.Y actions=drop`,
# `priority=15,in_port=1,udp,tp_dst=N actions=drop` (N != 9) and
# `priority=5,ip,nw_src=172.16.X.Y actions=drop`. Before each set: delete every rule, then
# bulk-load the file (`ferrovs add-flows`, `ovs-ofctl add-flows`).
# Traffic: one ferrovs-gen, txonly 64-byte frames into port 1 as fast as the generator and
# the switch go (`--rate 0`, `--ring 1024`), received on port 2 by the same process
# (`--sink`), 10.0.0.1 -> 10.0.0.2 UDP; F distinct flows by IPv4 source (`--ip-flows F`,
# packet by packet: a new flow every packet). `--settle 1`: attached 1 s before the clock.
# After each run: the megaflows each system holds (ferrovs dump-megaflows, OVS dpctl/dump-
# flows) and the cache levels' hits (ferrovs pmd-stats flow counters, OVS pmd-stats-show).
# Install: wall time of `ferrovs add-flows br0 FILE` (answered once the rules are in the
# datapath and every cached decision revalidated) and `ovs-ofctl add-flows br0 FILE` (and
# with `--bundle`), 100 000 rules `priority=20,ip,nw_dst=10.X.Y.Z actions=drop`.
#
# Placement as in the other benches: PMD on the last core, ferrovs-gen on core 0, every
# process under test started with setsid. Interleaving: each round measures both systems
# (order alternating by round). Figures are medians over --rounds.
#
#   bench/flows.sh [--rounds 3] [--seconds 5] [--rules "1 100 10000"]
#                  [--flows "1 1000 100000 1000000"] [--install 100000] [--peers ovs|none] [--keep]
#                  [--base DIR]
# --base DIR: another ferrovs build (DIR holds its ferrovsd and ferrovs) measured in the same
# rounds as system "ferrovs-base", for A/B comparisons of a change (same generator: this
# tree's ferrovs-gen). ferrovs runs also report PMD busy cycles per packet (pmd-stats).
# Prints one JSON document on stdout (progress on stderr).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=3 secs=5 rules_list="1 100 10000" flows_list="1 1000 100000 1000000" install=100000
peers=ovs keep=0 base_bin=
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --seconds) secs=$2; shift 2 ;;
        --rules) rules_list=$2; shift 2 ;;
        --flows) flows_list=$2; shift 2 ;;
        --install) install=$2; shift 2 ;;
        --peers) peers=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --base) base_bin=$(cd "$2" && pwd); shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[ "$peers" = none ] && peers=
ncpu=$(nproc)
pmd=$((ncpu - 1)); gen=0; [ "$ncpu" -gt 1 ] && gen=$((ncpu - 2))
bin=$root/target/release
bash scripts/deps.sh >/dev/null
cargo build --release --quiet
work=$(mktemp -d /tmp/ferrovs-flows.XXXXXX)
log() { echo "bench: $*" >&2; }
taskset -pc "$gen" $$ >/dev/null
all_cores=0-$((ncpu - 1))

pids=()
sys= sys_pid= fv_dir= port_a= port_b=
# shellcheck source=/dev/null
source scripts/peers/ovs-dpdk.sh
cleanup() {
    [ -n "${_ovs_dir:-}" ] && { ovs_stop >/dev/null 2>&1 || true; }
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.3
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    if [ "$keep" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_sock() { for _ in $(seq 400); do [ -S "$1" ] && return 0; sleep 0.05; done; log "no socket $1"; return 1; }
fvbin=$bin
fv() { "$fvbin/ferrovs" --run-dir "$fv_dir" "$@"; }
now_ms() { local t=${EPOCHREALTIME/./}; echo "$((10#$t / 1000))"; }

# --- rule files ---------------------------------------------------------------------------
# make_rules COUNT P1 P2 FILE
make_rules() {
    local n=$1 p1=$2 p2=$3 f=$4
    awk -v n="$n" -v p1="$p1" -v p2="$p2" 'BEGIN {
        printf "priority=10,in_port=%s,ip,nw_dst=10.0.0.2 actions=output:%s\n", p1, p2
        for (i = 1; i < n; i++) {
            s = i % 3; k = int(i / 3)
            if (s == 0) printf "priority=20,in_port=%s,ip,nw_dst=10.200.%d.%d actions=drop\n", p1, int(k / 250) % 250, k % 250 + 1
            else if (s == 1) printf "priority=15,in_port=%s,udp,tp_dst=%d actions=drop\n", p1, 10 + k % 60000
            else printf "priority=5,ip,nw_src=172.16.%d.%d actions=drop\n", int(k / 250) % 250, k % 250 + 1
        }
    }' >"$f"
}
for r in $rules_list; do
    make_rules "$r" vm1 vm2 "$work/fv-$r.rules"
    make_rules "$r" 1 2 "$work/ovs-$r.rules"
done
awk -v n="$install" 'BEGIN { for (i = 0; i < n; i++) printf "priority=20,ip,nw_dst=10.%d.%d.%d actions=drop\n", int(i / 65536) % 256, int(i / 256) % 256, i % 256 }' >"$work/install.rules"

# --- systems ------------------------------------------------------------------------------
start_system() {
    case $1 in
        ferrovs|ferrovs-base)
            fvbin=$bin
            [ "$1" = ferrovs-base ] && fvbin=$base_bin
            fv_dir=$work/$1-$2
            mkdir -p "$fv_dir"
            setsid taskset -c "$all_cores" "$fvbin/ferrovsd" --run-dir "$fv_dir" --pmd-cores "$pmd" \
                >"$fv_dir/ferrovsd.log" 2>&1 &
            sys_pid=$!; pids+=("$sys_pid")
            port_a=$fv_dir/vm1.sock port_b=$fv_dir/vm2.sock
            wait_sock "$port_a"; wait_sock "$port_b"
            fv config set pmd-rx-mode poll >/dev/null
            ;;
        ovs)
            local d=$work/ovs-$2
            taskset -pc "$all_cores" $$ >/dev/null
            ovs_start "$d" "$pmd" >"$work/ovs-start.log" 2>&1 || { cat "$work/ovs-start.log" >&2; return 1; }
            taskset -pc "$gen" $$ >/dev/null
            port_a=$(ovs_port_path "$d" 1) port_b=$(ovs_port_path "$d" 2)
            wait_sock "$port_a"; wait_sock "$port_b"
            ;;
    esac
    sys=$1
}
stop_system() {
    case $sys in
        ferrovs|ferrovs-base) kill -TERM "$sys_pid" 2>/dev/null || true; wait "$sys_pid" 2>/dev/null || true ;;
        ovs) ovs_stop ;;
    esac
    sys=
}
load_rules() {
    case $sys in
        ferrovs|ferrovs-base) fv del-flows br0 >/dev/null; fv add-flows br0 "$work/fv-$1.rules" >/dev/null ;;
        ovs) ovs-ofctl del-flows br0; ovs-ofctl add-flows br0 "$work/ovs-$1.rules" ;;
    esac
}
# The caches' view: JSON {megaflows, emc_hits, megaflow_hits, upcalls} (cumulative; ferrovs
# also emc_skipped and the PMD's busy_cycles and rx_packets).
caches() {
    case $sys in
        ferrovs|ferrovs-base)
            local mf st
            mf=$(fv dump-megaflows br0 --json | jq length)
            st=$(fv pmd-stats --json)
            jq -c --argjson mf "$mf" '.[0] | {busy_cycles, rx_packets} + (.flow | {megaflows: $mf, emc_hits, megaflow_hits, upcalls, emc_skipped: (.emc_skipped // 0)})' <<<"$st"
            ;;
        ovs)
            local mf s
            mf=$(ovs_appctl dpctl/dump-flows 2>/dev/null | grep -c . || true)
            s=$(ovs_appctl dpif-netdev/pmd-stats-show)
            # Summed over the sections (main thread and PMDs); "simple match" is OVS 3's
            # cache for flows that match on in_port and Ethernet fields only.
            awk -v mf="$mf" '
                /simple match hits:/ { sm += $4 } /emc hits:/ { e += $3 } /smc hits:/ { s += $3 }
                /megaflow hits:/ { m += $3 } /miss with success upcall:/ { u += $5 }
                END { printf "{\"megaflows\":%d,\"simple_match_hits\":%d,\"emc_hits\":%d,\"smc_hits\":%d,\"megaflow_hits\":%d,\"upcalls\":%d}\n", mf, sm, e, s, m, u }' <<<"$s"
            ;;
    esac
}
run_traffic() {
    local flows=$1 out=$2 extra=()
    [ "$flows" -gt 1 ] && extra=(--ip-flows "$flows")
    setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$port_a" --sink "$port_b" --size 64 \
        --ring 1024 --rate 0 --duration "$secs" --settle 1 --quiet "${extra[@]}" txonly \
        >"$out.gen" 2>"$out.err" &
    local gp=$!; pids+=("$gp")
    wait "$gp" || true
    kill -0 "$sys_pid" 2>/dev/null || [ "$sys" = ovs ] || { log "ferrovsd died"; tail "$fv_dir/ferrovsd.log" >&2; exit 1; }
    tail -1 "$out.gen"
}

results=$work/results.jsonl
: >"$results"
for round in $(seq "$rounds"); do
    order="ferrovs${base_bin:+ ferrovs-base}${peers:+ $peers}"
    [ $((round % 2)) = 0 ] && order=$(tr ' ' '\n' <<<"$order" | tac | tr '\n' ' ')
    for s in $order; do
        start_system "$s" "$round"
        for r in $rules_list; do
            load_rules "$r"
            for f in $flows_list; do
                c1=$(caches)
                g=$(run_traffic "$f" "$work/$s-$round-$r-$f")
                c2=$(caches)
                jq -c -n --arg sys "$s" --argjson round "$round" --argjson rules "$r" --argjson flows "$f" \
                    --argjson g "$g" --argjson c1 "$c1" --argjson c2 "$c2" '
                    {sys: $sys, round: $round, rules: $rules, flows: $flows, mpps: $g.mpps,
                     sent: $g.sent, received: $g.received, lost: $g.lost, megaflows: $c2.megaflows,
                     emc_hits: ($c2.emc_hits - $c1.emc_hits), megaflow_hits: ($c2.megaflow_hits - $c1.megaflow_hits),
                     upcalls: ($c2.upcalls - $c1.upcalls)}
                    + (if $c2.busy_cycles == null then {} else
                       {emc_skipped: ($c2.emc_skipped - $c1.emc_skipped),
                        cycles_per_packet: (($c2.busy_cycles - $c1.busy_cycles) / ([$c2.rx_packets - $c1.rx_packets, 1] | max) | round)} end)' | tee -a "$results" >&2
            done
        done
        # Install time, on a bridge with only its default rule.
        case $s in
            ferrovs|ferrovs-base)
                fv del-flows br0 >/dev/null
                t0=$(now_ms); fv add-flows br0 "$work/install.rules" >/dev/null; t1=$(now_ms)
                n=$(fv dump-flows br0 --json | jq length)
                jq -c -n --arg sys "$s" --argjson round "$round" --argjson ms $((t1 - t0)) --argjson n "$n" \
                    '{sys: $sys, round: $round, install_ms: $ms, installed: $n}' | tee -a "$results" >&2
                ;;
            ovs)
                ovs-ofctl del-flows br0
                t0=$(now_ms); ovs-ofctl add-flows br0 "$work/install.rules"; t1=$(now_ms)
                n=$(ovs-ofctl dump-aggregate br0 | sed -n 's/.*flow_count=\([0-9]*\).*/\1/p')
                ovs-ofctl del-flows br0
                t2=$(now_ms); ovs-ofctl --bundle add-flows br0 "$work/install.rules" 2>/dev/null || true; t3=$(now_ms)
                jq -c -n --arg sys ovs --argjson round "$round" --argjson ms $((t1 - t0)) --argjson b $((t3 - t2)) --argjson n "${n:-0}" \
                    '{sys: $sys, round: $round, install_ms: $ms, install_bundle_ms: $b, installed: $n}' | tee -a "$results" >&2
                ;;
        esac
        stop_system
    done
done

jq -s --arg date "$(date -u +%F)" --argjson rounds "$rounds" --argjson secs "$secs" '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def r2: . * 100 | round / 100;
  [.[] | select(.flows != null)] as $runs |
  [.[] | select(.install_ms != null)] as $inst |
  ($runs | group_by([.sys, .rules, .flows]) | map({
      sys: .[0].sys, rules: .[0].rules, flows: .[0].flows,
      mpps: (map(.mpps) | median), mpps_by_round: map(.mpps),
      lost: (map(.lost) | median), megaflows: (map(.megaflows) | median),
      emc_hits: (map(.emc_hits) | median), megaflow_hits: (map(.megaflow_hits) | median),
      upcalls: (map(.upcalls) | median),
      cycles_per_packet: (map(.cycles_per_packet // empty) | median)})) as $cells |
  def cell($s; $r; $f): $cells | map(select(.sys == $s and .rules == $r and .flows == $f)) | .[0];
  {
    benchmark: "flows", date: $date, rounds: $rounds, seconds: $secs,
    method: "64-byte vm1->vm2 through the rules, ferrovs-gen txonly --rate 0 --sink, --ip-flows F; medians over rounds",
    cells: $cells,
    ratios_ferrovs_over_ovs: [$cells[] | select(.sys == "ferrovs") | . as $c |
        (cell("ovs"; $c.rules; $c.flows)) as $o | select($o != null) |
        {rules: $c.rules, flows: $c.flows, ratio: (($c.mpps / $o.mpps) | r2)}],
    ratios_ferrovs_over_base: [$cells[] | select(.sys == "ferrovs") | . as $c |
        (cell("ferrovs-base"; $c.rules; $c.flows)) as $o | select($o != null) |
        {rules: $c.rules, flows: $c.flows, ratio: (($c.mpps / $o.mpps) | r2),
         cycles_per_packet: [$o.cycles_per_packet, $c.cycles_per_packet]}],
    million_over_single: [$cells | map(.sys) | unique | .[] as $s | ($cells | map(select(.sys == $s)) | map(.rules) | unique | .[]) as $r |
        cell($s; $r; 1) as $one | cell($s; $r; 1000000) as $m | select($one != null and $m != null) |
        {sys: $s, rules: $r, ratio: (($m.mpps / $one.mpps) | r2)}],
    install: ($inst | group_by(.sys) | map({sys: .[0].sys, ms: (map(.install_ms) | median),
        bundle_ms: (map(.install_bundle_ms // empty) | median), installed: (map(.installed) | median)})),
    raw: .
  }
  | .goals = {
      million_flows_within_30pct_of_single: [.million_over_single[] | select(.sys == "ferrovs") | {rules, ratio, holds: (.ratio >= 0.7)}],
      ahead_of_ovs: [.ratios_ferrovs_over_ovs[] | {rules, flows, ratio, holds: (.ratio > 1)}]
    }' "$results"
