#!/usr/bin/env bash
# Soak: random operations on a switch under traffic, invariants checked throughout.
#
# ferrovsd (default config: bridge br0, vhost-user server ports vm1 and vm2, rule
# `priority=0 actions=NORMAL`) with its PMD on the last core. Traffic: ferrovs-gen sends 64-byte
# UDP into vm1 and receives on vm2 in the same process (txonly --sink: every packet accounted
# for) at --rate pps, in rounds of --round seconds; a new round is a new frontend on vm1 and vm2
# (a guest driver reset of both traffic ports). Meanwhile, every --op-gap seconds (jittered), one
# random operation:
#   port-add     add-port br0 sN type=vhost-user, an idle ferrovs-gen guest attached (<= 4 such)
#   port-del     del-port of one of them (its guest still connected: the switch drops it)
#   guest-reset  an idle guest killed and started again on its port (driver reset/reconnect)
#   rule-add     add-flow br0 'priority=100+K,tcp,tp_dst=P actions=drop' (never matches the UDP
#                traffic; each change rebuilds the pipeline and revalidates the caches)
#   rule-del     del-flows br0 --strict of one of them
#   upgrade      ferrovs upgrade --json (hot upgrade: the pid changes, nothing reconnects)
#   log-level    ferrovs log-level ferrovs_control debug, then back to info
#   capture      ferrovs capture vm1 --count 100 -w /dev/null (only when this ferrovs has the
#                capture subcommand: the step is skipped, and said so, otherwise)
# Invariants (a violation is recorded with a precise message, and the script exits 1):
#   * the daemon never dies: checked every second; the pid changes only by an upgrade (the
#     new pid is the one the upgrade reported);
#   * fds flat: after all churn ports are gone, the daemon's fd count is back to the
#     baseline taken in the same state after warm-up (tolerance: +2, the control connections
#     of a CLI call racing the count);
#   * RSS flat: after warm-up (the first 10% of the run, at least 30 s), RSS stays within
#     +10 MiB of the baseline taken then;
#   * every packet accounted for: per round, packets the generator lost (sent - received)
#     <= the drops the switch counted on vm1 and vm2 during the round, by reason;
#     and the generator saw no corrupt, foreign or reordered packet and no reconnect.
# Prints one JSON document on stdout (progress on stderr): operations done by kind, packets,
# drops by reason, fd/RSS min/max, upgrades and their downtime (p50/max, from the daemons'
# reports), violations.
#
#   bench/soak.sh --minutes N [--rate 20000] [--round 20] [--op-gap 1] [--seed S] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
minutes=5 rate=20000 round=20 op_gap=1 seed=$$ keep=0
while [ $# -gt 0 ]; do
    case $1 in
        --minutes) minutes=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --round) round=$2; shift 2 ;;
        --op-gap) op_gap=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
bin=${FERROVS_BIN_DIR:-$root/target/release}
[ -n "${FERROVS_BIN_DIR:-}" ] || cargo build --release --quiet
command -v jq >/dev/null || { echo "soak: needs jq" >&2; exit 2; }
ncpu=$(nproc)
pmd=$((ncpu - 1)); gen=0; [ "$ncpu" -gt 1 ] && gen=$((ncpu - 2))
work=$(mktemp -d /tmp/ferrovs-soak.XXXXXX)
# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
log() { echo "soak: $*" >&2; }
RANDOM=$seed
cleanup() {
    stop_all
    if [ "$keep" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

d=$work/run
mkdir -p "$d"
fv() { "$bin/ferrovs" --run-dir "$d" "$@"; }
now() { date +%s; }
violations=$work/violations
: >"$violations"
violate() { log "VIOLATION: $*"; jq -cn --arg m "$*" --argjson t "$(($(now) - t0))" '{t_s: $t, what: $m}' >>"$violations"; }
declare -A ops=([port-add]=0 [port-del]=0 [guest-reset]=0 [rule-add]=0 [rule-del]=0
                [upgrade]=0 [upgrade-failed]=0 [log-level]=0 [capture]=0 [capture-skipped]=0)

setsid "$bin/ferrovsd" --run-dir "$d" --pmd-cores "$pmd" >"$d/ferrovsd.err" 2>&1 &
pid=$!; track "$pid"
wait_sock "$d/vm2.sock"
pids=("$pid")

# ---- traffic rounds ----------------------------------------------------------------------
drops_of() {  # counted drops on vm1 and vm2 (both directions), as {reason: n}
    fv port-stats --json | jq -c '[.[] | select(.port == "vm1" or .port == "vm2")
        | (.rx.drops, .tx.drops) | to_entries[]] | group_by(.key)
        | map({key: .[0].key, value: (map(.value) | add)}) | from_entries'
}
round_n=0
start_round() {
    round_n=$((round_n + 1))
    drops_of >"$work/drops-before.json"
    setsid nice -n 5 taskset -c "$gen" "$bin/ferrovs-gen" --socket "$d/vm1.sock" --sink "$d/vm2.sock" \
        --ring 1024 --rate "$rate" --duration "$round" --quiet txonly >"$work/round.json" 2>"$work/round.err" &
    gen_pid=$!; track "$gen_pid"
    round_sending_until=$(($(now) + round))
    round_end=$((round_sending_until + 5))
}
: >"$work/rounds.jsonl"
finish_round() {
    wait "$gen_pid" || { violate "round $round_n: ferrovs-gen failed: $(tail -c 300 "$work/round.err")"; return; }
    local after; after=$(drops_of)
    if ! jq -e . "$work/round.json" >/dev/null 2>&1; then
        violate "round $round_n: no report from ferrovs-gen"; return
    fi
    jq -c --argjson b "$(cat "$work/drops-before.json")" --argjson a "$after" --argjson n "$round_n" '
        ($a | with_entries(.value -= ($b[.key] // 0)) | with_entries(select(.value > 0))) as $dd
        | {round: $n, sent, received, lost, corrupt, foreign, reordered, reconnects,
           counted_drops: ([$dd[]] | add // 0), drops: $dd}' "$work/round.json" >>"$work/rounds.jsonl"
    local r; r=$(tail -1 "$work/rounds.jsonl")
    jq -e '.lost <= .counted_drops' <<<"$r" >/dev/null ||
        violate "round $round_n: $(jq -r '"\(.lost) packets lost (sent \(.sent), received \(.received)) but only \(.counted_drops) drops counted \(.drops)"' <<<"$r")"
    jq -e '.corrupt == 0 and .foreign == 0 and .reordered == 0 and .reconnects == 0' <<<"$r" >/dev/null ||
        violate "round $round_n: generator saw $(jq -c '{corrupt, foreign, reordered, reconnects}' <<<"$r")"
}

# ---- health ------------------------------------------------------------------------------
fds() { find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0; }
: >"$work/samples.jsonl"
check_alive() {
    if ! kill -0 "$pid" 2>/dev/null || ! ours "$pid"; then
        violate "ferrovsd (pid $pid) died: $(tail -3 "$d/ferrovsd.err" "$d/ferrovsd.log" 2>/dev/null | tr '\n' ' ')"
        return 1
    fi
    local shown; shown=$(fv show --json 2>/dev/null | jq .pid) || shown=none
    if [ "$shown" != "$pid" ]; then
        violate "the control socket answers for pid $shown, expected $pid (no upgrade said so)"
        return 1
    fi
    local rss; rss=$(rss_kib)
    echo "{\"t\":$(($(now) - t0)),\"pid\":$pid,\"fds\":$(fds),\"rss_kib\":$rss}" >>"$work/samples.jsonl"
    if [ -n "${rss_base:-}" ] && [ "$rss" -gt $((rss_base + 10240)) ]; then
        violate "RSS $rss KiB is more than 10 MiB over the baseline $rss_base KiB"
    fi
}

# ---- operations --------------------------------------------------------------------------
declare -A churn=()    # port -> guest pid
next_port=0
idle_guest() {  # $1 port: starts an idle guest on it, sets churn[$1]
    setsid nice -n 5 taskset -c "$gen" "$bin/ferrovs-gen" --socket "$d/$1.sock" --src "$(printf '02:00:00:00:01:%02x' $((next_port % 256)))" \
        --duration 100000 --quiet idle >/dev/null 2>"$work/$1.err" &
    churn[$1]=$!; track "$!"
}
stop_guest() {
    local g=${churn[$1]:-}
    if [ -n "$g" ]; then kill -TERM "$g" 2>/dev/null || true; wait "$g" 2>/dev/null || true; fi
}
rules=()
have_capture=0
# (`capture --help` fails: clap wants PORT first; the command list names it.)
grep -q '^  capture PORT' <<<"$("$bin/ferrovs" help 2>&1)" && have_capture=1
: >"$work/upgrades.jsonl"
op() {
    local kinds=(port-add port-del guest-reset rule-add rule-del upgrade log-level capture)
    local k=${kinds[$((RANDOM % ${#kinds[@]}))]} names p r
    names=("${!churn[@]}")
    case $k in
        port-add)
            [ "${#names[@]}" -ge 4 ] && return 0
            next_port=$((next_port + 1)); p=s$next_port
            fv add-port br0 "$p" type=vhost-user path="$d/$p.sock" || { violate "add-port $p failed"; return; }
            wait_sock "$d/$p.sock" || { violate "no socket for $p"; return; }
            idle_guest "$p" ;;
        port-del)
            [ "${#names[@]}" -eq 0 ] && return 0
            p=${names[$((RANDOM % ${#names[@]}))]}
            fv del-port br0 "$p" || { violate "del-port $p failed"; return; }
            stop_guest "$p"; unset "churn[$p]" ;;
        guest-reset)
            [ "${#names[@]}" -eq 0 ] && return 0
            p=${names[$((RANDOM % ${#names[@]}))]}
            stop_guest "$p"; idle_guest "$p" ;;
        rule-add)
            r="priority=$((100 + RANDOM % 100)),tcp,tp_dst=$((1 + RANDOM % 60000))"
            fv add-flow br0 "$r actions=drop" >/dev/null || { violate "add-flow $r failed"; return; }
            rules+=("$r") ;;
        rule-del)
            [ "${#rules[@]}" -eq 0 ] && return 0
            local i=$((RANDOM % ${#rules[@]}))
            fv del-flows br0 --strict "${rules[$i]}" >/dev/null || { violate "del-flows ${rules[$i]} failed"; return; }
            rules=("${rules[@]:0:$i}" "${rules[@]:$((i + 1))}") ;;
        upgrade)
            if setsid taskset -c "$gen" "$bin/ferrovs" --run-dir "$d" upgrade --json >"$work/up.json" 2>"$work/up.err"; then
                local np; np=$(jq .new_pid "$work/up.json")
                track "$np"; pid=$np; pids+=("$np")
                jq -c '{new_pid, downtime_us, total_ms}' "$work/up.json" >>"$work/upgrades.jsonl"
            else
                ops[upgrade-failed]=$((ops[upgrade-failed] + 1))
                violate "upgrade failed: $(tail -c 300 "$work/up.err")"
                return
            fi ;;
        log-level)
            fv log-level ferrovs_control debug >/dev/null && fv log-level ferrovs_control info >/dev/null ||
                { violate "log-level failed"; return; } ;;
        capture)
            # (An older ferrovs has no `ferrovs capture`: the step is then skipped.)
            if [ "$have_capture" = 0 ]; then ops[capture-skipped]=$((ops[capture-skipped] + 1)); return 0; fi
            # The capture waits for 100 packets of the round's traffic, and the loop waits
            # for it: near the end of a round's sending (or after it) there may be none until
            # the next round, which this loop would start only after the capture: not now.
            [ $((round_sending_until - $(now))) -ge 3 ] || return 0
            timeout 20 "$bin/ferrovs" --run-dir "$d" capture vm1 --count 100 -w /dev/null >/dev/null 2>"$work/cap.err" ||
                { violate "capture failed: $(tail -c 300 "$work/cap.err")"; return; } ;;
    esac
    ops[$k]=$((ops[$k] + 1))
}

# ---- the run -----------------------------------------------------------------------------
t0=$(now)
total=$((minutes * 60))
warm=$((total / 10)); [ "$warm" -lt 30 ] && warm=30
end=$((t0 + total))
log "work dir $work, $minutes min, seed $seed, rate $rate pps, rounds of $round s, capture step: $([ "$have_capture" = 1 ] && echo on || echo 'skipped (no ferrovs capture)')"
start_round
fds_base= rss_base=
next_op=$(($(now) + 2))
while [ "$(now)" -lt "$end" ]; do
    check_alive || break
    if [ -z "$rss_base" ] && [ "$(now)" -ge $((t0 + warm)) ]; then
        rss_base=$(rss_kib)
        log "warm-up over: baseline RSS $rss_base KiB"
    fi
    if ! kill -0 "$gen_pid" 2>/dev/null || [ "$(now)" -ge "$round_end" ]; then
        finish_round
        # The fd baseline: no churn port, between rounds (no traffic guest), after warm-up.
        if [ -z "$fds_base" ] && [ -n "$rss_base" ] && [ "${#churn[@]}" -eq 0 ]; then
            fds_base=$(fds); log "fd baseline $fds_base"
        fi
        start_round
    fi
    if [ "$(now)" -ge "$next_op" ]; then
        op
        next_op=$(($(now) + op_gap + RANDOM % (op_gap + 1)))
    fi
    sleep 1
done
# Wind down: the last round, every churn port away; then the fds must be back.
wait "$gen_pid" 2>/dev/null || true
finish_round || true
for p in "${!churn[@]}"; do fv del-port br0 "$p" || violate "del-port $p failed"; stop_guest "$p"; unset "churn[$p]"; done
sleep 1
check_alive || true
fds_end=$(fds)
if [ -z "$fds_base" ]; then
    log "no fd baseline was taken during the run (always a churn port): comparing with the end state only"
elif [ "$fds_end" -gt $((fds_base + 2)) ]; then
    violate "fds $fds_end at the end, baseline $fds_base (tolerance +2)"
fi
fv upgrade-history --json >"$work/history.json" 2>/dev/null || echo '[]' >"$work/history.json"
for k in "${!ops[@]}"; do echo "$k ${ops[$k]}"; done |
    jq -R 'split(" ") | {key: .[0], value: (.[1] | tonumber)}' | jq -s 'from_entries' >"$work/ops.json"
fv port-stats --json >"$work/final-stats.json"
fv show --json >"$work/final-show.json"
jq -n --argjson minutes "$minutes" --argjson seed "$seed" --argjson rate "$rate" \
    --argjson fds_base "${fds_base:-null}" --argjson fds_end "$fds_end" --argjson rss_base "${rss_base:-null}" \
    --slurpfile ops "$work/ops.json" --slurpfile rounds "$work/rounds.jsonl" \
    --slurpfile samples "$work/samples.jsonl" --slurpfile ups "$work/upgrades.jsonl" \
    --slurpfile v "$violations" --slurpfile show "$work/final-show.json" --slurpfile fs "$work/final-stats.json" '
    def pct($p): sort | if length == 0 then null else .[([((length * $p / 100) | ceil) - 1, 0] | max)] end;
    {ok: ($v | length == 0), minutes: $minutes, seed: $seed, rate_pps: $rate,
     ops: $ops[0],
     packets: {rounds: ($rounds | length), sent: ([$rounds[].sent] | add), received: ([$rounds[].received] | add),
               lost: ([$rounds[].lost] | add), counted_drops: ([$rounds[].counted_drops] | add),
               drops_by_reason: ([$rounds[].drops | to_entries[]] | group_by(.key)
                   | map({key: .[0].key, value: (map(.value) | add)}) | from_entries)},
     switch_drops_by_reason_all_ports: ([$fs[0][] | (.rx.drops, .tx.drops) | to_entries[]] | group_by(.key)
                   | map({key: .[0].key, value: (map(.value) | add)}) | from_entries),
     fds: {baseline: $fds_base, end: $fds_end, min: ([$samples[].fds] | min), max: ([$samples[].fds] | max), tolerance: 2},
     rss_kib: {baseline_after_warmup: $rss_base, min: ([$samples[].rss_kib] | min), max: ([$samples[].rss_kib] | max),
               tolerance_kib: 10240},
     upgrades: {count: ($ups | length), downtime_us: {p50: ([$ups[].downtime_us] | pct(50)), max: ([$ups[].downtime_us] | max)},
                total_ms_p50: ([$ups[].total_ms] | pct(50))},
     daemon: {pids: ([$samples[].pid] | unique | length), final_pid: $show[0].pid, upgrades_reported: $show[0].upgrades,
              log_lines_suppressed: ($show[0].log_lines_suppressed // 0)},
     violations: $v}' | tee "$work/result.json"
jq -e .ok "$work/result.json" >/dev/null || { log "FAILED: $(jq -c .violations "$work/result.json")"; exit 1; }
