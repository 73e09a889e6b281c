#!/usr/bin/env bash
# Configured through OVSDB: how long `ovs-vsctl` takes to add 1, 100 and 1000 vhost-user ports
# and until they are in the switch's datapath, ferrovs (`ferrovsd --ovsdb`) beside OVS-DPDK's
# ovs-vswitchd, with the same database commands, interleaved round by round in one run.
#
# Each switch gets its own ovsdb-server (stock vswitch.ovsschema, fresh database) in its own
# run directory, started fresh every round; its PMD runs on the last core (the same core for
# both), every process under test is started with setsid (autogroup scheduling treats them
# alike). The commands are OVS-DPDK's documented ones, WITHOUT --no-wait (ovs-vsctl waits for
# cur_cfg to reach next_cfg and for the new interfaces' ofport: the change is applied):
#   ovs-vsctl add-br br0 -- set bridge br0 datapath_type=netdev
#   ovs-vsctl add-port br0 vhuI -- set Interface vhuI type=dpdkvhostuser
# Per N, two cells:
#   txn     all N add-ports chained with `--` in ONE ovs-vsctl invocation (one transaction);
#           the datapath is polled (~10 ms) while it runs
#   per-port  N invocations one after another, each timed (its round trip); the datapath is
#           polled once the last returned (polling meanwhile would load the 2 cores the
#           commands are timed on)
# and `del-br br0` after each (timed, ovs-vsctl waits for it too). "In the datapath": ferrovs
# `ferrovs show --json` lists the port on br0; OVS `ovs-appctl dpif/show` lists it. The
# vhost-user sockets are counted in the run directory alike.
#
# Prints JSON: per N and cell the median over the rounds of the seconds until ovs-vsctl
# returned, until all N ports were in the datapath and all N sockets existed, del-br, and for
# per-port the median and p99 round trip (ms); ratios ferrovs/OVS (below 1: ferrovs faster).
# A cell that hits its timeout (--timeout S, per cell) says so and keeps what it measured.
#
# --raw FILE keeps every round's line (with each command's round trip, rtt_ms) in FILE.
#
#   bench/ovsdb.sh [--rounds 3] [--ports "1 100 1000"] [--peers "ferrovs ovs"] [--timeout 300]
#                  [--raw FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=3 ports="1 100 1000" who_list="ferrovs ovs" cell_timeout=300 raw=
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --ports) ports=$2; shift 2 ;;
        --peers) who_list=$2; shift 2 ;;
        --timeout) cell_timeout=$2; shift 2 ;;
        --raw) raw=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
for t in ovsdb-server ovsdb-tool ovs-vsctl ovs-appctl jq; do
    command -v "$t" >/dev/null || { echo "bench: $t is missing (scripts/deps.sh)" >&2; exit 1; }
done
bash scripts/deps.sh >/dev/null
cargo build --release --quiet -p ferrovsd -p ferrovs
bin=${CARGO_TARGET_DIR:-$root/target}/release
pmd=$(($(nproc) - 1))
work=$(mktemp -d /tmp/ferrovs-bench-ovsdb.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
# shellcheck source=scripts/peers/ovs-dpdk.sh
source scripts/peers/ovs-dpdk.sh
ovs_up=
cleanup() { [ -n "$ovs_up" ] && ovs_stop; stop_all; rm -rf "$work"; }
trap cleanup EXIT INT TERM

# Times in microseconds since the epoch (bash's clock: no process per reading).
now() { echo "${EPOCHREALTIME/./}"; }
secs() { printf '%d.%04d' $(($1 / 1000000)) $(($1 % 1000000 / 100)); }
since() { local t=${EPOCHREALTIME/./}; secs $((t - $1)); }
past() { [ "${EPOCHREALTIME/./}" -gt "$1" ]; }

# The switch under test: $who, its run directory $dir (vhost sockets there too), its database.
db() { echo "unix:$dir/db.sock"; }
vsctl() { timeout $((cell_timeout + 10)) ovs-vsctl --db="$(db)" --timeout="$cell_timeout" "$@"; }

start_switch() {
    dir=$work/$who
    rm -rf "$dir"; mkdir -p "$dir"
    case $who in
        ferrovs)
            ovsdb-tool create "$dir/conf.db" /usr/share/openvswitch/vswitch.ovsschema
            setsid ovsdb-server "$dir/conf.db" --remote="punix:$dir/db.sock" \
                --unixctl="$dir/ovsdb-server.ctl" --log-file="$dir/ovsdb-server.log" >/dev/null 2>&1 &
            track $!
            wait_sock "$dir/db.sock"
            ovs-vsctl --db="$(db)" --timeout=10 --no-wait init
            setsid "$bin/ferrovsd" --run-dir "$dir" --pmd-cores "$pmd" --ovsdb "$(db)" >"$dir/ferrovsd.log" 2>&1 &
            track $!
            wait_sock "$dir/ferrovs.ctl"
            ;;
        ovs)
            ovs_start_bare "$dir" "$pmd" >/dev/null 2>&1 || { log "OVS-DPDK did not start: $(tail -3 "$dir/ovs-vswitchd.log")"; return 1; }
            ovs_up=1
            ;;
    esac
}
stop_switch() {
    case $who in
        ferrovs) stop_all ;;
        ovs) ovs_stop; ovs_up= ;;
    esac
}

# How many of the ports vhu* are in br0's datapath.
in_datapath() {
    case $who in
        # (grep, not jq: jq alone takes ~30 ms here, which would be the probe's resolution;
        # br0 is the only bridge, and only ports carry a "name" vhu*.)
        ferrovs) { "$bin/ferrovs" --run-dir "$dir" show --json 2>/dev/null || true; } | grep -c '"name": "vhu' || true ;;
        ovs) { ovs-appctl -t "$dir/ovs-vswitchd.ctl" dpif/show 2>/dev/null || true; } | grep -cE '^ +vhu[0-9]+ ' || true ;;
    esac
}
sockets() { local s=("$dir"/vhu*); [ -e "${s[0]}" ] && echo "${#s[@]}" || echo 0; }

# Polls (every ~10 ms) until all $1 ports are in the datapath and their sockets exist, or
# until $3 (epoch seconds); prints "DATAPATH_S SOCKETS_S" since $2 ("null" when never).
poll_ready() {
    local n=$1 t0=$2 until=$3 dp=null so=null
    while :; do
        [ "$dp" = null ] && [ "$(in_datapath)" -ge "$n" ] && dp=$(since "$t0")
        [ "$so" = null ] && [ "$(sockets)" -ge "$n" ] && so=$(since "$t0")
        [ "$dp" != null ] && [ "$so" != null ] && break
        past "$until" && break
        sleep 0.01
    done
    echo "$dp $so"
}

# del-br br0 (timed); then waits, bounded, until the datapath and the sockets are empty.
del_br() {
    local t0 s; t0=$(now)
    vsctl del-br br0 >/dev/null 2>&1 || { echo null; return; }
    s=$(since "$t0")
    for _ in $(seq 500); do [ "$(in_datapath)" -eq 0 ] && [ "$(sockets)" -eq 0 ] && break; sleep 0.02; done
    echo "$s"
}
add_br() { vsctl add-br br0 -- set bridge br0 datapath_type=netdev >/dev/null; }

# One cell; prints its JSON line.
cell() {
    local n=$1 mode=$2 t0 until vs=null timed_out=false err= rtts=() r
    add_br || { jq -n -c '{error: "add-br failed"}'; return; }
    until=$(($(now) + cell_timeout * 1000000))
    case $mode in
        txn)
            local args=() i
            for i in $(seq "$n"); do args+=(-- add-port br0 "vhu$i" -- set Interface "vhu$i" type=dpdkvhostuser); done
            t0=$(now)
            ( if vsctl "${args[@]:1}" >"$work/vsctl.out" 2>&1; then now >"$work/vsctl.done"; else echo fail >"$work/vsctl.done"; fi ) &
            local vp=$!
            read -r dp so < <(poll_ready "$n" "$t0" "$until")
            wait "$vp" || true
            r=$(cat "$work/vsctl.done"); rm -f "$work/vsctl.done"
            if [ "$r" = fail ]; then err=$(head -c 300 "$work/vsctl.out"); else vs=$(secs $((r - t0))); fi
            ;;
        per-port)
            local i a
            t0=$(now)
            for i in $(seq "$n"); do
                a=$(now)
                vsctl add-port br0 "vhu$i" -- set Interface "vhu$i" type=dpdkvhostuser >"$work/vsctl.out" 2>&1 ||
                    { err="vhu$i: $(head -c 300 "$work/vsctl.out")"; break; }
                rtts+=("$(since "$a")")
                past "$until" && { timed_out=true; break; }
            done
            [ -z "$err" ] && [ "$timed_out" = false ] && vs=$(since "$t0")
            read -r dp so < <(poll_ready "$n" "$t0" "$until")
            ;;
    esac
    [ "$dp" = null ] || [ "$so" = null ] && timed_out=true
    [ -n "$err" ] && [[ $err == *"timed out"* ]] && timed_out=true
    local del; del=$(del_br)
    jq -n -c --argjson vs "$vs" --argjson dp "$dp" --argjson so "$so" --argjson del "$del" \
        --argjson to "$timed_out" --arg err "$err" --argjson done_ports "${#rtts[@]}" \
        --argjson rtts "[$(IFS=,; echo "${rtts[*]}")]" '
        {vsctl_s: $vs, datapath_s: $dp, sockets_s: $so, del_br_s: $del, timed_out: $to}
        + (if $err == "" then {} else {error: $err} end)
        + (if ($rtts | length) > 0 then {commands: $done_ports, rtt_ms: ($rtts | map(. * 1000))} else {} end)'
}

results=$work/results.jsonl
: >"$results"
for round in $(seq "$rounds"); do
    for who in $who_list; do
        start_switch || { log "round $round: $who did not start"; stop_switch; continue; }
        for n in $ports; do
            for mode in txn per-port; do
                r=$(cell "$n" "$mode")
                log "round $round $who N=$n $mode: $(jq -c 'del(.rtt_ms)' <<<"$r")"
                jq -c --arg who "$who" --arg mode "$mode" --argjson n "$n" --argjson round "$round" \
                    '. + {who: $who, mode: $mode, ports: $n, round: $round}' <<<"$r" >>"$results"
                [ -z "$raw" ] || tail -1 "$results" >>"$raw"
            done
        done
        stop_switch
    done
done

jq -s --argjson rounds "$rounds" --argjson timeout "$cell_timeout" --argjson core "$pmd" '
  def median: map(select(. != null)) | sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  # A round that timed out took longer than every round that did not: it counts as infinite,
  # and a median that is one is null (the cell then says at_least_s: the timeout).
  def median_t: map(. // 1e12) | sort | if length == 0 then null else .[(length - 1) / 2 | floor] end
      | if . == null or . >= 1e12 then null else . end;
  def pct($p): sort | if length == 0 then null else .[((length * $p) | ceil) - 1] end;
  def r3: if . == null then null else (. * 1000 | round / 1000) end;
  def ratio($a; $b): if $a and $b and $b > 0 then (($a / $b) * 1000 | round / 1000) else null end;
  def summary: {
      vsctl_s: (map(.vsctl_s) | median_t | r3), datapath_s: (map(.datapath_s) | median_t | r3),
      sockets_s: (map(.sockets_s) | median_t | r3), del_br_s: (map(.del_br_s) | median | r3),
      at_least_s: (if (map(.vsctl_s) | median_t) == null and any(.[]; .timed_out) then $timeout else null end),
      rtt_median_ms: (map(.rtt_ms // empty | median) | median | r3),
      rtt_p99_ms: (map(.rtt_ms // empty | pct(0.99)) | median | r3),
      commands: (map(.commands // empty) | median),
      rounds_timed_out: (map(select(.timed_out)) | length),
      errors: (map(.error // empty) | unique),
      runs: map({vsctl_s, datapath_s, sockets_s, del_br_s})};
  group_by([.ports, .mode]) | map(
    (.[0]) as $c
    | (group_by(.who) | map({key: .[0].who, value: summary}) | from_entries) as $by
    | {ports: $c.ports, mode: $c.mode, results: $by,
       ratio_ferrovs_to_ovs: (["vsctl_s", "datapath_s", "sockets_s", "del_br_s", "rtt_median_ms", "rtt_p99_ms"]
         | map({key: ., value: ratio($by.ferrovs[.]; $by.ovs[.])}) | from_entries)}
       + (if $by.ovs.at_least_s and $by.ferrovs.vsctl_s then
            {ratio_ferrovs_to_ovs_at_most: {vsctl_s: ratio($by.ferrovs.vsctl_s; $by.ovs.at_least_s),
                                            datapath_s: ratio($by.ferrovs.datapath_s; $by.ovs.at_least_s)}}
          else {} end))
  | {bench: "ovsdb",
     source: "ovs-vsctl (openvswitch 3.1) against ovsdb-server; ferrovsd --ovsdb vs ovs-vswitchd-dpdk",
     commands: {bridge: "ovs-vsctl add-br br0 -- set bridge br0 datapath_type=netdev",
                port: "ovs-vsctl add-port br0 vhuN -- set Interface vhuN type=dpdkvhostuser",
                txn: "all N add-ports chained with -- in one invocation", "per-port": "N invocations, one after another",
                wait: "without --no-wait (cur_cfg and ofport)"},
     datapath: {ferrovs: "ferrovs show --json, ports of br0", ovs: "ovs-appctl dpif/show"},
     pmd_core: $core, rounds: $rounds, cell_timeout_s: $timeout, cells: .}
' "$results"
