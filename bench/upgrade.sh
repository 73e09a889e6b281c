#!/usr/bin/env bash
# Hot-upgrade downtime under load, beside the forwarding gap of a plain restart-and-reconnect.
#
# For each port count N (--ports, default "1 8 32"): N vhost-user ports on bridge br0, every one
# a live connection with started rings. ferrovsd runs its PMD on the last core (--pmd-cores);
# everything else (traffic, idle guests, the harness, the new daemon `ferrovs upgrade` starts)
# runs on core 0 (taskset). Every process under test starts with setsid (own session, so that
# autogroup scheduling treats them alike), the `ferrovs upgrade` CLI too (the new daemon is its
# child).
#
# upgrade  ferrovsd on its default config (server ports vm1, vm2); for N = 1 vm2 is deleted,
#          for N > 2 ports p3..pN are added with `ferrovs add-port br0 pI type=vhost-user`,
#          each with an idle ferrovs-gen guest attached (rings set up and started; it sleeps,
#          so 30 of them cost little CPU). One ferrovs-gen sends --rate pps of 64-byte UDP
#          into vm1 and receives on vm2 in the same thread (txonly --sink: every packet
#          accounted for) for the whole series; for N = 1 there is no second port, so the
#          switch receives and drops (the PMD still does the full receive work) and there is
#          nothing to receive. Then --upgrades times, 0.2 s apart, `ferrovs upgrade --json`
#          (the new binary is the same target/release/ferrovsd). Figures come from the
#          daemons' own reports (`ferrovs upgrade-history --json`): downtime_us is
#          CLOCK_MONOTONIC from the freeze in the old daemon to the new daemon's PMDs running.
#          Also: the generator's sent/received/lost over the series, its longest gap between
#          two received packets (an upper bound that also contains every time the generator
#          itself was descheduled on the shared core 0), vhost-user reconnects (must be 0),
#          the switch's drop counters.
#   probes The daemons' downtime ends when the new daemon has woken its PMDs, not when they
#          poll; what the traffic sees is checked too: after the series, --probes more
#          upgrades, each in the middle of its own 1.6 s ferrovs-gen run (same rate, same
#          ports), whose longest gap between two received packets is that upgrade's forwarding
#          gap as the traffic sees it (traffic_gap_us), beside 3 runs without an upgrade
#          (baseline_without_upgrade: the generator's own scheduling gaps on core 0). N >= 2.
# restart  --restarts times (each a fresh run): ferrovsd with max(N, 2) ports of type
#          vhost-user-client (added with the CLI, so saved in the run dir's config); the
#          guests are ferrovs-gen --server (they listen as QEMU's server=on chardev does and
#          set the device up again when the switch reconnects). Sender (txonly, port g1, at
#          --restart-rate: sender and receiver are two processes sharing core 0 here) and
#          receiver (rxonly, port g2); idle guests on g3..gN. After the traffic runs:
#          SIGTERM ferrovsd, wait for it to exit, wait W = --restart-wait ms, start it again
#          on the same run dir (it restores its saved config and reconnects every port).
#          The receiver reports the longest time between two received packets; the restart
#          gap is that minus W. Why W: ferrovs-gen notices a closed connection only every
#          100 ms (QEMU at once); after W every guest is back in accept(), as QEMU would be,
#          and the gap no longer depends on the generator's polling phase. What remains:
#          old daemon stopping and exiting + new daemon starting, connecting, vhost-user
#          set-up of both traffic ports (up to 10 ms of which can be ferrovs-gen's accept
#          polling) + MAC learning. For N = 1 (a single port forwards nothing) the restart is
#          measured with 2 ports (restart.ports says so).
# ovs      the same restart of OVS-DPDK's ovs-vswitchd (scripts/peers/ovs-dpdk.sh: netdev
#          bridge, NORMAL, 2 dpdkvhostuserclient ports, database kept), same W correction.
#          Needs 1 GiB of hugepages (the helper reserves them). --no-ovs: "ovs_restart": null.
# guests   (--guests, not with the series above: TCG guests would take the generator's core)
#          two QEMU guests (tests/e2e/guest) with a TCP stream A -> B, with and without an
#          upgrade every second: throughput and TCP retransmissions.
#
# Prints one JSON document on stdout (progress on stderr): per N the upgrade figures (downtime
# p50/p99/max, freeze p50/p99, prepare p50, traffic, traffic_gap_us), the restart gaps (each
# run, p50, max) and the ratios restart gap (p50 and max) / upgrade downtime p99 as the daemons
# report it (restart_gap_over_upgrade_downtime_p99) and / the traffic's gap p99 from the probes
# (restart_gap_over_traffic_gap_p99). Percentiles: nearest rank (p99 of 50 samples = the
# largest). Every process is stopped by pid (those the upgrades started: from their reports).
#
#   bench/upgrade.sh [--ports "1 8 32"] [--upgrades 50] [--rate 1000000] [--probes 10]
#                    [--restarts 5] [--restart-rate 100000] [--restart-wait 400] [--no-ovs]
#                    [--guests] [--keep]
set -euo pipefail
shopt -s inherit_errexit   # the phases run in command substitutions: a failure stops them too
cd "$(dirname "$0")/.."
root=$PWD
ports="1 8 32" upgrades=50 probes=10 baseline=3 rate=1000000 restarts=5 rrate=100000 rwait_ms=400 ovs=1 guests=0 keep=0
while [ $# -gt 0 ]; do
    case $1 in
        --ports) ports=$2; shift 2 ;;
        --upgrades) upgrades=$2; shift 2 ;;
        --probes) probes=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --restarts) restarts=$2; shift 2 ;;
        --restart-rate) rrate=$2; shift 2 ;;
        --restart-wait) rwait_ms=$2; shift 2 ;;
        --no-ovs) ovs=0; shift ;;
        --guests) guests=1; shift ;;
        --keep) keep=1; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
bash scripts/deps.sh >/dev/null
cargo build --release --quiet
bin=$root/target/release
ncpu=$(nproc)
pmd=$((ncpu - 1)); gen=0; [ "$ncpu" -gt 1 ] && gen=$((ncpu - 2))
work=$(mktemp -d /tmp/ferrovs-upgrade-bench.XXXXXX)
log() { echo "bench: $*" >&2; }

# Every process we started, or that took over from one we started (daemons started by
# `ferrovs upgrade` are not our children: their pids come from the reports). Kept in a file
# (the phases run in command substitutions), stopped by pid, and only while its command line
# still names our work dir (a recycled pid is never hit).
track() { echo "$1" >>"$work/pids"; }
ours() { local c; c=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") && [[ $c == *"$work/"* ]]; }
stop_all() {
    local p left=() alive
    [ -f "$work/pids" ] || return 0
    for p in $(sort -un "$work/pids"); do ours "$p" && { kill -TERM "$p" 2>/dev/null || true; left+=("$p"); }; done
    for _ in $(seq 40); do
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
cleanup() {
    local f
    # An OVS instance a failed phase left behind: its daemons' pidfiles.
    for f in "$work"/ovs*/*.pid; do [ -f "$f" ] && track "$(cat "$f")"; done
    stop_all
    if [ "$keep" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_us() { local t=${EPOCHREALTIME/./}; echo "$((10#$t))"; }
wait_sock() { for _ in $(seq 400); do [ -S "$1" ] && return 0; sleep 0.02; done; log "no socket $1"; return 1; }
fv() { "$bin/ferrovs" --run-dir "$@"; }
# Waits until N ports of the daemon in $1 are connected with every queue ready.
wait_ready() {
    local dir=$1 n=$2 c=0
    for _ in $(seq 500); do
        c=$(fv "$dir" show --json 2>/dev/null | jq '[.bridges[].ports[]
              | select(.state == "connected" and .ready_queues == 2 * .queues)] | length' 2>/dev/null) || c=0
        [ "$c" = "$n" ] && return 0
        sleep 0.02
    done
    log "$dir: only $c of $n ports ready"; return 1
}
daemon_pid() { fv "$1" show --json | jq .pid; }
# ferrovs-gen on the traffic core, in its own session; sets $last to its pid.
gen_bg() {
    local out=$1; shift
    setsid taskset -c "$gen" "$bin/ferrovs-gen" "$@" >"$out" 2>"$out.err" &
    last=$!; track "$last"
}
mac() { printf '02:00:00:00:%02x:%02x' $(($1 / 256)) $(($1 % 256)); }

# Nearest-rank percentiles of a JSON array of numbers.
jq_lib='def pct($p): sort | if length == 0 then null else .[([((length * $p / 100) | ceil) - 1, 0] | max)] end;
        def r1: if . == null then null else (. * 10 | round / 10) end;'

# One series of upgrades with N ports under load; prints its JSON.
run_upgrades() {
    local n=$1 d=$work/up$1 i tx report failed=0 errors=()
    mkdir -p "$d"
    setsid "$bin/ferrovsd" --run-dir "$d" --pmd-cores "$pmd" >"$d/ferrovsd.err" 2>&1 &
    track "$!"
    wait_sock "$d/vm2.sock"
    [ "$n" -eq 1 ] && fv "$d" del-port br0 vm2
    for i in $(seq 3 "$n"); do
        fv "$d" add-port br0 "p$i" type=vhost-user path="$d/p$i.sock"
        wait_sock "$d/p$i.sock"
        gen_bg "$d/idle$i.json" --socket "$d/p$i.sock" --src "$(mac "$i")" --duration 100000 --quiet idle
    done
    local sink=(--sink "$d/vm2.sock")
    [ "$n" -eq 1 ] && sink=()
    gen_bg "$d/traffic.json" --socket "$d/vm1.sock" "${sink[@]}" --ring 1024 --rate "$rate" \
        --duration 100000 --quiet txonly
    tx=$last
    wait_ready "$d" "$n"
    sleep 2
    for i in $(seq "$upgrades"); do
        # Off the PMD core, and nothing of the harness (no jq) beside the handover.
        if setsid taskset -c "$gen" "$bin/ferrovs" --run-dir "$d" upgrade --json >"$d/report.json" 2>"$d/report.err"; then
            track "$(jq .new_pid "$d/report.json")"
        else
            failed=$((failed + 1)); errors+=("$(cat "$d/report.err")")
            log "N=$n: upgrade $i failed: $(cat "$d/report.err")"
        fi
        sleep 0.2
    done
    sleep 1
    # Connections as they stand under traffic: a guest reconnecting would show here.
    fv "$d" show --json >"$d/show.json"
    kill -TERM "$tx"; wait "$tx" || true
    fv "$d" port-stats --json >"$d/stats.json"
    fv "$d" upgrade-history --json | jq '.[:'"$upgrades"']' >"$d/history.json"
    # Probes: the forwarding gap each upgrade causes as the traffic sees it (the series'
    # generator only knows its longest gap): one short run per upgrade, the upgrade in its
    # middle; first --baseline runs without upgrade (the generator's own gaps on core 0).
    : >"$d/probes.jsonl"
    if [ "$n" -ge 2 ]; then
        for i in $(seq $((baseline + probes))); do
            gen_bg "$d/probe.json" --socket "$d/vm1.sock" --sink "$d/vm2.sock" --ring 1024 \
                --rate "$rate" --duration 1.6 --quiet txonly
            tx=$last
            sleep 0.8
            echo null >"$d/report.json"
            if [ "$i" -gt "$baseline" ]; then
                setsid taskset -c "$gen" "$bin/ferrovs" --run-dir "$d" upgrade --json >"$d/report.json" 2>"$d/report.err" ||
                    { echo null >"$d/report.json"; log "N=$n: probe upgrade failed: $(cat "$d/report.err")"; }
                if [ "$(cat "$d/report.json")" != null ]; then track "$(jq .new_pid "$d/report.json")"; fi
            fi
            wait "$tx" || true
            jq -c --slurpfile r "$d/report.json" '{upgrade: ($r[0] != null), max_gap_us, lost,
                downtime_us: $r[0].downtime_us}' "$d/probe.json" >>"$d/probes.jsonl"
        done
    fi
    local errs; errs=$(printf '%s\n' "${errors[@]}" | jq -R . | jq -s 'map(select(. != ""))')
    jq -n "$jq_lib"' ($h[0]) as $h | ($t[0]) as $t | ($show[0]) as $show | ($stats[0]) as $stats
        | ($h | map(.downtime_us)) as $down | ($h | map(.freeze_us)) as $fr
        | ($h | map(.prepare_ms)) as $prep | ($h | map(.total_ms)) as $tot
        | ($probes | map(select(.upgrade)) | map(.max_gap_us)) as $pg
        | ($probes | map(select(.upgrade | not)) | map(.max_gap_us)) as $bg
        | {ports: $n, upgrades: ($h | length), failed: $failed, errors: $errs,
           reported_ports: ($h | map(.ports) | unique), reported_queues: ($h | map(.queues) | unique),
           downtime_us: {p50: ($down | pct(50) | r1), p99: ($down | pct(99) | r1), max: ($down | max | r1)},
           freeze_us: {p50: ($fr | pct(50)), p99: ($fr | pct(99))},
           prepare_ms: {p50: ($prep | pct(50) | . * 100 | round / 100)},
           total_ms: {p50: ($tot | pct(50) | . * 100 | round / 100)},
           traffic: {rate_pps: ($t.sent / $t.seconds | round), seconds: $t.seconds, sent: $t.sent,
                     received: (if $n > 1 then $t.received else null end),
                     lost: (if $n > 1 then $t.lost else null end),
                     max_gap_us: (if $n > 1 then $t.max_gap_us else null end),
                     generator_reconnects: $t.reconnects},
           traffic_gap_us: (if ($pg | length) > 0 then
                {p50: ($pg | pct(50)), p99: ($pg | pct(99)), max: ($pg | max), runs: $pg,
                 reported_downtime_us: ($probes | map(select(.upgrade)) | map(.downtime_us | r1)),
                 lost: ($probes | map(select(.upgrade)) | map(.lost) | add),
                 baseline_without_upgrade: $bg} else null end),
           switch: {vhost_user_disconnects: ([$show.bridges[].ports[].disconnects] | add),
                    drops: ([$stats[] | .rx.dropped + .tx.dropped] | add),
                    drops_by_reason: ([$stats[] | (.rx.drops, .tx.drops) | to_entries[]]
                        | group_by(.key) | map({key: .[0].key, value: (map(.value) | add)}) | from_entries)}}' \
        --argjson n "$n" --argjson failed "$failed" --argjson errs "$errs" \
        --slurpfile h "$d/history.json" --slurpfile t "$d/traffic.json" \
        --slurpfile show "$d/show.json" --slurpfile stats "$d/stats.json" \
        --slurpfile probes "$d/probes.jsonl" >"$d/result.json"
    stop_all
    cat "$d/result.json"
}

# One plain restart of ferrovsd with N client ports; prints {raw_us, wait_us, gap_us, ...}.
restart_once() {
    local n=$1 d=$2 i rx tx p t_kill t_exit t_start
    rm -rf "$d"; mkdir -p "$d"
    gen_bg "$d/rx.json" --socket "$d/g2.sock" --server --ring 1024 --src 02:00:00:00:00:02 \
        --duration 100000 --idle 100000 --quiet rxonly
    rx=$last
    for i in $(seq 3 "$n"); do
        gen_bg "$d/idle$i.json" --socket "$d/g$i.sock" --server --src "$(mac "$i")" \
            --duration 100000 --quiet idle
    done
    gen_bg "$d/tx.json" --socket "$d/g1.sock" --server --ring 1024 --rate "$rrate" \
        --duration 100000 --quiet txonly
    tx=$last
    for i in $(seq "$n"); do wait_sock "$d/g$i.sock"; done
    setsid "$bin/ferrovsd" --run-dir "$d" --pmd-cores "$pmd" >"$d/ferrovsd.err" 2>&1 &
    p=$!; track "$p"
    wait_sock "$d/vm2.sock"
    fv "$d" del-port br0 vm1; fv "$d" del-port br0 vm2
    for i in $(seq "$n"); do
        fv "$d" add-port br0 "g$i" type=vhost-user-client path="$d/g$i.sock"
    done
    wait_ready "$d" "$n"
    sleep 1
    t_kill=$(now_us)
    kill -TERM "$p"; wait "$p" || true
    t_exit=$(now_us)
    sleep "$(awk -v w="$rwait_ms" 'BEGIN { print w / 1000 }')"
    t_start=$(now_us)
    # The same command line on the same run dir: the saved configuration comes back.
    setsid "$bin/ferrovsd" --run-dir "$d" --pmd-cores "$pmd" >>"$d/ferrovsd.err" 2>&1 &
    p=$!; track "$p"
    wait_ready "$d" "$n"
    sleep 1
    kill -TERM "$tx"; wait "$tx" || true
    kill -TERM "$rx"; wait "$rx" || true
    stop_all
    jq -c --argjson kill "$t_kill" --argjson exit "$t_exit" --argjson start "$t_start" \
        '{raw_gap_us: .max_gap_us, wait_us: ($start - $exit),
          gap_us: (if .reconnects == 1 and .max_gap_us > ($start - $exit)
                   then (.max_gap_us - ($start - $exit)) * 10 | round / 10 else null end),
          kill_to_exit_ms: (($exit - $kill) / 100 | round / 10),
          receiver_reconnects: .reconnects, received: .received}' "$d/rx.json"
}

# --restarts plain restarts with N ports; prints the runs as a JSON array.
run_restarts() {
    local n=$1 i r
    for i in $(seq "$restarts"); do
        r=$(restart_once "$n" "$work/rs$n")
        log "  restart $i: $r"
        echo "$r"
    done | jq -s .
}

# The same for OVS-DPDK's ovs-vswitchd (helper: scripts/peers/ovs-dpdk.sh). Each run in its own
# directory, and every OVS daemon waited for by pid: an exiting ovs-vswitchd unlinks its
# pidfile (ovs_stop then no longer sees it) and would take the next instance's with it.
ovs_pids() { local f; for f in "$1"/*.pid; do [ -s "$f" ] && cat "$f"; done; return 0; }
ovs_links_up() {
    for _ in $(seq 300); do
        [ "$(_ovs_ctl get Interface vhu1 link_state 2>/dev/null)" = up ] &&
            [ "$(_ovs_ctl get Interface vhu2 link_state 2>/dev/null)" = up ] && return 0
        sleep 0.05
    done
    log "OVS: vhost-user links not up"; return 1
}
ovs_restart_once() {
    local i=$1 d=$work/ovs$1 g=$work/ovsg$1 rx tx pid p t_kill t_exit t_start
    mkdir -p "$d" "$g"
    gen_bg "$g/rx.json" --socket "$g/g2.sock" --server --ring 1024 --src 02:00:00:00:00:02 \
        --duration 100000 --idle 100000 --quiet rxonly
    rx=$last
    gen_bg "$g/tx.json" --socket "$g/g1.sock" --server --ring 1024 --rate "$rrate" \
        --duration 100000 --quiet txonly
    tx=$last
    wait_sock "$g/g1.sock"; wait_sock "$g/g2.sock"
    ovs_start "$d" "$pmd" client "$g/g1.sock" "$g/g2.sock" >"$g/ovs-start.log" 2>&1
    for p in $(ovs_pids "$d"); do track "$p"; done
    ovs_links_up
    sleep 2
    # ovs_restart_vswitchd's steps, with timestamps and the same wait W as for ferrovsd.
    pid=$(cat "$d/ovs-vswitchd.pid")
    t_kill=$(now_us)
    ovs_appctl exit >/dev/null 2>&1 || true
    for _ in $(seq 3000); do ours "$pid" || break; sleep 0.005; done  # (a zombie counts as gone)
    t_exit=$(now_us)
    sleep "$(awk -v w="$rwait_ms" 'BEGIN { print w / 1000 }')"
    t_start=$(now_us)
    _ovs_vswitchd "$d" >>"$g/ovs-start.log" 2>&1
    for p in $(ovs_pids "$d"); do track "$p"; done
    ovs_links_up
    sleep 2
    kill -TERM "$tx"; wait "$tx" || true
    kill -TERM "$rx"; wait "$rx" || true
    local left; left=$(ovs_pids "$d")
    ovs_stop
    for p in $left; do for _ in $(seq 200); do ours "$p" || break; sleep 0.05; done; done
    stop_all
    jq -c --argjson kill "$t_kill" --argjson exit "$t_exit" --argjson start "$t_start" \
        '{raw_gap_us: .max_gap_us, wait_us: ($start - $exit),
          gap_us: (if .reconnects == 1 and .max_gap_us > ($start - $exit)
                   then (.max_gap_us - ($start - $exit)) * 10 | round / 10 else null end),
          kill_to_exit_ms: (($exit - $kill) / 100 | round / 10),
          receiver_reconnects: .reconnects, received: .received}' "$g/rx.json"
}

# Two guests, TCP A -> B for 12 s; with $1 = upgrade, `ferrovs upgrade` every second.
run_guests() {
    local d=$work/guests-$1 img=$root/target/guest
    rm -rf "$d"; mkdir -p "$d"
    bash tests/e2e/guest/build-initramfs.sh "$img" >&2
    setsid "$bin/ferrovsd" --run-dir "$d" --pmd-cores "$pmd" >"$d/ferrovsd.err" 2>&1 &
    track "$!"
    wait_sock "$d/vm2.sock"
    local name mac args sock
    for name in a b; do
        if [ "$name" = a ]; then
            mac=52:54:00:00:00:01 sock=$d/vm1.sock
            args="ferrovs.ip=10.0.0.1/24 ferrovs.cmd=tool ferrovs.peer=10.0.0.2 ferrovs.wait=60 ferrovs.args=tcp-send,10.0.0.2,5000,12"
        else
            mac=52:54:00:00:00:02 sock=$d/vm2.sock
            args="ferrovs.ip=10.0.0.2/24 ferrovs.cmd=tool ferrovs.args=tcp-recv,5000"
        fi
        setsid qemu-system-x86_64 -accel tcg -m 256 -smp 1 -nographic -no-reboot -nodefaults \
            -serial "file:$d/$name.console" -kernel "$img/vmlinuz" -initrd "$img/initramfs.gz" \
            -append "console=ttyS0 quiet $args" \
            -object memory-backend-memfd,id=mem,size=256M,share=on -numa node,memdev=mem \
            -chardev "socket,id=c0,path=$sock" -netdev vhost-user,id=n0,chardev=c0 \
            -device "virtio-net-pci,netdev=n0,mac=$mac,vectors=0" -name "$d/$name" >/dev/null 2>&1 &
        track "$!"
    done
    for _ in $(seq 1200); do grep -q FERROVS-PEER-UP "$d/a.console" 2>/dev/null && break; sleep 0.1; done
    local n=0
    : >"$d/reports.jsonl"
    if [ "$1" = upgrade ]; then
        for _ in $(seq 11); do
            sleep 1
            if setsid "$bin/ferrovs" --run-dir "$d" upgrade --json >"$d/report.json"; then
                jq -c . "$d/report.json" >>"$d/reports.jsonl"
                track "$(jq .new_pid "$d/report.json")"
                n=$((n + 1))
            fi
        done
    fi
    for _ in $(seq 600); do grep -q FERROVS-TOOL-DONE "$d/a.console" 2>/dev/null && break; sleep 0.1; done
    local res; res=$(sed -n 's/.*FERROVS-RESULT //p' "$d/a.console" | head -1)
    local down; down=$(jq -s -c "$jq_lib"' map(.downtime_us) | if length == 0 then null
        else {p50: (pct(50) | r1), p99: (pct(99) | r1), max: (max | r1)} end' "$d/reports.jsonl")
    stop_all
    jq -c --argjson n "$n" --argjson down "$down" \
        '{upgrades: $n, tcp_mbps: .mbps, retransmits, bytes, downtime_us: $down}' <<<"${res:-null}"
}

results=$work/results.jsonl
: >"$results"
declare -A restart_cache
for n in $ports; do
    [ "$n" -ge 1 ] || { log "bad port count $n"; exit 2; }
    log "N=$n: $upgrades upgrades under $rate pps"
    up=$(run_upgrades "$n")
    log "N=$n: upgrades: $(jq -c '{downtime_us, freeze_us, prepare_ms, traffic, traffic_gap_us}' <<<"$up")"
    rn=$(( n < 2 ? 2 : n ))
    if [ -z "${restart_cache[$rn]:-}" ]; then
        log "N=$rn: $restarts plain restarts of ferrovsd"
        restart_cache[$rn]=$(run_restarts "$rn")
    fi
    jq -c "$jq_lib"' (map(.gap_us // empty)) as $g
        | $up + {restart: {ports: $rn, wait_us: $w, gap_us: {runs: map(.gap_us), p50: ($g | pct(50)), max: ($g | max)},
                           runs: .},
                 restart_gap_over_upgrade_downtime_p99: (
                   if $up.downtime_us.p99 and ($g | length) > 0 then {restart_p50: (($g | pct(50)) / $up.downtime_us.p99 | round),
                                                 restart_max: (($g | max) / $up.downtime_us.p99 | round)}
                   else null end),
                 restart_gap_over_traffic_gap_p99: (
                   if $up.traffic_gap_us.p99 and ($g | length) > 0 then {restart_p50: (($g | pct(50)) / $up.traffic_gap_us.p99 * 100 | round / 100),
                                                 restart_max: (($g | max) / $up.traffic_gap_us.p99 * 100 | round / 100)}
                   else null end)}' \
        --argjson up "$up" --argjson rn "$rn" --argjson w $((rwait_ms * 1000)) \
        <<<"${restart_cache[$rn]}" >>"$results"
    log "N=$n: restart gaps $(tail -1 "$results" | jq -c '.restart.gap_us'), ratios $(tail -1 "$results" | jq -c '[.restart_gap_over_upgrade_downtime_p99, .restart_gap_over_traffic_gap_p99]')"
done

ovs_json='{"restart": null, "note": "skipped (--no-ovs)"}'
if [ "$ovs" = 1 ]; then
    if [ -f scripts/peers/ovs-dpdk.sh ] && [ -x /usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk ]; then
        # shellcheck source=/dev/null
        source scripts/peers/ovs-dpdk.sh
        log "OVS-DPDK: $restarts restarts of ovs-vswitchd"
        ovs_runs=$(for i in $(seq "$restarts"); do
            r=$(ovs_restart_once "$i"); log "  ovs restart $i: $r"; echo "$r"; done | jq -s -c .)
        ovs_json=$(jq -c "$jq_lib"' (map(.gap_us // empty)) as $g
            | {restart: {ports: 2, gap_us: {runs: map(.gap_us), p50: ($g | pct(50)), max: ($g | max)}, runs: .},
               note: "ovs-appctl exit, wait for the pid to end, wait W, start ovs-vswitchd-dpdk again on the same database; the gap as for ferrovsd (receiver longest gap - W)"}' <<<"$ovs_runs")
    else
        ovs_json='{"restart": null, "note": "TODO: OVS-DPDK not available (scripts/peers/ovs-dpdk.sh or ovs-vswitchd-dpdk missing)"}'
    fi
fi

guests_json=null
if [ "$guests" = 1 ]; then
    log "guests: TCP stream without upgrades"
    g0=$(run_guests plain)
    log "guests: TCP stream with an upgrade every second"
    g1=$(run_guests upgrade)
    guests_json=$(jq -n -c --argjson a "$g0" --argjson b "$g1" '{without_upgrades: $a, with_upgrades: $b}')
fi

jq -s --argjson rate "$rate" --argjson rrate "$rrate" --argjson w $((rwait_ms * 1000)) \
    --argjson ovs "$ovs_json" --argjson guests "$guests_json" \
    --arg host "$(uname -r), $ncpu cpus" --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --argjson pmd "$pmd" --argjson gen "$gen" '{
    benchmark: "upgrade", date: $date, host: $host, pmd_core: $pmd, traffic_core: $gen,
    rate_pps: $rate, restart_rate_pps: $rrate, restart_wait_us: $w,
    method: {
      downtime_us: "reported by the daemons: CLOCK_MONOTONIC from the freeze in the old ferrovsd to the PMDs running in the new one (ferrovs upgrade-history)",
      traffic: "one ferrovs-gen, txonly on vm1 + --sink vm2 in the same thread at rate_pps for the whole series; max_gap_us: longest time between two received packets, including every time the generator itself was descheduled on its shared core",
      restart_gap_us: "SIGTERM ferrovsd, wait for its exit, wait restart_wait_us, start it on the same run dir (vhost-user-client ports, ferrovs-gen --server guests); gap = the receiver longest gap between two packets - restart_wait_us",
      traffic_gap_us: "per upgrade (--probes extra upgrades, each inside its own short generator run): the receiver longest gap between two packets; baseline_without_upgrade: the same runs without an upgrade",
      ratio: "restart gap (p50, max) / upgrade downtime p99 (as the daemons report it), and / traffic_gap_us p99, per port count"},
    ferrovs: ., ovs_restart: $ovs.restart, ovs_note: $ovs.note, guests_tcp: $guests}' "$results"
