#!/usr/bin/env bash
# Adaptive polling, interrupt mode and load-based sleep: latency and the PMD's CPU use at low
# and high rates, idle CPU, and throughput at full load; ferrovs beside OVS-DPDK's
# pmd-maxsleep, interleaved in one run.
#
# Configurations (--ferrovs-configs, --ovs-maxsleep):
#   ferrovs/poll            pmd-rx-mode=poll (busy polling: the reference)
#   ferrovs/interrupt       pmd-rx-mode=interrupt (sleeps after every empty poll)
#   ferrovs/adaptive        pmd-rx-mode=adaptive, pmd-sleep-after-us=300 (the default)
#   ferrovs/adaptive+max50  adaptive and pmd-sleep-max-us=50 (load-based sleep as OVS's)
#   ovs/maxsleep-N          OVS-DPDK (scripts/peers/ovs-dpdk.sh: netdev bridge, NORMAL, two
#                           dpdkvhostuser ports) with other_config:pmd-maxsleep=N, N in
#                           0 50 500 10000 (0: busy polling)
# Modes and maxsleep are changed at runtime on one daemon per system and round (ferrovs
# config set, ovs-vsctl set), as an operator would; every configuration is measured on the
# same running daemon.
#
# Tests, per configuration:
#   rate R   (--rates, default 2857 = one packet per 350 us, 10000, 100000, 1000000) one
#            ferrovs-gen, txonly 64-byte frames into port 1 at R pps, evenly spaced, and --sink
#            port 2 in the same thread (one clock: one-way latency; every packet accounted),
#            --spin (never sleeps: a packet is timestamped as soon as it lands), --settle 1
#            (attached 1 s before the traffic and the clock start: the backend's set-up of the
#            new ports is not measured; OVS polls a new port up to ~1 s late). Figures: the
#            generator's latency p50/p99/p99.9/max (its histogram has 100 ns buckets up to
#            10 ms: a percentile above 10 ms reads 10000.1; max is exact), loss, achieved rate.
#   full     the same at --rate 0 (as fast as the generator and the switch go): Mpps.
#   idle     two ferrovs-gen `idle` frontends attach to both ports (rings set up, kick fds
#            given, nothing sent); once the ports are ready and 1 s has passed, the PMD's CPU
#            use over --seconds.
# PMD CPU use: the PMD thread's run time from /proc/PID/task/TID/schedstat (ns; also
# utime+stime from .../stat, in 10 ms ticks, as a cross-check), over a window inside the
# traffic (from 0.3 s after the traffic starts to 0.2 s before it ends), as % of one core.
# The PMD thread is found by name: ferrovs `pmd0`, OVS `pmd-c01/id:N`. For ferrovs the
# window's pmd-stats deltas too (sleeps, kick wake-ups, load-based sleeps, time asleep).
# Noise indicators per run: the PMD thread's time runnable but waiting for its core
# (schedstat run_delay) and the time the host stole from that vCPU (/proc/stat steal).
#
# Placement as in the other benches: the PMD on the last core, ferrovs-gen on core 0
# (taskset; with --spin it holds core 0 for the whole run), every process under test started
# with setsid (own session: autogroup scheduling would otherwise skew CPU shares). The
# harness itself and every tool it runs (CLIs, jq, sleep) is pinned to core 0 too, and takes
# its samples during the traffic without jq or subshells (one statistics request per sample,
# for both systems alike): a jq on the PMD core preempted a polling PMD for 10-20 ms.
# Interleaving: in each round both systems are measured (their order alternates by round),
# and within a system each test runs every configuration back to back (the configurations'
# order rotates by round). Figures are medians over --rounds (max latency also its maximum
# over the rounds: `max_us_worst`).
#
# Prints one JSON document on stdout (progress on stderr): per configuration and test the
# medians and per-round values, ratios (latency differences to busy polling, CPU, throughput
# to busy polling, ferrovs beside OVS) and `goals`: the issue's goals evaluated (true/false
# with the numbers). Every process is started by this script and stopped by pid on exit.
#
#   bench/adaptive.sh [--rounds 3] [--seconds 5] [--rates "2857 10000 100000 1000000"]
#                     [--peers ovs|none] [--ferrovs-configs "poll interrupt adaptive adaptive+max50"]
#                     [--ovs-maxsleep "0 50 500 10000"] [--no-full-load] [--no-idle]
#                     [--settle 1] [--keep]
#   bench/adaptive.sh --report DIR/results.jsonl [same --rounds/--seconds/--rates]
#                     (only the report, from the raw runs a --keep run left in DIR)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
root=$PWD
rounds=3 secs=5 rates="2857 10000 100000 1000000" peers=ovs settle=1 keep=0 full=1 idle=1
report_from=
fv_configs="poll interrupt adaptive adaptive+max50"
ovs_sleeps="0 50 500 10000"
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --seconds) secs=$2; shift 2 ;;
        --rates) rates=$2; shift 2 ;;
        --peers) peers=$2; shift 2 ;;
        --ferrovs-configs) fv_configs=$2; shift 2 ;;
        --ovs-maxsleep) ovs_sleeps=$2; shift 2 ;;
        --no-full-load) full=0; shift ;;
        --no-idle) idle=0; shift ;;
        --settle) settle=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --report) report_from=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[ "$peers" = none ] && peers=
for c in $fv_configs; do
    case $c in poll | interrupt | adaptive | adaptive+max*) ;; *) echo "unknown ferrovs config $c" >&2; exit 2 ;; esac
done
awk -v s="$secs" 'BEGIN { exit !(s >= 1) }' || { echo "--seconds must be >= 1" >&2; exit 2; }
ncpu=$(nproc)
pmd=$((ncpu - 1)); gen=0; [ "$ncpu" -gt 1 ] && gen=$((ncpu - 2))
bin=$root/target/release
work=
if [ -z "$report_from" ]; then
    bash scripts/deps.sh >/dev/null
    cargo build --release --quiet
    work=$(mktemp -d /tmp/ferrovs-adaptive.XXXXXX)
fi
log() { echo "bench: $*" >&2; }
# The harness itself, and every tool it runs (the CLIs, jq, sleep), stays on the traffic core:
# nothing of it may preempt the PMD. The daemons under test start with every core allowed
# (each pins its own threads).
all_cores=0-$((ncpu - 1))
[ -n "$work" ] && taskset -pc "$gen" $$ >/dev/null

# Every process we started, stopped by pid while its command line still names our work dir
# (a recycled pid is never hit). OVS: its own stop (by its pidfiles) plus the same check.
track() { echo "$1" >>"$work/pids"; }
ours() { local c; c=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") && [[ $c == *"$work/"* ]]; }
stop_pids() {
    local p left=() alive
    for p in "$@"; do ours "$p" && { kill -TERM "$p" 2>/dev/null || true; left+=("$p"); }; done
    for _ in $(seq 100); do
        alive=0
        for p in "${left[@]}"; do ours "$p" && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.05
    done
    for p in "${left[@]}"; do
        ours "$p" && { kill -KILL "$p" 2>/dev/null || true; }
        wait "$p" 2>/dev/null || true
    done
    return 0
}
stop_all() {
    [ -f "$work/pids" ] || return 0
    # shellcheck disable=SC2046
    stop_pids $(sort -un "$work/pids")
    : >"$work/pids"
}
cleanup() {
    local f
    [ -n "$work" ] || return 0
    [ -n "${_ovs_dir:-}" ] && { ovs_stop >/dev/null 2>&1 || true; }
    for f in "$work"/ovs*/*.pid; do [ -f "$f" ] && track "$(cat "$f")"; done
    stop_all
    if [ "$keep" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_us() { local t=${EPOCHREALTIME/./}; echo "$((10#$t))"; }
# Sleeps until the EPOCHREALTIME microsecond $1 (at once if past).
sleep_until() {
    local d=$(($1 - $(now_us)))
    [ "$d" -gt 0 ] && sleep "$(printf '%d.%06d' $((d / 1000000)) $((d % 1000000)))"
    return 0
}
wait_sock() { for _ in $(seq 400); do [ -S "$1" ] && return 0; sleep 0.05; done; log "no socket $1"; return 1; }
fv() { taskset -c "$gen" "$bin/ferrovs" --run-dir "$fv_dir" "$@"; }

# --- the system under test: ferrovs or ovs -------------------------------------------------
sys= sys_pid= fv_dir= port_a= port_b=

fv_start() {
    fv_dir=$work/ferrovs-r$1
    mkdir -p "$fv_dir"
    setsid taskset -c "$all_cores" "$bin/ferrovsd" --run-dir "$fv_dir" --pmd-cores "$pmd" \
        >"$fv_dir/ferrovsd.log" 2>&1 &
    sys_pid=$!; track "$sys_pid"
    port_a=$fv_dir/vm1.sock port_b=$fv_dir/vm2.sock
    wait_sock "$port_a"; wait_sock "$port_b"
    sys=ferrovs
}

ovs_up() {
    # shellcheck source=/dev/null
    source scripts/peers/ovs-dpdk.sh
    local d=$work/ovs-r$1
    taskset -pc "$all_cores" $$ >/dev/null
    ovs_start "$d" "$pmd" >"$work/ovs-start.log" 2>&1 || { cat "$work/ovs-start.log" >&2; return 1; }
    taskset -pc "$gen" $$ >/dev/null
    for f in "$d"/*.pid; do track "$(cat "$f")"; done
    sys_pid=$(cat "$d/ovs-vswitchd.pid")
    port_a=$(ovs_port_path "$d" 1) port_b=$(ovs_port_path "$d" 2)
    wait_sock "$port_a"; wait_sock "$port_b"
    sys=ovs
}

sys_stop() {
    case $sys in
        ferrovs) stop_pids "$sys_pid" ;;
        ovs) ovs_stop ;;
    esac
    sys= sys_pid=
}

# Dies (with the daemon's log) when the daemon under test is gone.
check_alive() {
    kill -0 "$sys_pid" 2>/dev/null && return 0
    log "$sys daemon (pid $sys_pid) died during $1"
    case $sys in
        ferrovs) tail -20 "$fv_dir/ferrovsd.log" >&2 ;;
        ovs) tail -20 "$_ovs_dir/ovs-vswitchd.log" >&2 ;;
    esac
    exit 1
}

# The PMD thread's tid: ferrovs `pmd0`, OVS `pmd-c<core>/id:<n>`.
pmd_tid() {
    local t c
    for t in /proc/"$sys_pid"/task/*; do
        c=$(cat "$t/comm" 2>/dev/null) || continue
        case $sys:$c in
            ferrovs:pmd0 | ovs:pmd-c*) echo "${t##*/}"; return 0 ;;
        esac
    done
    log "$sys: no PMD thread in pid $sys_pid"; return 1
}

# Applies configuration $1 of the current system.
apply_config() {
    case $sys:$1 in
        ferrovs:poll | ferrovs:interrupt | ferrovs:adaptive)
            fv config set pmd-rx-mode "$1" >/dev/null
            fv config set pmd-sleep-max-us 0 >/dev/null ;;
        ferrovs:adaptive+max*)
            fv config set pmd-rx-mode adaptive >/dev/null
            fv config set pmd-sleep-max-us "${1#adaptive+max}" >/dev/null ;;
        ovs:maxsleep-*)
            _ovs_ctl set Open_vSwitch . "other_config:pmd-maxsleep=${1#maxsleep-}" ;;
        *) log "bad config $sys:$1"; return 1 ;;
    esac
    # Let the PMD pick it up (OVS logs it, ferrovs wakes its PMDs).
    sleep 0.3
}

# One sample of the PMD thread into file $1 (JSON), its switch's PMD statistics into $1.pmd.
# Taken while the traffic runs: bash builtins only (no jq, no subshell), plus one statistics
# request (ferrovs pmd-stats / ovs-appctl pmd-stats-show, on the harness core, the same
# for both systems); everything is parsed after the run.
sample() {
    local out=$1 t cpu wait st l ticks steal
    t=${EPOCHREALTIME/./}
    # Run time on the CPU and time spent runnable but waiting for it (ns).
    read -r cpu wait _ <"/proc/$sys_pid/task/$tid/schedstat"
    read -r st <"/proc/$sys_pid/task/$tid/stat"
    st=${st##*) }
    read -r -a l <<<"$st"
    ticks=$((l[11] + l[12]))
    # Time the host took from the PMD core's vCPU (USER_HZ ticks).
    while read -r -a l; do
        [ "${l[0]}" = "cpu$pmd" ] && { steal=${l[8]}; break; }
    done </proc/stat
    case $sys in
        ferrovs) fv pmd-stats --json >"$out.pmd" ;;
        ovs) ovs_appctl dpif-netdev/pmd-stats-show >"$out.pmd" ;;
    esac
    printf '{"t_us": %d, "cpu_ns": %d, "wait_ns": %d, "ticks": %d, "steal": %d}\n' \
        "$((10#$t))" "$cpu" "$wait" "$ticks" "$steal" >"$out"
}

# Drops and guest-notification counters of the whole switch (deltas over a run).
counters() {
    case $sys in
        ferrovs) fv port-stats --json | jq -c '{drops: ([.[] | .rx.dropped + .tx.dropped] | add),
            by_reason: ([.[] | (.rx.drops, .tx.drops) | to_entries[]] | group_by(.key)
                        | map({key: .[0].key, value: (map(.value) | add)}) | from_entries),
            to_guest_notifications: ([.[] | .tx.guest_notifications] | add),
            to_guest_suppressed: ([.[] | .tx.notifications_suppressed] | add),
            to_guest_coalesced: ([.[] | .tx.notifications_coalesced] | add)}' ;;
        ovs) local i s=0 v
             for i in vhu1 vhu2; do
                 v=$(_ovs_ctl get Interface "$i" statistics | tr -d '{} ' | tr ',' '\n' |
                     awk -F= '$1 ~ /drop/ {s += $2} END {print s + 0}')
                 s=$((s + v))
             done
             echo "{\"drops\": $s}" ;;
    esac
}

# The window's figures from samples $1 and $2: CPU % of a core and the PMD's counter deltas.
window() {
    local pa=null pb=null
    if [ "$sys" = ferrovs ]; then
        pa=$(jq -c '.[0]' "$1.pmd") pb=$(jq -c '.[0]' "$2.pmd")
    fi
    jq -n -c --slurpfile a "$1" --slurpfile b "$2" --argjson pa "$pa" --argjson pb "$pb" \
        --argjson hz "$(getconf CLK_TCK)" '
        ($a[0]) as $a | ($b[0]) as $b | (($b.t_us - $a.t_us) / 1e6) as $s
        | {window_s: ($s * 1000 | round / 1000),
           cpu_pct: (($b.cpu_ns - $a.cpu_ns) / 1e9 / $s * 100 * 100 | round / 100),
           cpu_pct_ticks: (($b.ticks - $a.ticks) / $hz / $s * 100 * 10 | round / 10),
           pmd_runnable_waiting_pct: (($b.wait_ns - $a.wait_ns) / 1e9 / $s * 100 * 100 | round / 100),
           core_steal_pct: (($b.steal - $a.steal) / $hz / $s * 100 * 10 | round / 10),
           pmd: (if $pa == null then null else
                 {rx_mode: $pb.rx_mode, sleep_max_us: $pb.sleep_max_us,
                  sleeps_per_s: (($pb.sleeps - $pa.sleeps) / $s | round),
                  kick_wakeups_per_s: (($pb.kick_wakeups - $pa.kick_wakeups) / $s | round),
                  load_sleeps_per_s: (($pb.load_sleeps - $pa.load_sleeps) / $s | round),
                  asleep_pct: (($pb.sleep_us - $pa.sleep_us) / 1e6 / $s * 100 * 10 | round / 10)}
                 end)}'
}

# ferrovs: waits until both ports are connected with every queue ready.
fv_ready() {
    local c=0
    for _ in $(seq 200); do
        c=$(fv show --json 2>/dev/null | jq '[.bridges[].ports[]
              | select(.state == "connected" and .ready_queues == 2 * .queues)] | length' 2>/dev/null) || c=0
        [ "$c" = 2 ] && return 0
        sleep 0.05
    done
    log "ferrovs: only $c of 2 ports ready"; return 1
}

# Runs one test ($1: idle | full | a rate in pps) on configuration $2; appends a JSON line to
# $results.
measure() {
    local kind=$1 cfg=$2 d=$work/run t0 rate spin=() g1 g2 gp lim r w c1 c2
    rm -rf "$d"; mkdir -p "$d"
    check_alive "$cfg $kind"
    tid=$(pmd_tid)
    if [ "$kind" = idle ]; then
        setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$port_a" --duration 100000 --quiet idle \
            >"$d/idle1.json" 2>"$d/idle1.err" &
        g1=$!; track "$g1"
        setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$port_b" --src 02:00:00:00:00:02 \
            --duration 100000 --quiet idle >"$d/idle2.json" 2>"$d/idle2.err" &
        g2=$!; track "$g2"
        if [ "$sys" = ferrovs ]; then fv_ready; sleep 1; else sleep 2; fi
        sample "$d/a.json"
        sleep "$secs"
        sample "$d/b.json"
        kill -0 "$g1" 2>/dev/null && kill -0 "$g2" 2>/dev/null ||
            log "$sys $cfg idle: a frontend exited early: $(cat "$d"/idle*.err)"
        stop_pids "$g1" "$g2"
        check_alive "$cfg idle"
        w=$(window "$d/a.json" "$d/b.json")
        jq -c -n --argjson w "$w" '$w + {test: "idle"}' >"$d/r.json"
    else
        rate=$kind; [ "$kind" = full ] && rate=0
        [ "$rate" -gt 0 ] && spin=(--spin)
        c1=$(counters)
        t0=$(now_us)
        setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$port_a" --sink "$port_b" --size 64 \
            --ring 1024 --rate "$rate" "${spin[@]}" --duration "$secs" --settle "$settle" --quiet txonly \
            >"$d/gen.json" 2>"$d/gen.err" &
        gp=$!; track "$gp"
        # The traffic runs from about t0 + settle to t0 + settle + secs.
        local us_settle us_secs
        us_settle=$(awk -v s="$settle" 'BEGIN { printf "%d", s * 1e6 }')
        us_secs=$(awk -v s="$secs" 'BEGIN { printf "%d", s * 1e6 }')
        sleep_until $((t0 + us_settle + 300000))
        sample "$d/a.json"
        sleep_until $((t0 + us_settle + us_secs - 200000))
        sample "$d/b.json"
        lim=$((t0 + us_settle + us_secs + 30000000))
        while kill -0 "$gp" 2>/dev/null && [ "$(now_us)" -lt "$lim" ]; do sleep 0.05; done
        if kill -0 "$gp" 2>/dev/null; then log "$sys $cfg $kind: generator hung, stopping it"; fi
        stop_pids "$gp"
        wait "$gp" 2>/dev/null || true
        check_alive "$cfg $kind"
        c2=$(counters)
        w=$(window "$d/a.json" "$d/b.json")
        if jq -e .latency "$d/gen.json" >/dev/null 2>&1; then
            jq -c --argjson w "$w" --argjson c1 "$c1" --argjson c2 "$c2" --arg test "$kind" --argjson rate "$rate" '
                $w + {test: $test, rate_pps: $rate, sent, received, lost,
                      achieved_pps: (.sent / .seconds | round), mpps, reordered, corrupt,
                      p50_us: .latency.p50_us, p99_us: .latency.p99_us, p999_us: .latency.p999_us,
                      max_us: .latency.max_us, mean_us: .latency.mean_us, max_gap_us,
                      switch_drops: ($c2.drops - $c1.drops),
                      switch_drops_by_reason: (if $c2.by_reason == null then null else ($c2.by_reason
                          | to_entries | map(.value -= ($c1.by_reason[.key] // 0)) | map(select(.value != 0))
                          | from_entries) end),
                      to_guest_notifications: (if $c1.to_guest_notifications == null then null
                          else {made: ($c2.to_guest_notifications - $c1.to_guest_notifications),
                                suppressed: ($c2.to_guest_suppressed - $c1.to_guest_suppressed),
                                coalesced: ($c2.to_guest_coalesced - $c1.to_guest_coalesced)} end)}' \
                "$d/gen.json" >"$d/r.json"
        else
            log "$sys $cfg $kind: generator failed: $(cat "$d/gen.err")"
            jq -c -n --argjson w "$w" --arg test "$kind" --arg err "$(cat "$d/gen.err")" \
                '$w + {test: $test, error: $err}' >"$d/r.json"
        fi
    fi
    jq -c --arg sys "$sys" --arg cfg "$cfg" --argjson round "$round" \
        '{config: ($sys + "/" + $cfg), round: $round} + .' "$d/r.json" | tee -a "$results" |
        jq -r '"bench: round \(.round) \(.config) \(.test): cpu \(.cpu_pct) % (waiting \(.pmd_runnable_waiting_pct) stolen \(.core_steal_pct))"
               + (if .p50_us then ", p50 \(.p50_us) p99 \(.p99_us) max \(.max_us) us, \(.achieved_pps) pps, lost \(.lost)" else "" end)
               + (if .pmd then ", sleeps/s \(.pmd.sleeps_per_s) kicks/s \(.pmd.kick_wakeups_per_s) load-sleeps/s \(.pmd.load_sleeps_per_s)" else "" end)
               + (if .error then ", ERROR \(.error)" else "" end)' >&2
}

# Rotates the words of $2 left by $1.
rotate() {
    local n=$1; shift
    local a=($@) i out=()
    for i in "${!a[@]}"; do out+=("${a[$(((i + n) % ${#a[@]}))]}"); done
    echo "${out[@]}"
}

# All tests of one system in one round. Order: the rates ascending, full load, then idle (a
# long quiet spell would age OVS's datapath flows out, and the next run would pay an upcall).
run_system() {
    local who=$1 cfgs kind cfg kinds=$rates
    [ "$full" = 1 ] && kinds+=" full"
    [ "$idle" = 1 ] && kinds+=" idle"
    case $who in
        ferrovs) fv_start "$round"; cfgs=$fv_configs ;;
        ovs) ovs_up "$round"; cfgs="" ; for c in $ovs_sleeps; do cfgs+=" maxsleep-$c"; done ;;
    esac
    # shellcheck disable=SC2086
    cfgs=$(rotate $((round - 1)) $cfgs)
    # Warm-up: MAC learning (and OVS's datapath flow), then the tests.
    setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$port_a" --sink "$port_b" --size 64 \
        --ring 1024 --rate 10000 --duration 1 --settle "$settle" --quiet txonly >/dev/null 2>&1 ||
        log "$who: warm-up run failed"
    for kind in $kinds; do
        for cfg in $cfgs; do
            apply_config "$cfg"
            measure "$kind" "$cfg"
        done
    done
    sys_stop
}

if [ -n "$report_from" ]; then
    results=$report_from
else
    results=$work/results.jsonl
    : >"$results"
    systems=ferrovs
    for p in $peers; do
        case $p in
            ovs) if [ -x /usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk ] && [ -f scripts/peers/ovs-dpdk.sh ]; then
                     systems+=" ovs"
                 else log "OVS-DPDK not available: skipping it"; fi ;;
            *) log "unknown peer $p (known: ovs)"; exit 2 ;;
        esac
    done
    for round in $(seq "$rounds"); do
        # shellcheck disable=SC2086
        for who in $(rotate $((round - 1)) $systems); do
            log "round $round: $who"
            run_system "$who"
        done
    done
fi

# --- report ----------------------------------------------------------------------------------
jq -s --argjson rounds "$rounds" --argjson secs "$secs" --argjson settle "$settle" \
    --arg rates "$rates" --arg host "$(uname -r), $ncpu cpus" \
    --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" --argjson pmd "$pmd" --argjson gen "$gen" '
  def median: map(select(. != null)) | sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def r1: if . == null then null else (. * 10 | round / 10) end;
  def r2: if . == null then null else (. * 100 | round / 100) end;
  def r3: if . == null then null else (. * 1000 | round / 1000) end;
  def diff($a; $b): if $a == null or $b == null then null else ($a - $b | r1) end;
  def ratio($a; $b): if $a == null or $b == null or $b == 0 then null else ($a / $b | r3) end;
  . as $runs
  | def agg: {
        cpu_pct: (map(.cpu_pct) | median),
        p50_us: (map(.p50_us) | median), p99_us: (map(.p99_us) | median),
        p999_us: (map(.p999_us) | median), max_us: (map(.max_us) | median),
        max_us_worst: (map(.max_us) | max), mean_us: (map(.mean_us) | median),
        achieved_pps: (map(.achieved_pps) | median), mpps: (map(.mpps) | median),
        lost: (map(.lost // 0) | add), switch_drops: (map(.switch_drops // 0) | add),
        pmd: (if .[0].pmd == null then null else
              {sleeps_per_s: (map(.pmd.sleeps_per_s) | median),
               kick_wakeups_per_s: (map(.pmd.kick_wakeups_per_s) | median),
               load_sleeps_per_s: (map(.pmd.load_sleeps_per_s) | median),
               asleep_pct: (map(.pmd.asleep_pct) | median)} end),
        errors: (map(.error // empty)),
        rounds: map({round, cpu_pct, cpu_pct_ticks, p50_us, p99_us, max_us, achieved_pps, lost,
                     pmd_runnable_waiting_pct, core_steal_pct})}
      | with_entries(select(.value != null and .value != []));
    def idle_agg: {cpu_pct: (map(.cpu_pct) | median),
                   cpu_pct_ticks: (map(.cpu_pct_ticks) | median),
                   pmd: (if .[0].pmd == null then null else
                         {sleeps_per_s: (map(.pmd.sleeps_per_s) | median),
                          asleep_pct: (map(.pmd.asleep_pct) | median)} end),
                   rounds: map({round, cpu_pct, cpu_pct_ticks, pmd_runnable_waiting_pct, core_steal_pct})}
                  | with_entries(select(.value != null));
  ($runs | group_by(.config) | map({key: .[0].config, value: (
      (map(select(.test == "idle")) | if length > 0 then {idle: idle_agg} else {} end)
      + (map(select(.test == "full")) | if length > 0 then {full_load: (agg | {mpps, lost, switch_drops, cpu_pct, p50_us, p99_us, max_us, errors, rounds} | with_entries(select(.value != null)))} else {} end)
      + {rates: (map(select(.test != "idle" and .test != "full")) | group_by(.rate_pps)
                 | map({key: (.[0].rate_pps | tostring), value: agg}) | from_entries)})})
   | from_entries) as $c
  | ($rates | split(" ") | map(select(. != ""))) as $rl
  | def at($cfg; $rate; $f): $c[$cfg].rates[$rate][$f];
    def ref($k): if ($k | startswith("ovs/")) then "ovs/maxsleep-0" else "ferrovs/poll" end;
    ($c | keys | map(select(startswith("ferrovs/") and . != "ferrovs/poll"))) as $fv_others
  | ($c | keys | map(select(startswith("ovs/") and . != "ovs/maxsleep-0"))) as $ovs_others
  | {
    benchmark: "adaptive", date: $date, host: $host, pmd_core: $pmd, traffic_core: $gen,
    rounds: $rounds, seconds: $secs, settle_s: $settle, rates_pps: ($rl | map(tonumber)),
    method: {
      traffic: "ferrovs-gen txonly 64-byte frames into port 1 at rate_pps (evenly spaced), --sink port 2 in the same thread, --spin, --ring 1024, attached settle_s before the traffic starts; one-way latency on one clock; full_load: --rate 0",
      latency: "the generator histogram (100 ns buckets up to 10 ms: percentiles above 10 ms read 10000.1; max exact); medians over rounds, max_us_worst: the largest over rounds",
      cpu_pct: "PMD thread run time (/proc/PID/task/TID/schedstat) over a window inside the traffic (settle+0.3 s .. end-0.2 s), % of one core; cpu_pct_ticks: utime+stime from /proc/.../stat (10 ms ticks); pmd_runnable_waiting_pct: time the PMD thread was runnable but another task had its core (schedstat run_delay), core_steal_pct: time the host took from the vCPU of the PMD core (/proc/stat steal), both noise indicators",
      idle: "two ferrovs-gen idle frontends attached to both ports (quiet, kick fds given); PMD CPU over seconds, after the ports are ready + 1 s",
      configs: "ferrovs: pmd-rx-mode poll|interrupt|adaptive (pmd-sleep-after-us 300), adaptive+maxN = adaptive with pmd-sleep-max-us N; ovs: OVS-DPDK (netdev bridge, NORMAL, dpdkvhostuser ports) with pmd-maxsleep N; both changed at runtime on one daemon per system and round",
      placement: "PMD on the last core, generator and the harness on core 0 (taskset), all under test started with setsid; systems alternate order by round, configurations rotate within each test"},
    configs: $c,
    ratios: {
      latency_minus_reference_us: (($fv_others + $ovs_others) | map(. as $k | ref($k) as $ref
          | {key: $k, value: {reference: $ref, by_rate: ($rl | map(. as $r | {key: $r, value: {
                p50: diff(at($k; $r; "p50_us"); at($ref; $r; "p50_us")),
                p99: diff(at($k; $r; "p99_us"); at($ref; $r; "p99_us")),
                max: diff(at($k; $r; "max_us"); at($ref; $r; "max_us"))}}) | from_entries)}})
          | from_entries),
      cpu_pct: ($c | keys | map(. as $k | {key: $k, value: (
          ($rl | map(. as $r | {key: $r, value: at($k; $r; "cpu_pct")}) | from_entries)
          + {full_load: $c[$k].full_load.cpu_pct, idle: $c[$k].idle.cpu_pct})}) | from_entries),
      full_load_over_reference: (($fv_others + $ovs_others) | map(. as $k
          | {key: $k, value: ratio($c[$k].full_load.mpps; $c[ref($k)].full_load.mpps)}) | from_entries),
      ferrovs_beside_ovs: {
        full_load_mpps_poll_over_maxsleep0: ratio($c["ferrovs/poll"].full_load.mpps; $c["ovs/maxsleep-0"].full_load.mpps),
        full_load_mpps_adaptive_over_maxsleep0: ratio($c["ferrovs/adaptive"].full_load.mpps; $c["ovs/maxsleep-0"].full_load.mpps),
        adaptive_minus_ovs: ($c | keys | map(select(startswith("ovs/"))) | map(. as $k | {key: $k, value: (
            {idle_cpu_pct: diff($c["ferrovs/adaptive"].idle.cpu_pct; $c[$k].idle.cpu_pct)}
            + ($rl | map(. as $r | {key: ("p50_us_at_" + $r), value: diff(at("ferrovs/adaptive"; $r; "p50_us"); at($k; $r; "p50_us"))}) | from_entries)
            + ($rl | map(. as $r | {key: ("cpu_pct_at_" + $r), value: diff(at("ferrovs/adaptive"; $r; "cpu_pct"); at($k; $r; "cpu_pct"))}) | from_entries))})
          | from_entries)}
    },
    goals: (
      (at("ferrovs/adaptive"; "2857"; "p50_us")) as $ap50 | (at("ferrovs/poll"; "2857"; "p50_us")) as $pp50
      | (at("ferrovs/adaptive"; "2857"; "max_us_worst")) as $amaxw | (at("ferrovs/adaptive"; "2857"; "max_us")) as $amax
      | ($c["ferrovs/adaptive"].idle.cpu_pct) as $idle
      | ratio($c["ferrovs/adaptive"].full_load.mpps; $c["ferrovs/poll"].full_load.mpps) as $tput
      | {idle_cpu_below_1pct: {adaptive_idle_cpu_pct: $idle,
                               holds: (if $idle == null then null else $idle < 1 end)},
         p50_within_10us_of_busy_polling_at_2857pps: {adaptive_p50_us: $ap50, poll_p50_us: $pp50,
                               difference_us: diff($ap50; $pp50),
                               difference_us_by_round: ([$c["ferrovs/adaptive"].rates["2857"].rounds // [] | .[]
                                   | . as $a | ($c["ferrovs/poll"].rates["2857"].rounds // [] | map(select(.round == $a.round)) | .[0]) as $p
                                   | if $p == null then empty else diff($a.p50_us; $p.p50_us) end]),
                               adaptive_cpu_pct: at("ferrovs/adaptive"; "2857"; "cpu_pct"),
                               holds: (if $ap50 == null or $pp50 == null then null else ($ap50 - $pp50) <= 10 end)},
         max_below_100us_at_2857pps: {adaptive_max_us_worst_round: $amaxw, adaptive_max_us_median: $amax,
                               holds: (if $amaxw == null then null else $amaxw < 100 end),
                               holds_in_median_round: (if $amax == null then null else $amax < 100 end),
                               context: {adaptive_p99_us: at("ferrovs/adaptive"; "2857"; "p99_us"),
                                         adaptive_p999_us: at("ferrovs/adaptive"; "2857"; "p999_us"),
                                         poll_max_us_worst_round: at("ferrovs/poll"; "2857"; "max_us_worst"),
                                         poll_max_us_median: at("ferrovs/poll"; "2857"; "max_us"),
                                         poll_p999_us: at("ferrovs/poll"; "2857"; "p999_us"),
                                         note: "busy polling max: the floor this machine sets (PMD or generator descheduled)"}},
         no_throughput_loss_at_full_load: {adaptive_mpps: $c["ferrovs/adaptive"].full_load.mpps,
                               poll_mpps: $c["ferrovs/poll"].full_load.mpps, ratio: $tput,
                               tolerance: "ratio >= 0.97 (run-to-run noise on this shared machine)",
                               holds: (if $tput == null then null else $tput >= 0.97 end)}}),
    runs: $runs
  }' "$results"
