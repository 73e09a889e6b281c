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
