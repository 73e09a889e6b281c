# Shared by the bench scripts that run processes under test (sourced, after they set $work:
# their private work directory under /tmp).
#
# Every process a bench starts is tracked (`track PID`) and stopped by pid (`stop_all`), and
# only while its command line still names $work: a recycled pid is never hit.

log() { echo "bench: $*" >&2; }
track() { echo "$1" >>"$work/pids"; }
ours() { local c; c=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") && [[ $c == *"$work/"* ]]; }
# SIGTERM to every tracked process, up to 5 s for them to end, SIGKILL to the rest; the list
# is emptied.
stop_all() {
    local p left=() alive
    [ -f "$work/pids" ] || return 0
    for p in $(sort -un "$work/pids"); do ours "$p" && { kill -TERM "$p" 2>/dev/null || true; left+=("$p"); }; done
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
    : >"$work/pids"
}
wait_sock() { for _ in $(seq 400); do [ -S "$1" ] && return 0; sleep 0.05; done; log "no socket $1"; return 1; }
# Waits up to $3 seconds for $2 on the guest console $1 (fails at once on FERROVS-ERROR).
wait_console() {
    local i
    for i in $(seq $(($3 * 10))); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        grep -q FERROVS-ERROR "$1" 2>/dev/null && { log "$1: $(grep FERROVS-ERROR "$1")"; return 1; }
        sleep 0.1
    done
    log "$1: no $2 within $3 s"; return 1
}

# The path of bench/tools/core-pingpong.c built (once, when the source is newer) under the
# repository's target/.
pingpong_bin() {
    local top; top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    local out=$top/target/core-pingpong src=$top/bench/tools/core-pingpong.c
    mkdir -p "$top/target"
    [ "$out" -nt "$src" ] || cc -O2 -pthread -o "$out" "$src"
    echo "$out"
}

# The host's core-to-core round trip now (ns), between cores $1 and $2 (both idle): a cache
# line bounced between a thread on each. On a VM the hypervisor moves the vCPUs, and a round
# trip of 55 ns or of 350 ns a few seconds apart moves a switch whose time is cross-core misses
# more than anything in the switch (docs/datapath.md, "One frontend per round"). null if it
# could not be measured.
host_rtt() {
    local bin; bin=$(pingpong_bin) || { echo null; return; }
    "$bin" "$1" "$2" 2>/dev/null | jq '.round_trip_ns' 2>/dev/null || echo null
}
