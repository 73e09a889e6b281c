#!/usr/bin/env bash
# Connection tracking under load: a stateful firewall pipeline, ferrovs beside OVS-DPDK
# (Debian's ovs-vswitchd-dpdk 3.1, netdev datapath, dpdkvhostuser ports) with the same ct()
# rules and the same traffic, interleaved in one run.
#
# The pipeline (ferrovs names the ports vm1/vm2, OVS uses ofport 1/2; OVS requires `ip` on
# a rule whose actions hold ct(commit), so both tables' ct rules carry it):
#   table=0,priority=10,ip,ct_state=-trk            actions=ct(table=1,zone=1)
#   table=0,priority=0                              actions=drop
#   table=1,priority=10,ip,ct_state=+trk+new        actions=ct(commit,zone=1),output:2
#   table=1,priority=10,ip,ct_state=+trk+est        actions=output:2
#   table=1,priority=0                              actions=drop
#
# (a) established: 64-byte frames port 1 -> port 2 through F established UDP connections,
#     F in --flows (1, 1 000, 100 000, 1 000 000). A one-way UDP flow stays ct_state=+new in
#     both trackers (Linux's semantics, and OVS 3.1's: checked, every packet hits the commit
#     rule), so each cell first makes its connections established:
#       warm  ferrovs-gen txonly into port 1 (--ip-flows F, --warm-rate pps, --warm-passes
#             times over every flow) while DPDK testpmd (one net_virtio_user port on port 2,
#             --forward-mode=5tswap) sends each packet back with its addresses and ports
#             swapped: the reply the tracker needs (it enters table 1 as +est+rpl and its
#             output:2 is to its own input port, so it goes nowhere).
#       measure  ferrovs-gen txonly --sink: the same F flows (its walk is deterministic)
#             into port 1 as fast as the switch takes them (--rate 0, --ring 1024), received
#             on port 2 by the same thread, for --seconds after a 1 s settle.
#     A cell whose measured packets were less than 99 % established (the rules' packet
#     counters) is warmed and measured again, up to --warm-tries times (the table is not
#     flushed in between: the warm-up only adds replies).
#     Reported: Mpps received; the share of measured packets that hit the +est rule
#     (est_fraction, 1.0 = every connection was established) and the warm-ups it took; the
#     entries each switch held after the cell (OVS `dpctl/ct-get-nconns`, the count that
#     `dpctl/dump-conntrack | wc -l` gives without printing a million lines; ferrovs
#     `conntrack-stats`'s entries); busy PMD cycles per packet (ferrovs pmd-stats, OVS
#     pmd-stats-show's "avg processing cycles per packet").
#     Source: ferrovs-gen, our own generator. testpmd cannot be the source here: every port
#     testpmd forwards on also transmits (flowgen/txonly send on each forwarding stream;
#     `port 1 txq 0 stop` is unsupported by net_virtio_user), so a testpmd that drains port 2
#     also floods it, and one testpmd per port would share the traffic core and drop at the
#     sink whenever the scheduler switches.
# (b) connection setup rate: every packet a new connection through ct(commit).
#     testpmd  (the headline, a source we did not write) one testpmd, two net_virtio_user
#              ports, --forward-mode=flowgen --flowgen-flows=2^31-1: UDP 10.254.0.0:1000 ->
#              10.253.0.0+i:1001, one destination per packet and never repeated in the run;
#              testpmd sends on both ports (see above) and the switch commits every packet
#              from either (those from port 2 go out to their own input port: nowhere).
#     gen      ferrovs-gen txonly --sink --ip-flows 8 000 000 (source address per packet).
#     Rate: new connections per second = growth of the switch's connection count (if it
#     cannot say it: of the packets through the commit rule, "counted_by"), sampled
#     every 0.2 s, from 1 s (the settle) after the count grew by 100 to its last growth,
#     leaving out samples at 90 % of the table's limit and above (--ct-max, set on both:
#     OVS `dpctl/ct-set-maxconns`, ferrovs the config key in $FERROVS_CT_MAX_KEY if it has
#     one, else its default; the limit in force is reported). Before every cell both tables
#     are flushed.
#     TCP handshakes at rate: no tool on this machine completes TCP handshakes at millions
#     per second through a vhost-user port (testpmd has no TCP engine, ferrovs-gen sends UDP
#     only), so the setup rate is UDP only; the JSON says so.
#
# Placement as in the other benches: PMD on the last core, traffic on core 0, every process
# under test started with setsid. Interleaving: each round measures both systems (order
# alternating by round). Figures are medians over --rounds; ratios are ferrovs / OVS of the
# same run.
#
#   bench/conntrack.sh [--rounds 3] [--seconds 5] [--flows "1 1000 100000 1000000"]
#                      [--setup-seconds 3] [--setup "testpmd gen"] [--warm-rate 200000]
#                      [--warm-passes 3] [--warm-tries 3] [--ct-max 4000000]
#                      [--peers "ferrovs ovs"] [--note TEXT] [--keep]
# --note TEXT is copied into the JSON (e.g. "busy machine"); --keep keeps the work directory.
# Prints one JSON document on stdout (progress on stderr).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=3 secs=5 flows_list="1 1000 100000 1000000" setup_secs=3 setup_sources="testpmd gen"
warm_rate=200000 warm_passes=3 warm_tries=3 ct_max=4000000 systems="ferrovs ovs" note="" keep=0
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --seconds) secs=$2; shift 2 ;;
        --flows) flows_list=$2; shift 2 ;;
        --setup-seconds) setup_secs=$2; shift 2 ;;
        --setup) setup_sources=$2; shift 2 ;;
        --warm-rate) warm_rate=$2; shift 2 ;;
        --warm-passes) warm_passes=$2; shift 2 ;;
        --warm-tries) warm_tries=$2; shift 2 ;;
        --ct-max) ct_max=$2; shift 2 ;;
        --peers) systems=$2; shift 2 ;;
        --note) note=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
# The ferrovs config key of the global connection limit (`ferrovs config set ct-max-entries N`).
ct_max_key=${FERROVS_CT_MAX_KEY:-ct-max-entries}
for t in jq ovs-ofctl ovs-appctl dpdk-testpmd; do
    command -v "$t" >/dev/null || { echo "bench: $t is missing (scripts/deps.sh)" >&2; exit 1; }
done
bash scripts/deps.sh >/dev/null
cargo build --release --quiet -p ferrovsd -p ferrovs -p ferrovs-gen
bin=${CARGO_TARGET_DIR:-$root/target}/release
ncpu=$(nproc)
pmd=$((ncpu - 1)); gen=0; [ "$ncpu" -gt 1 ] && gen=$((ncpu - 2))
all_cores=0-$((ncpu - 1))
work=$(mktemp -d /tmp/ferrovs-bench-conntrack.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
# shellcheck source=scripts/peers/ovs-dpdk.sh
source scripts/peers/ovs-dpdk.sh
ovs_up=
cleanup() {
    [ -n "$ovs_up" ] && { ovs_stop >/dev/null 2>&1 || true; }
    stop_all
    if [ "$keep" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
taskset -pc "$gen" $$ >/dev/null

sys= fv_dir= fv_pid= port_a= port_b= refl_pid= restarts=0
fv() { "$bin/ferrovs" --run-dir "$fv_dir" "$@"; }
now() { echo "$EPOCHREALTIME"; }

# --- rules ----------------------------------------------------------------------------------
make_rules() {
    local p2=$1
    cat <<EOF
table=0,priority=10,ip,ct_state=-trk actions=ct(table=1,zone=1)
table=0,priority=0 actions=drop
table=1,priority=10,ip,ct_state=+trk+new actions=ct(commit,zone=1),output:$p2
table=1,priority=10,ip,ct_state=+trk+est actions=output:$p2
table=1,priority=0 actions=drop
EOF
}
make_rules vm2 >"$work/fv.rules"
make_rules 2 >"$work/ovs.rules"

# --- systems --------------------------------------------------------------------------------
start_system() {
    sys=$1
    case $sys in
        ferrovs)
            fv_dir=$work/ferrovs-$2
            mkdir -p "$fv_dir"
            setsid taskset -c "$all_cores" "$bin/ferrovsd" --run-dir "$fv_dir" --pmd-cores "$pmd" \
                >"$fv_dir/ferrovsd.log" 2>&1 &
            fv_pid=$!
            track "$fv_pid"
            port_a=$fv_dir/vm1.sock port_b=$fv_dir/vm2.sock
            wait_sock "$port_a"; wait_sock "$port_b"
            fv config set pmd-rx-mode poll >/dev/null
            fv config set "$ct_max_key" "$ct_max" >/dev/null 2>&1 ||
                log "ferrovs: no config key $ct_max_key: its default connection limit stays"
            fv del-flows br0 >/dev/null
            fv add-flows br0 "$work/fv.rules" >"$work/fv-add.log" 2>&1 ||
                { log "ferrovs refused the rules: $(tail -2 "$work/fv-add.log")"; return 1; }
            ;;
        ovs)
            local d=$work/ovs-$2
            taskset -pc "$all_cores" $$ >/dev/null
            ovs_start "$d" "$pmd" >"$work/ovs-start.log" 2>&1 || { cat "$work/ovs-start.log" >&2; return 1; }
            ovs_up=1
            taskset -pc "$gen" $$ >/dev/null
            port_a=$(ovs_port_path "$d" 1) port_b=$(ovs_port_path "$d" 2)
            wait_sock "$port_a"; wait_sock "$port_b"
            ovs_appctl dpctl/ct-set-maxconns "$ct_max" >/dev/null
            ovs-ofctl del-flows br0
            ovs-ofctl add-flows br0 "$work/ovs.rules"
            ;;
    esac
}
stop_system() {
    case $sys in
        ferrovs) stop_all ;;
        ovs) ovs_stop >/dev/null 2>&1 || true; ovs_up= ;;
    esac
    sys=
}
# The connections the switch holds now (null if it cannot say).
ct_entries() {
    case $sys in
        ferrovs) { fv conntrack-stats --json 2>/dev/null || echo '{}'; } | jq '.entries // null' ;;
        ovs) ovs_appctl dpctl/ct-get-nconns 2>/dev/null || echo null ;;
    esac
}
ct_limit() {
    case $sys in
        ferrovs) { fv conntrack-stats --json 2>/dev/null || echo '{}'; } | jq '.max_entries // null' ;;
        ovs) ovs_appctl dpctl/ct-get-maxconns 2>/dev/null || echo null ;;
    esac
}
ct_flush() {
    case $sys in
        # A ferrovs without flush-conntrack: a fresh daemon has an empty table.
        ferrovs) fv flush-conntrack >/dev/null 2>&1 || {
                restarts=$((restarts + 1))
                stop_system; start_system ferrovs "$round-$restarts"
                limit=$(ct_limit)
            } ;;
        ovs) ovs_appctl dpctl/flush-conntrack >/dev/null ;;
    esac
}
# Packets that hit table 1's commit rule and its established rule so far: {new, est}.
rule_hits() {
    case $sys in
        ferrovs)
            { fv dump-flows br0 --json 2>/dev/null || echo '[]'; } | jq -c '
                def hits($s): [.[] | select(.table == 1 and (.flow | test($s))) | .n_packets] | add // 0;
                {new: hits("\\+new"), est: hits("\\+est")}' ;;
        ovs)
            ovs-ofctl dump-flows br0 table=1 | awk '
                { n = 0; if (match($0, /n_packets=[0-9]+/)) n = substr($0, RSTART + 10, RLENGTH - 10) }
                /\+new/ { nw += n } /\+est/ { es += n }
                END { printf "{\"new\":%d,\"est\":%d}\n", nw, es }' ;;
    esac
}
# PMD cycles: ferrovs {busy_cycles, rx_packets} (cumulative), OVS clears its counters.
pmd_mark() {
    case $sys in
        ferrovs) fv pmd-stats --json | jq -c '.[0] | {busy_cycles, rx_packets}' ;;
        ovs) ovs_pmd_clear "$_ovs_dir"; echo '{}' ;;
    esac
}
# Busy PMD cycles per received packet since pmd_mark printed $1.
pmd_cpp() {
    case $sys in
        ferrovs) fv pmd-stats --json | jq --argjson m "$1" '.[0] |
            ((.busy_cycles - $m.busy_cycles) / ([.rx_packets - $m.rx_packets, 1] | max) | round)' ;;
        ovs) ovs_cycles_per_packet "$_ovs_dir" | awk 'NF { printf "%.0f\n", $1; ok = 1 } END { if (!ok) print "null" }' ;;
    esac
}
alive() {
    case $sys in
        ferrovs) kill -0 "$fv_pid" 2>/dev/null ;;
        ovs) ovs_appctl version >/dev/null 2>&1 ;;
    esac
}

# --- traffic --------------------------------------------------------------------------------
# testpmd on port B answering every packet with its tuple swapped (the warm-up's replies).
start_reflector() {
    local d=$work/refl
    mkdir -p "$d"
    rm -f "$d/log"
    setsid dpdk-testpmd --lcores "0@$gen,1@$gen" --main-lcore 0 --no-pci --no-huge -m 512 \
        --single-file-segments --file-prefix "ctbench-refl-$$" \
        --vdev "net_virtio_user0,path=$port_b,queues=1,queue_size=1024" -- \
        --forward-mode=5tswap --port-topology=loop --nb-cores=1 --rxd=1024 --txd=1024 \
        --total-num-mbufs=16384 --stats-period 1 --auto-start >"$d/log" 2>&1 &
    refl_pid=$!
    track "$refl_pid"
    # Up once it forwards (its first periodic statistics).
    for _ in $(seq 100); do grep -aq "Rx-pps" "$d/log" && return 0; sleep 0.1; done
    log "reflector did not start: $(grep -a -m3 -i 'error\|cause' "$d/log" | tr '\n' ' ')"
    return 1
}
# gen_args FLOWS: ferrovs-gen's flow options for F connections.
gen_args() { [ "$1" -gt 1 ] && echo "--ip-flows $1"; true; }
warm() {
    local f=$1 dur
    # Every flow --warm-passes times at --warm-rate, and 1 s more.
    dur=$(((warm_passes * f + warm_rate - 1) / warm_rate + 1))
    [ "$dur" -lt 3 ] && dur=3
    start_reflector || return 1
    # shellcheck disable=SC2046
    setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$port_a" --size 64 --ring 1024 \
        --rate "$warm_rate" --duration "$dur" --settle 1 --quiet $(gen_args "$f") txonly \
        >"$work/warm.out" 2>"$work/warm.err" || log "warm-up generator: $(tail -1 "$work/warm.err")"
    stop_pid "$refl_pid"
}
measure() {
    local f=$1 out=$2
    # shellcheck disable=SC2046
    setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$port_a" --sink "$port_b" --size 64 \
        --ring 1024 --rate 0 --duration "$secs" --settle 1 --quiet $(gen_args "$f") txonly \
        >"$out.gen" 2>"$out.err" &
    local gp=$!
    track "$gp"
    wait "$gp" || true
    tail -1 "$out.gen"
}
# Samples "time entries commits" every 0.2 s into $1 while $2 (a pid) runs, until 1 s (the
# settle) + --setup-seconds after the count grew by 100, or 20 s more than that in all.
# commits: packets through the commit rule, the count used when the switch cannot say its
# entries.
sample_entries() {
    local f=$1 p=$2 e c t first= t_end base=
    t_end=$(awk -v t="$(now)" -v s="$setup_secs" 'BEGIN { printf "%.6f", t + s + 21 }')
    : >"$f"
    while kill -0 "$p" 2>/dev/null; do
        t=$(now); e=$(ct_entries); c=$(rule_hits | jq .new)
        echo "$t $e $c" >>"$f"
        [ "$e" = null ] && e=$c
        [ -z "$base" ] && base=$e
        [ -z "$first" ] && [ $((e - base)) -ge 100 ] && first=$t
        [ -n "$first" ] && awk -v a="$first" -v b="$t" -v s="$setup_secs" 'BEGIN { exit !(b - a >= s + 1) }' && break
        awk -v a="$t_end" -v b="$t" 'BEGIN { exit !(b >= a) }' && { log "setup: no connections counted"; break; }
        sleep 0.2
    done
}
# New connections per second from the samples in $1 (limit $2): from 1 s after the count
# first grew by 100 to its last growth, leaving out samples from 90 % of the limit on.
setup_rate() {
    awk -v lim="$2" '
        { n++; t[n] = $1; e[n] = ($2 == "null" ? $3 : $2) }
        END {
            for (i = 1; i <= n && e[i] - e[1] < 100; i++);
            if (i > n) { print "null"; exit }
            t1 = t[i] + 1
            for (a = i; a <= n && t[a] < t1; a++);
            b = 0
            for (j = a + 1; j <= n; j++)
                if (e[j] > e[j - 1] && (lim == "null" || e[j] < 0.9 * lim)) b = j
            if (a <= n && b > a && t[b] > t[a]) printf "%.0f\n", (e[b] - e[a]) / (t[b] - t[a]); else print "null"
        }' "$1"
}
# What the samples in $1 counted: "entries", or "commit_rule_packets" without an entry count.
counted_by() { awk 'NR == 1 { print ($2 == "null" ? "commit_rule_packets" : "entries") }' "$1"; }
stop_pid() {
    kill -INT "$1" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
setup_testpmd() {
    local out=$1 d=$work/fg p
    mkdir -p "$d"
    setsid dpdk-testpmd -l "$gen,$pmd" --main-lcore "$pmd" \
        --no-pci --no-huge -m 1024 --single-file-segments --file-prefix "ctbench-fg-$$" \
        --vdev "net_virtio_user0,path=$port_a,queues=1,queue_size=1024" \
        --vdev "net_virtio_user1,path=$port_b,queues=1,queue_size=1024" -- \
        --forward-mode=flowgen --flowgen-flows=2147483647 --txpkts=64 --nb-cores=1 \
        --rxd=1024 --txd=1024 --total-num-mbufs=32768 --stats-period 1 --auto-start \
        >"$d/log" 2>&1 &
    p=$!
    track "$p"
    sample_entries "$out.samples" "$p"
    stop_pid "$p"
    grep -aq "Rx-pps" "$d/log" || log "testpmd flowgen did not run: $(grep -a -m3 -i 'error\|cause' "$d/log" | tr '\n' ' ')"
}
setup_gen() {
    local out=$1 p
    setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$port_a" --sink "$port_b" --size 64 \
        --ring 1024 --rate 0 --duration $((setup_secs + 2)) --settle 1 --quiet --ip-flows 8000000 txonly \
        >"$out.gen" 2>"$out.err" &
    p=$!
    track "$p"
    sample_entries "$out.samples" "$p"
    wait "$p" 2>/dev/null || true
}

results=$work/results.jsonl
: >"$results"
for round in $(seq "$rounds"); do
    order=$systems
    [ $((round % 2)) = 0 ] && order=$(tr ' ' '\n' <<<"$order" | tac | tr '\n' ' ')
    for s in $order; do
        start_system "$s" "$round" || { log "round $round: $s did not start"; stop_system; continue; }
        limit=$(ct_limit)
        for f in $flows_list; do
            ct_flush
            # Warm and measure; again (up to --warm-tries) while fewer than 99 % of the
            # measured packets were established.
            rec=
            for try in $(seq "$warm_tries"); do
                warm "$f" || { log "round $round $s flows $f: no warm-up"; break; }
                e0=$(ct_entries); h1=$(rule_hits); m=$(pmd_mark)
                g=$(measure "$f" "$work/$s-$round-$f")
                cpp=$(pmd_cpp "$m"); h2=$(rule_hits); e1=$(ct_entries)
                alive || { log "$s died in the cell flows=$f"; break; }
                jq -e . >/dev/null 2>&1 <<<"$g" || g='{}'
                rec=$(jq -c -n --arg sys "$s" --argjson round "$round" --argjson flows "$f" --argjson g "$g" \
                    --argjson h1 "$h1" --argjson h2 "$h2" --argjson e0 "$e0" --argjson e1 "$e1" \
                    --argjson limit "$limit" --argjson n_warm "$try" --argjson cpp "${cpp:-null}" '
                    {cell: "established", sys: $sys, round: $round, flows: $flows, mpps: $g.mpps,
                     sent: $g.sent, received: $g.received, lost: $g.lost, warm_ups: $n_warm,
                     cycles_per_packet: $cpp,
                     entries_after_warm: $e0, entries: $e1, ct_limit: $limit,
                     hits_new: ($h2.new - $h1.new), hits_est: ($h2.est - $h1.est)}
                    | .est_fraction = (if (.hits_new + .hits_est) > 0
                        then (.hits_est / (.hits_new + .hits_est) * 1000 | round / 1000) else null end)')
                jq -e '.est_fraction != null and .est_fraction < 0.99' >/dev/null <<<"$rec" || break
                log "round $round $s flows $f: est_fraction $(jq .est_fraction <<<"$rec") after warm-up $try"
            done
            [ -n "$rec" ] && tee -a "$results" <<<"$rec" >&2
        done
        for src in $setup_sources; do
            ct_flush
            o=$work/$s-$round-setup-$src
            case $src in
                testpmd) setup_testpmd "$o" ;;
                gen) setup_gen "$o" ;;
                *) log "unknown setup source $src"; continue ;;
            esac
            rate=$(setup_rate "$o.samples" "$limit"); by=$(counted_by "$o.samples")
            e1=$(ct_entries)
            g='{}'
            [ -f "$o.gen" ] && g=$(tail -1 "$o.gen") && { jq -e . >/dev/null 2>&1 <<<"$g" || g='{}'; }
            jq -c -n --arg sys "$s" --arg src "$src" --argjson round "$round" --argjson rate "$rate" --arg by "$by" \
                --argjson e1 "$e1" --argjson limit "$limit" --argjson g "$g" '
                {cell: "setup", sys: $sys, source: $src, round: $round, new_per_s: $rate, counted_by: $by,
                 entries: $e1, ct_limit: $limit, gen_mpps: $g.mpps}' | tee -a "$results" >&2
        done
        stop_system
    done
done

jq -s --arg date "$(date -u +%F)" --argjson rounds "$rounds" --argjson secs "$secs" \
    --argjson setup_secs "$setup_secs" --arg note "$note" --argjson ct_max "$ct_max" '
  def median: map(select(. != null)) | sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def ratio($a; $b): if $a != null and $b != null and $b > 0 then (($a / $b) * 100 | round / 100) else null end;
  [.[] | select(.cell == "established")] as $est |
  [.[] | select(.cell == "setup")] as $setup |
  ($est | group_by([.sys, .flows]) | map({
      sys: .[0].sys, flows: .[0].flows,
      mpps: (map(.mpps) | median), mpps_by_round: map(.mpps),
      est_fraction: (map(.est_fraction) | median), warm_ups: (map(.warm_ups) | max),
      cycles_per_packet: (map(.cycles_per_packet) | median),
      entries: (map(.entries) | median),
      lost: (map(.lost) | median)})) as $cells |
  ($setup | group_by([.sys, .source]) | map({
      sys: .[0].sys, source: .[0].source,
      new_per_s: (map(.new_per_s) | median), new_per_s_by_round: map(.new_per_s),
      counted_by: (map(.counted_by) | unique),
      entries_at_end: (map(.entries) | median), ct_limit: (map(.ct_limit) | median)})) as $scells |
  def cell($s; $f): $cells | map(select(.sys == $s and .flows == $f)) | .[0];
  def scell($s; $src): $scells | map(select(.sys == $s and .source == $src)) | .[0];
  {
    benchmark: "conntrack", date: $date, rounds: $rounds, seconds: $secs, setup_seconds: $setup_secs,
    note: (if $note == "" then null else $note end),
    pipeline: ["table=0,priority=10,ip,ct_state=-trk actions=ct(table=1,zone=1)", "table=0,priority=0 actions=drop",
               "table=1,priority=10,ip,ct_state=+trk+new actions=ct(commit,zone=1),output:2",
               "table=1,priority=10,ip,ct_state=+trk+est actions=output:2", "table=1,priority=0 actions=drop"],
    peer: "ovs-vswitchd-dpdk 3.1 (Debian), netdev bridge, dpdkvhostuser ports, userspace conntrack",
    ct_max_requested: $ct_max,
    established: {
      source: "ferrovs-gen txonly --sink (our own generator; testpmd cannot send on port 1 only while draining port 2), 64-byte UDP, F flows by IPv4 source (--ip-flows F), --rate 0; connections made established first by a warm-up whose replies come from DPDK testpmd --forward-mode=5tswap on port 2",
      cells: $cells,
      ratios_ferrovs_over_ovs: [$cells[] | select(.sys == "ferrovs") | . as $c | cell("ovs"; $c.flows) as $o |
          select($o != null) | {flows: $c.flows, ratio: ratio($c.mpps; $o.mpps)}]
    },
    setup: {
      sources: {testpmd: "DPDK testpmd --forward-mode=flowgen --flowgen-flows=2147483647 on two net_virtio_user ports (sends on both; every packet a new UDP connection)",
                gen: "ferrovs-gen txonly --sink --ip-flows 8000000 (our own generator; every packet a new UDP connection)"},
      method: "new connections/s = growth of the connection count (sampled every 0.2 s) after a 1 s settle, up to 90% of the limit",
      tcp_handshakes: "not measured: no tool here completes TCP handshakes at rate over vhost-user (testpmd has no TCP engine; ferrovs-gen sends UDP)",
      cells: $scells,
      ratios_ferrovs_over_ovs: [$scells[] | select(.sys == "ferrovs") | . as $c | scell("ovs"; $c.source) as $o |
          select($o != null) | {source: $c.source, ratio: ratio($c.new_per_s; $o.new_per_s)}]
    },
    raw: .
  }
  | .goals = {
      ahead_of_ovs_every_cell: [.established.ratios_ferrovs_over_ovs[] | {flows, ratio, holds: (.ratio != null and .ratio > 1)}],
      setup_rate_2x_ovs: [.setup.ratios_ferrovs_over_ovs[] | {source, ratio, holds: (.ratio != null and .ratio >= 2)}]
    }' "$results"
