#!/usr/bin/env bash
# Hot-upgrade downtime under load, beside the gap a plain restart-and-reconnect causes.
#
# For each port count N (vhost-user ports, all connected, with started rings) ferrovsd runs its
# PMD on the last core; everything else runs on core 0.
#   upgrade  ports vm1, vm2 (ferrovs listens) carry --rate pps of 64-byte UDP for the whole
#            series (one ferrovs-gen: txonly on vm1, receiving on vm2 in the same thread, every
#            packet accounted for); ports g3..gN (vhost-user-client: the guests listen, as QEMU
#            server=on) have idle ferrovs-gen guests. --upgrades times `ferrovs upgrade --json`:
#            the daemon's own measure of each handover (freeze in the old daemon -> PMDs running
#            in the new one), and the longest gap between two packets the receiver saw.
#   restart  --restarts times: SIGTERM ferrovsd, start it again on the same run dir (it restores
#            its saved configuration and reconnects). All ports are vhost-user-client here so
#            that the guests survive; sender and receiver are then two processes sharing core 0,
#            so this traffic runs at --restart-rate (default 100000 pps: a receiver descheduled
#            for a few ms must not overflow its 1024-entry ring). The gap is the receiver's
#            longest time without a packet.
#   ovs      the same restart of OVS-DPDK's ovs-vswitchd (dpdkvhostuserclient ports, NORMAL,
#            database kept), N = 2.
#   guests   (--guests) two QEMU guests (TCG, tests/e2e/guest) with a TCP stream between them
#            (guest A -> B, unpaced) while ferrovs is upgraded every second: throughput and the
#            sender's TCP retransmissions, beside the same run without upgrades. Not together
#            with the 1 Mpps series: on 2 cores TCG guests would take the generator's core.
# Every process under test starts with setsid (own session) so autogroup scheduling treats them
# alike. Prints JSON: per N, downtime p50/p99/max, freeze p50/p99, prepare p50, traffic
# sent/received/lost and its longest gap, restart gaps, and restart gap / upgrade downtime p99.
#
#   bench/upgrade.sh [--ports "2 8 32"] [--upgrades 50] [--restarts 5] [--rate 1000000]
#                    [--restart-rate 100000] [--no-ovs] [--guests]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ports="2 8 32" upgrades=50 restarts=5 rate=1000000 rrate=100000 ovs=1 guests=0
while [ $# -gt 0 ]; do
    case $1 in
        --ports) ports=$2; shift 2 ;;
        --upgrades) upgrades=$2; shift 2 ;;
        --restarts) restarts=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --restart-rate) rrate=$2; shift 2 ;;
        --no-ovs) ovs=0; shift ;;
        --guests) guests=1; shift ;;
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
stop_all() {
    # Daemons started by `ferrovs upgrade` are not our children: find everything by run dir.
    pkill -f "$work/" 2>/dev/null || true
    sleep 0.3
    pkill -9 -f "$work/" 2>/dev/null || true
}
cleanup() { stop_all; [ -n "${ovs_dir:-}" ] && ovs_stop; rm -rf "$work"; }
trap cleanup EXIT INT TERM

gen() { setsid taskset -c "$gen" "$bin/ferrovs-gen" "$@"; }
wait_sock() { for _ in $(seq 400); do [ -S "$1" ] && return 0; sleep 0.05; done; log "no socket $1"; return 1; }
wait_file() { for _ in $(seq 1200); do [ -s "$1" ] && return 0; sleep 0.05; done; log "no $1"; return 1; }
wait_connected() {
    local dir=$1 n=$2 c
    for _ in $(seq 600); do
        c=$("$bin/ferrovs" --run-dir "$dir" show --json 2>/dev/null |
            jq '[.bridges[].ports[] | select(.state == "connected")] | length' 2>/dev/null || echo 0)
        [ "$c" = "$n" ] && return 0
        sleep 0.05
    done
    log "only $c of $n ports connected"; return 1
}

# A config with N ports: vm1, vm2 (ferrovs listens) then g3..gN (ferrovs connects); with
# "all-client", g1..gN.
write_config() {
    local dir=$1 n=$2 mode=${3:-} i sep="" first=3
    [ "$mode" = all-client ] && first=1
    printf '{"version":1,"pmd_cores":[%s],"bridges":[{"name":"br0","ports":[' "$pmd"
    if [ "$mode" != all-client ]; then
        printf '{"name":"vm1","type":"vhost-user","path":"%s/vm1.sock"},' "$dir"
        printf '{"name":"vm2","type":"vhost-user","path":"%s/vm2.sock"}' "$dir"
        sep=,
    fi
    for i in $(seq "$first" "$n"); do
        printf '%s{"name":"g%d","type":"vhost-user-client","path":"%s/g%d.sock"}' "$sep" "$i" "$dir" "$i"
        sep=,
    done
    printf ']}]}\n'
}

# Quiet guests listening on g$2..g$3.
start_idle() {
    local dir=$1 from=$2 n=$3 secs=$4 i
    for i in $(seq "$from" "$n"); do
        gen --socket "$dir/g$i.sock" --server --quiet --duration "$secs" \
            --src "02:00:00:00:01:$(printf %02x "$i")" idle >/dev/null 2>&1 &
    done
}
# Restart runs: receiver on g2, sender on g1, both listening.
start_rx() {
    gen --socket "$1/g2.sock" --server --ring 1024 --src 02:00:00:00:00:02 --quiet \
        --duration "$2" --idle "$2" rxonly >"$1/rx.json" 2>"$1/rx.err" &
}
start_tx() {
    gen --socket "$1/g1.sock" --server --ring 1024 --rate "$rrate" --duration "$2" --quiet \
        txonly >"$1/tx.json" 2>"$1/tx.err" &
}

percentiles() {
    jq -s --arg k "$1" 'map(.[$k]) | sort
        | {p50: .[(length * 0.5 | floor)], p99: .[((length * 0.99 | ceil) - 1)], max: .[-1]}'
}

# One series of upgrades with N ports; prints its JSON.
run_upgrades() {
    local n=$1 d=$work/up$1 secs i drops
    mkdir -p "$d"
    write_config "$d" "$n" >"$d/cfg.json"
    secs=$((upgrades * 4 / 10 + 12))
    start_idle "$d" 3 "$n" $((secs + 10))
    sleep 0.3
    setsid "$bin/ferrovsd" --run-dir "$d" --config "$d/cfg.json" >"$d/ferrovsd.err" 2>&1 &
    wait_sock "$d/vm2.sock"
    gen --socket "$d/vm1.sock" --sink "$d/vm2.sock" --ring 1024 --rate "$rate" \
        --duration "$secs" --quiet txonly >"$d/traffic.json" 2>"$d/traffic.err" &
    wait_connected "$d" "$n"
    sleep 2
    : >"$d/reports.jsonl"
    for i in $(seq "$upgrades"); do
        # Off the PMD core, and no jq starting up beside the handover: the harness must not
        # be what preempts the PMD.
        taskset -c "$gen" "$bin/ferrovs" --run-dir "$d" upgrade --json >"$d/report.json" ||
            { log "upgrade $i failed"; return 1; }
        jq -c . "$d/report.json" >>"$d/reports.jsonl"
        sleep 0.2
    done
    log "N=$n: $upgrades upgrades done; waiting for the traffic to end"
    wait_file "$d/traffic.json"
    drops=$("$bin/ferrovs" --run-dir "$d" port-stats --json | jq '[.[] | .rx.dropped + .tx.dropped] | add')
    jq -n --argjson n "$n" --argjson down "$(percentiles downtime_us <"$d/reports.jsonl")" \
        --argjson freeze "$(percentiles freeze_us <"$d/reports.jsonl")" \
        --argjson prep "$(percentiles prepare_ms <"$d/reports.jsonl")" \
        --argjson t "$(cat "$d/traffic.json")" --argjson drops "$drops" \
        --argjson count "$(wc -l <"$d/reports.jsonl")" '{
          ports: $n, upgrades: $count, downtime_us: $down, freeze_us: $freeze.p50,
          freeze_p99_us: $freeze.p99, prepare_ms: $prep.p50,
          traffic: {rate_pps: ($t.sent / $t.seconds | round), sent: $t.sent,
                    received: $t.received, lost: $t.lost, switch_drops: $drops,
                    max_gap_us: $t.max_gap_us}}'
    stop_all
}

# Plain restarts of ferrovsd with N ports; prints the gaps (us) as a JSON array.
run_restarts() {
    local n=$1 d=$work/rs$1 i p gaps=()
    for i in $(seq "$restarts"); do
        rm -rf "$d"; mkdir -p "$d"
        write_config "$d" "$n" all-client >"$d/cfg.json"
        start_rx "$d" 14
        start_idle "$d" 3 "$n" 14
        start_tx "$d" 8
        sleep 0.3
        setsid "$bin/ferrovsd" --run-dir "$d" --config "$d/cfg.json" >"$d/ferrovsd.err" 2>&1 &
        p=$!
        wait_connected "$d" "$n"
        sleep 2
        kill -TERM "$p"; wait "$p" 2>/dev/null || true
        # Same run dir: the saved configuration comes back, and so do the connections.
        setsid "$bin/ferrovsd" --run-dir "$d" >>"$d/ferrovsd.err" 2>&1 &
        wait_file "$d/tx.json"; wait_file "$d/rx.json"
        gaps+=("$(jq .max_gap_us "$d/rx.json")")
        stop_all
    done
    printf '%s\n' "${gaps[@]}" | jq -s .
}

# Plain restarts of OVS-DPDK's ovs-vswitchd (two dpdkvhostuserclient ports, NORMAL).
run_ovs_restarts() {
    # shellcheck source=/dev/null
    source scripts/peers/ovs-dpdk.sh
    local d=$work/ovs g=$work/ovsg i gaps=()
    for i in $(seq "$restarts"); do
        rm -rf "$d" "$g"; mkdir -p "$d" "$g"
        start_rx "$g" 25
        start_tx "$g" 14
        sleep 0.3
        ovs_dir=$d
        ovs_start "$d" "$pmd" client "$g/g1.sock" "$g/g2.sock" >/dev/null 2>&1
        sleep 5
        ovs_restart_vswitchd "$d" >/dev/null 2>&1
        wait_file "$g/tx.json"; wait_file "$g/rx.json"
        gaps+=("$(jq .max_gap_us "$g/rx.json")")
        ovs_stop; ovs_dir=
        stop_all
    done
    printf '%s\n' "${gaps[@]}" | jq -s .
}

# Two guests, TCP A -> B for 12 s; with $2 = upgrade, `ferrovs upgrade` every second.
run_guests() {
    local d=$work/guests-$1 img=$root/target/guest
    rm -rf "$d"; mkdir -p "$d"
    bash tests/e2e/guest/build-initramfs.sh "$img" >&2
    setsid "$bin/ferrovsd" --run-dir "$d" --pmd-cores "$pmd" >"$d/ferrovsd.err" 2>&1 &
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
            -device "virtio-net-pci,netdev=n0,mac=$mac,vectors=0" >/dev/null 2>&1 &
    done
    for _ in $(seq 1200); do grep -q FERROVS-PEER-UP "$d/a.console" 2>/dev/null && break; sleep 0.1; done
    local n=0
    if [ "$1" = upgrade ]; then
        for _ in $(seq 11); do
            sleep 1
            "$bin/ferrovs" --run-dir "$d" upgrade --json >>"$d/reports.jsonl" && n=$((n + 1))
        done
    fi
    for _ in $(seq 600); do grep -q FERROVS-TOOL-DONE "$d/a.console" 2>/dev/null && break; sleep 0.1; done
    local res; res=$(sed -n 's/.*FERROVS-RESULT //p' "$d/a.console" | head -1)
    local down=null
    [ -s "$d/reports.jsonl" ] && down=$(percentiles downtime_us <"$d/reports.jsonl")
    jq -c --argjson n "$n" --argjson down "$down" '{upgrades: $n, tcp_mbps: .mbps, retransmits, bytes, downtime_us: $down}' <<<"${res:-null}"
    pkill -f "$d" 2>/dev/null || true
    stop_all
}

summary='{runs: ., p50: (sort | .[(length / 2 | floor)]), max: max}'
results=$work/results.jsonl
: >"$results"
for n in $ports; do
    [ "$n" -ge 2 ] || { log "port counts start at 2 (the traffic pair)"; continue; }
    log "N=$n: $upgrades upgrades under $rate pps"
    up=$(run_upgrades "$n")
    log "N=$n: $restarts plain restarts"
    rs=$(run_restarts "$n")
    jq -c --argjson rs "$(jq -c "$summary" <<<"$rs")" '. + {restart_gap_us: $rs}
        | . + {restart_gap_over_upgrade_downtime_p99: ((.restart_gap_us.p50 / .downtime_us.p99) | round)}' \
        <<<"$up" >>"$results"
    log "N=$n: $(tail -1 "$results")"
done
ovs_json=null
if [ "$ovs" = 1 ]; then
    log "OVS-DPDK: $restarts restarts of ovs-vswitchd"
    ovs_json=$(run_ovs_restarts | jq -c "{ports: 2, restart_gap_us: $summary}")
fi
guests_json=null
if [ "$guests" = 1 ]; then
    log "guests: TCP stream without upgrades"
    g0=$(run_guests plain)
    log "guests: TCP stream with an upgrade every second"
    g1=$(run_guests upgrade)
    guests_json=$(jq -n -c --argjson a "$g0" --argjson b "$g1" '{without_upgrades: $a, with_upgrades: $b}')
fi
jq -s --argjson ovs "$ovs_json" --argjson rate "$rate" --argjson rrate "$rrate" \
    --argjson guests "$guests_json" '{
    benchmark: "upgrade", rate_pps: $rate, restart_rate_pps: $rrate, guests_tcp: $guests,
    note: "downtime_us: measured by the daemons (freeze in the old one -> PMDs running in the new one); max_gap_us: longest time between two packets at the receiver over the whole series; restart gaps: the same, for SIGTERM + start",
    ferrovs: ., ovs_dpdk_restart: $ovs}' "$results"
