#!/usr/bin/env bash
# vhost → vhost forwarding benchmark: ferrovs vs DPDK testpmd (io-forwarding, the raw upper
# bound: no switching) vs OVS-DPDK (netdev bridge, NORMAL), interleaved in one run, with two
# traffic sources (frontends):
#   testpmd  (the default, the headline figures) DPDK testpmd with two net_virtio_user ports on
#            one core, --forward-mode=mac, queue_size=1024, `start tx_first 32`: the frontend
#            the DPDK and OVS communities benchmark with, written by none of us. Its rate is
#            the sum of both ports' Rx-pps over the measured interval (testpmd's own
#            `show port stats all`), i.e. everything the backend forwarded, both directions.
#            One testpmd process per round, ring layout and frame size serves every backend
#            of that round in turn (it attaches its ports to one, measures, detaches them, and
#            attaches to the next), so the backends of a round meet the same frontend memory;
#            the JSON's ratio_to_testpmd_per_round compares them on it, and
#            ratio_to_testpmd_median_of_rounds is the median of those. The backends take
#            turns in an order that rotates from round to round.
#   gen      ferrovs-gen (one process, one core: txonly on port 1 with --sink on port 2, every
#            packet accounted for). Our own generator: it shapes the rings in a way that suits
#            our backend (issue 16), so it is reported beside, never as the headline.
#
# Each backend runs its PMD on the last core; the frontend runs on the other core. Every
# process under test is started with setsid (own session) so autogroup scheduling treats
# them alike. Prints JSON: per frontend, frame size and backend the median Mpps over the
# rounds, the ratio to testpmd's backend, and PMD cycles per packet: busy cycles per packet
# (ferrovs: pmd-stats; OVS: pmd-stats-show) and all cycles of the PMD core per packet
# (ferrovs: busy + idle; testpmd: --record-core-cycles).
#
# --rings "split packed" measures packed virtqueues (VIRTIO_F_RING_PACKED) too (default: split
# only). On packed rings the testpmd frontend's ports get packed_vq=1 and ferrovs-gen runs with
# --packed; ferrovs (and ferrovs-base) offer them (`ferrovs config set vhost-packed-rings
# true`), testpmd's net_vhost and OVS-DPDK's dpdkvhostuser ports offer them by default (DPDK's
# vhost library). Every result carries the ring layout the backend really negotiated on both
# ports (ferrovs: `ferrovs show` lists ring_packed; testpmd and OVS: bit 34 of the
# "negotiated Virtio features" DPDK's vhost library logs): a packed run that negotiated
# anything else stops the benchmark with an error instead of reporting a split-ring figure as
# packed. In the JSON, each (frontend, ring) pair is one entry of "frontends" with its ring
# layout, its ratios to testpmd's backend on the same rings, and on packed rings the ratio of
# each backend's packed to its split figure (ratio_to_split) when both were measured.
#
# This host is a VM whose hypervisor moves its two vCPUs and changes their memory's cost
# under us: the same build of a switch takes 154 or 330-420 PMD cycles per packet from one
# run to the next (docs/datapath.md, "One frontend per round"). So every run also carries
# the host's core-to-core round trip just before and after it (host_rtt_ns, from
# bench/tools/core-pingpong.c, both cores idle), and the JSON gives, beside the medians,
# each backend's best run and the ratio of the bests (ratio_to_testpmd_best: what each
# reaches when the host does not get in the way), and medians over the runs whose round
# trips were both within 1.3x the shortest of the benchmark (fast_host). With the testpmd
# frontend each result has the frontend's own cycles per packet too
# (frontend_cycles_per_packet, testpmd's record-core-cycles): what a backend costs the
# other side of the rings.
#
# --base REV adds a second ferrovs backend, "ferrovs-base": ferrovsd and ferrovs built at REV
# in their own worktree, interleaved with this tree's build round by round (an A/B test of a
# change; the JSON then carries ratio_to_base).
#
# Every ferrovs result carries the packets dropped on the way: by the testpmd frontend
# (frontend_dropped: its transmit ring full) and by the switch (switch_dropped: port drops,
# a full guest receive ring mostly). The testpmd frontend is a closed loop of the 2 x 1024
# packets `tx_first 32` puts in; a drop leaves one fewer circulating, so these say whether a
# slow run lost its packets or only moved them slowly. FERROVS_BENCH_KEEP=1 keeps the work
# directory (every process's log) for a look afterwards.
#
# Two options change the testpmd frontend from DPDK's defaults, to measure how much of a
# result is the frontend's (docs/datapath.md, "The frontend's transmit cleanup"); the JSON
# names them in frontend_options and in each source, and the headline uses neither:
#   --frontend-txfreet N   the virtio PMD's tx_free_thresh (testpmd --txfreet). DPDK's default
#                          (32 on a 1024 ring) frees transmitted mbufs only once more than
#                          992 are done, then all of them at once; 992 frees them as they come.
#   --frontend-hugepages   the frontend's memory in 2 MiB huge pages instead of --no-huge 4 KiB
#                          pages (DPDK's usual setup; reserves the pages it needs).
#
#   bench/vhost-fwd.sh [--rounds N] [--seconds S] [--sizes "64 1518"] [--peers "testpmd ovs"]
#                      [--frontend "testpmd gen"] [--rings "split packed"] [--base REV]
#                      [--frontend-txfreet N] [--frontend-hugepages]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=3 secs=5 sizes="64 1518" peers="testpmd ovs" frontends="testpmd gen" rings=split base_rev=
fe_txfreet= fe_huge=false
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --seconds) secs=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --peers) peers=$2; shift 2 ;;
        --frontend) frontends=$2; shift 2 ;;
        --base) base_rev=$2; shift 2 ;;
        --rings) rings=$2; shift 2 ;;
        --frontend-txfreet) fe_txfreet=$2; shift 2 ;;
        --frontend-hugepages) fe_huge=true; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
for ring in $rings; do
    case $ring in split|packed) ;; *) echo "--rings: split or packed, not $ring" >&2; exit 2 ;; esac
done
if [ -n "$fe_txfreet" ] && ! [[ $fe_txfreet =~ ^[0-9]+$ ]]; then
    echo "--frontend-txfreet: a number, not $fe_txfreet" >&2; exit 2
fi
bash scripts/deps.sh >/dev/null
# OVS-DPDK takes 1 GiB of huge pages (scripts/peers/ovs-dpdk.sh); a frontend in huge pages
# takes 512 MiB more.
$fe_huge && bash scripts/deps.sh --hugepages 900 >/dev/null
cargo build --release --quiet
bin=$root/target/release
# The A/B baseline: this repository at REV, built once per revision in its own worktree.
if [ -n "$base_rev" ]; then
    sha=$(git rev-parse --short "$base_rev")
    base_dir=/tmp/ferrovs-bench-base-$sha
    if [ ! -x "$base_dir/target/release/ferrovsd" ]; then
        echo "bench: building $sha (the baseline) in $base_dir" >&2
        rm -rf "$base_dir"; git worktree prune
        git worktree add --detach "$base_dir" "$sha" >/dev/null
        (cd "$base_dir" && cargo build --release --quiet -p ferrovsd -p ferrovs)
    fi
    peers="base $peers"
fi
ncpu=$(nproc)
pmd=$((ncpu - 1)); gen=0; [ "$ncpu" -gt 1 ] && gen=$((ncpu - 2))
work=$(mktemp -d /tmp/ferrovs-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; [ -n "${ovs_dir:-}" ] && ovs_stop; [ -n "${FERROVS_BENCH_KEEP:-}" ] || rm -rf "$work"; }
trap cleanup EXIT INT TERM
# shellcheck source=bench/lib.sh
source bench/lib.sh

# The ring layout a DPDK vhost backend (testpmd's net_vhost, OVS-DPDK) negotiated on the
# sockets $2...: the last "negotiated Virtio features" line its vhost library logged for each
# (in log file $1), bit 34 (VIRTIO_F_RING_PACKED). Prints split, packed, mixed or unknown.
dpdk_rings() {
    local logf=$1 sock f seen=
    shift
    for sock in "$@"; do
        f=$(grep -a "/$(basename "$sock")) negotiated Virtio features: 0x" "$logf" | tail -1 | sed 's/.*features: \(0x[0-9a-fA-F]*\).*/\1/')
        [ -n "$f" ] || { echo unknown; return; }
        if (( (f >> 34) & 1 )); then seen="$seen packed"; else seen="$seen split"; fi
    done
    rings_of $seen
}

# The ring layout of ferrovs's ports vm1 and vm2 ($2: the ferrovs CLI, $1 its run directory)
# while a frontend is attached: ring_packed among a port's negotiated features, or not.
# Prints split, packed, mixed, or unknown while a port has no frontend.
ferrovs_rings() {
    local d=$1 cli=$2 show
    show=$("$cli" --run-dir "$d" show --json 2>/dev/null) || { echo unknown; return; }
    # shellcheck disable=SC2046
    rings_of $(jq -r '[.bridges[].ports[] | select(.name == "vm1" or .name == "vm2")]
        | if length < 2 or any(.[]; (.features // []) | length == 0) then "unknown"
          else .[] | if any(.features[]; . == "ring_packed") then "packed" else "split" end end' <<<"$show")
}

rings_of() {
    local r out=
    for r in "$@"; do
        case $r in unknown) echo unknown; return ;; esac
        if [ -z "$out" ]; then out=$r; elif [ "$out" != "$r" ]; then out=mixed; fi
    done
    echo "${out:-unknown}"
}

# Stops the benchmark when the backend $1 negotiated ring layout $2 where $ring was asked for.
check_ring() {
    local who=$1 got=$2
    [ "$got" = "$ring" ] && return 0
    # A split run whose backend does not say (an older DPDK log format) is still split: only
    # the frontends' packed_vq=1 / --packed can make it packed.
    [ "$ring" = split ] && [ "$got" = unknown ] && return 0
    log "FAIL: $who negotiated '$got' rings where '$ring' was asked for (frontend $frontend): not reporting it"
    exit 1
}

# Runs ferrovs-gen through the backend whose sockets are $1 and $2; prints its JSON. Always
# this tree's generator: a --base build has only ferrovsd and ferrovs.
gen_run() {
    local a=$1 b=$2 size=$3 extra=${4:-}
    [ "$ring" = packed ] && extra="$extra --packed"
    # shellcheck disable=SC2086
    setsid taskset -c "$gen" "$root/target/release/ferrovs-gen" --socket "$a" --sink "$b" --size "$size" \
        --duration "$secs" --quiet --ring 1024 $extra txonly
}

# testpmd as the frontend: one dpdk-testpmd process per round, ring layout and frame size,
# serving every backend of that round in turn. For each backend it attaches two
# net_virtio_user ports (clients of the backend's sockets $1 and $2), mac-forwards them into
# each other on the traffic core with 32 bursts started per port, measures, and detaches
# them again. Its memory (the mbuf pool above all, which the backend copies every packet
# into and out of) is placed once, when the process starts, so every backend of a round
# meets the same placement: on this host a frontend process draws a fast or a slow state
# with its memory (2026-11-29: one ferrovsd, consecutive frontends 5.6, 16.3 and 10.6 Mpps),
# which with a frontend per run moved single ratios by up to 2x. Per-round ratios compare
# backends on one frontend.
#
# Each port's own address is the other's peer address (testpmd's default peers
# 02:00:00:00:00:0N; attached ports take ids 0 and 1 again), so after the first packets
# both switches have learned both and forward known unicast, as between two VMs: with random
# port addresses every packet went to an unknown destination and was flooded, which costs OVS
# a write to its bridge's internal (TAP) port whenever that is up (measured 2026-11-28: 0.6
# Mpps flooding, 337 instead of ~7 000 cycles per packet with learned addresses).
fe_fd= fe_pid= fe_dir=
fe_mem=(--no-huge -m 1024) fe_opts=()
$fe_huge && fe_mem=(-m 512)
[ -n "$fe_txfreet" ] && fe_opts+=("--txfreet=$fe_txfreet")
fe_start() {
    fe_dir=$work/fe-$round-$ring-$size
    rm -rf "$fe_dir"; mkdir -p "$fe_dir"; mkfifo "$fe_dir/in"
    # Line-buffered: its output must be in the log when its next prompt is (the prompt and
    # the echoed command are written directly, the rest through stdio).
    setsid stdbuf -oL dpdk-testpmd -l "$gen,$pmd" --main-lcore "$pmd" --no-pci "${fe_mem[@]}" \
        --single-file-segments --file-prefix "fbfe$$" -- -i --forward-mode=mac \
        --nb-cores=1 --rxd=1024 --txd=1024 --txpkts="$size" --total-num-mbufs=32768 "${fe_opts[@]}" \
        <"$fe_dir/in" >"$fe_dir/log" 2>&1 &
    fe_pid=$!; pids+=("$fe_pid")
    exec {fe_fd}>"$fe_dir/in"
    fe_cmd "show config fwd" || { log "testpmd frontend did not start: $(tail -3 "$fe_dir/log" | tr '\n' ' ')"; return 1; }
    # The frontend's own cycles per packet too (its forwarding core, busy and idle: `stop`
    # prints them): what a backend costs the other side of the rings.
    fe_cmd "set record-core-cycles on"
}
fe_quit() {
    [ -n "$fe_pid" ] || return 0
    echo quit >&"$fe_fd" 2>/dev/null || true
    exec {fe_fd}>&-
    for _ in $(seq 50); do kill -0 "$fe_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$fe_pid" 2>/dev/null || true; wait "$fe_pid" 2>/dev/null || true
    pkill -9 -f "fbfe$$" 2>/dev/null || true
    fe_pid=
}
# Sends one command to the frontend and waits (up to $2 s, default 20) for its next prompt.
# The output since the command is left in $fe_out.
fe_cmd() {
    local cmd=$1 limit=${2:-20} off i
    off=$(stat -c %s "$fe_dir/log")
    echo "$cmd" >&"$fe_fd" || return 1
    for ((i = 0; i < limit * 20; i++)); do
        fe_out=$(tail -c +"$((off + 1))" "$fe_dir/log")
        case $fe_out in *"testpmd> "*) return 0 ;; esac
        kill -0 "$fe_pid" 2>/dev/null || { log "testpmd frontend exited at '$cmd'"; return 1; }
        sleep 0.05
    done
    log "testpmd frontend: no answer to '$cmd' in ${limit}s"
    return 1
}
# Measures through the backend at sockets $1 and $2 (size and ring: the frontend's). The
# backend's hooks run right after the measured interval starts (fe_hook_start) and ends
# (fe_hook_end): the PMD's counters are taken over the same interval. Prints {mpps,
# frontend_dropped}.
fe_hook_attached() { :; }
fe_hook_start() { :; }
fe_hook_end() { :; }
testpmd_fe_run() {
    local a=$1 b=$2 vq= dev
    [ "$ring" = packed ] && vq=,packed_vq=1
    local fail='{"mpps": 0, "frontend_dropped": null}'
    fe_cmd "port attach net_virtio_user0,path=$a,queues=1,queue_size=1024,mac=02:00:00:00:00:01$vq" &&
        fe_cmd "port attach net_virtio_user1,path=$b,queues=1,queue_size=1024,mac=02:00:00:00:00:00$vq" &&
        fe_cmd "port start all" 30 || { echo "$fail"; return; }
    if ! grep -aq "Port 1: 02:00:00:00:00:00" <<<"$fe_out"; then
        log "testpmd frontend: ports did not start: $(grep -a -i 'error\|fail' <<<"$fe_out" | head -3 | tr '\n' ' ')"
        echo "$fail"; return
    fi
    fe_hook_attached
    sleep 0.5
    fe_cmd "start tx_first 32"; sleep 1
    # The first `show` starts the interval (after a re-attach it also resets testpmd's
    # throughput baseline for the reused port ids); the second gives Rx-pps over it.
    fe_cmd "show port stats all"; fe_hook_start
    sleep "$secs"
    fe_cmd "show port stats all"; fe_hook_end
    local pps; pps=$(grep -a "Rx-pps:" <<<"$fe_out" | awk '{s += $2} END {print s + 0}')
    fe_cmd "stop" 30
    # Packets the frontend itself dropped (`stop`'s accumulated forward statistics, since
    # `start`: a transmit ring still full when testpmd forwarded into it). In this closed
    # loop every drop, the backend's or the frontend's, leaves one packet fewer circulating.
    local fdrop; fdrop=$(grep -a -A3 "Accumulated forward statistics" <<<"$fe_out" | sed -n 's/.*TX-dropped: *\([0-9]*\).*/\1/p' | tail -1)
    local fcpp; fcpp=$(sed -n 's/.*CPU cycles\/packet=\([0-9.]*\).*/\1/p' <<<"$fe_out" | tail -1)
    fe_cmd "port stop all" 30; fe_cmd "port close all" 30
    for dev in net_virtio_user0 net_virtio_user1; do fe_cmd "device detach $dev" 30; done
    [ "$pps" -gt 0 ] || log "testpmd frontend forwarded nothing through $a"
    jq -n -c --argjson pps "$pps" --argjson fdrop "${fdrop:-null}" --argjson fcpp "${fcpp:-null}" \
        '{mpps: ($pps / 1e6 * 1000 | round / 1000), frontend_dropped: $fdrop, frontend_cycles_per_packet: $fcpp}'
}

# Runs the frontend $frontend through the backend whose sockets are $1 and $2; prints JSON.
fe_run() {
    case $frontend in
        gen) gen_run "$@" ;;
        testpmd) testpmd_fe_run "$1" "$2" ;;
    esac
}


run_ferrovs() {
    local size=$1 bin=${2:-$bin} d=$work/ferrovs
    rm -rf "$d"; mkdir -p "$d"
    setsid "$bin/ferrovsd" --run-dir "$d" --pmd-cores "$pmd" >"$d/log" 2>&1 &
    local p=$!; pids+=("$p")
    wait_sock "$d/vm2.sock"
    # Packed rings are offered only when asked (to frontends that connect from then on).
    [ "$ring" = packed ] && "$bin/ferrovs" --run-dir "$d" config set vhost-packed-rings true >/dev/null
    # Warm up (MAC learning), then measure with clean PMD counters.
    [ "$frontend" = gen ] && { gen_run "$d/vm1.sock" "$d/vm2.sock" "$size" >/dev/null 2>&1 || true; }
    "$bin/ferrovs" --run-dir "$d" pmd-stats-clear
    local got=unknown r st
    if [ "$frontend" = testpmd ]; then
        # The ring layout once the frontend's ports are up; the PMD's counters over the
        # frontend's measured interval (over the whole run they also counted the idle
        # seconds before the traffic, which showed a saturated PMD as one taking a few
        # packets per iteration).
        fe_hook_attached() { ferrovs_rings "$d" "$bin/ferrovs" >"$d/ring"; }
        fe_hook_start() { "$bin/ferrovs" --run-dir "$d" pmd-stats-clear >/dev/null; }
        fe_hook_end() { "$bin/ferrovs" --run-dir "$d" pmd-stats --json >"$d/pmd.json"; }
        r=$(fe_run "$d/vm1.sock" "$d/vm2.sock" "$size")
        got=$(cat "$d/ring" 2>/dev/null || echo unknown)
    else
        # ferrovs-gen runs in the background while `show` is asked which rings its ports
        # took (both attach within a second or two; at most 8 s of asking, so that a build
        # whose `show` lists no features is not polled for the whole measurement).
        fe_run "$d/vm1.sock" "$d/vm2.sock" "$size" >"$d/fe.json" &
        local fp=$! tries=0
        while kill -0 "$fp" 2>/dev/null && [ $((tries += 1)) -le 40 ]; do
            got=$(ferrovs_rings "$d" "$bin/ferrovs")
            [ "$got" = unknown ] || break
            sleep 0.2
        done
        wait "$fp" || true
        r=$(cat "$d/fe.json")
    fi
    if [ -s "$d/pmd.json" ]; then
        st=$(cat "$d/pmd.json")
    else
        st=$("$bin/ferrovs" --run-dir "$d" pmd-stats --json)
    fi
    local cpp; cpp=$(jq '.[0].cycles_per_packet' <<<"$st")
    # Busy + idle cycles per packet: the figure testpmd's --record-core-cycles reports.
    local tpp; tpp=$(jq '.[0] | if .rx_packets > 0 then ((.busy_cycles + .idle_cycles) / .rx_packets * 10 | round / 10) else null end' <<<"$st")
    # Packets per PMD iteration (the burst fill): a PMD faster than its frontend polls
    # more often for fewer packets each time.
    local ppi; ppi=$(jq '.[0] | if .iterations > 0 then (.rx_packets / .iterations * 10 | round / 10) else null end' <<<"$st")
    # How often the PMD slept in the interval (adaptive mode: after an idle spell it waits
    # for a guest's kick) and the share of the interval it spent asleep.
    local slp; slp=$(jq -c '.[0] | (.busy_cycles + .idle_cycles + .sleep_cycles) as $all | {sleeps, asleep_pct: (if $all > 0 then (.sleep_cycles / $all * 1000 | round / 10) else null end)}' <<<"$st")
    # Packets the switch dropped on its ports (a full guest receive ring, mostly).
    local sdrop; sdrop=$("$bin/ferrovs" --run-dir "$d" port-stats --json 2>/dev/null | jq '[.[] | .rx.dropped + .tx.dropped] | add' 2>/dev/null || true)
    kill "$p"; wait "$p" 2>/dev/null || true
    jq -c --argjson cpp "$cpp" --argjson tpp "$tpp" --argjson ppi "$ppi" --argjson slp "$slp" --argjson sdrop "${sdrop:-null}" --arg ring "$got" '{mpps, lost, frontend_dropped, frontend_cycles_per_packet, switch_dropped: $sdrop, cycles_per_packet: $cpp, total_cycles_per_packet: $tpp, packets_per_iteration: $ppi, pmd_sleeps: $slp.sleeps, pmd_asleep_pct: $slp.asleep_pct, ring: $ring}' <<<"$r"
}

run_testpmd() {
    local size=$1 d=$work/testpmd
    rm -rf "$d"; mkdir -p "$d"
    setsid dpdk-testpmd -l "$gen,$pmd" --main-lcore "$gen" --no-pci --no-huge -m 1024 \
        --file-prefix "fbench$$" --vdev "net_vhost0,iface=$d/a.sock,queues=1" \
        --vdev "net_vhost1,iface=$d/b.sock,queues=1" --log-level=lib.vhost.config:info \
        -- --forward-mode=io --nb-cores=1 \
        --total-num-mbufs=32768 --stats-period 1 --auto-start --record-core-cycles >"$d/log" 2>&1 &
    local p=$!; pids+=("$p")
    wait_sock "$d/b.sock"
    local r; r=$(fe_run "$d/a.sock" "$d/b.sock" "$size")
    kill -INT "$p"; wait "$p" 2>/dev/null || true
    pgrep -f "fbench$$" >/dev/null && { sleep 1; pkill -9 -f "fbench$$" || true; }
    # testpmd's own figure: all cycles of the forwarding core (busy and idle) per packet.
    local tpp; tpp=$(sed -n 's/.*CPU cycles\/packet=\([0-9.]*\).*/\1/p' "$d/log" | tail -1)
    local got; got=$(dpdk_rings "$d/log" "$d/a.sock" "$d/b.sock")
    jq -c --argjson tpp "${tpp:-null}" --arg ring "$got" '{mpps, lost, frontend_dropped, frontend_cycles_per_packet, total_cycles_per_packet: $tpp, ring: $ring}' <<<"$r"
}

ovs_available() { [ -f scripts/peers/ovs-dpdk.sh ]; }
run_ovs() {
    local size=$1
    # shellcheck source=/dev/null
    source scripts/peers/ovs-dpdk.sh
    ovs_dir=$work/ovs
    ovs_start "$ovs_dir" "$pmd" >/dev/null 2>&1
    local a b; a=$(ovs_port_path "$ovs_dir" 1); b=$(ovs_port_path "$ovs_dir" 2)
    wait_sock "$a"; wait_sock "$b"
    [ "$frontend" = gen ] && { gen_run "$a" "$b" "$size" >/dev/null 2>&1 || true; }
    ovs_pmd_clear "$ovs_dir"
    # With testpmd's frontend, the PMD's counters over its measured interval (as ferrovs's).
    fe_hook_start() { ovs_pmd_clear "$ovs_dir"; }
    fe_hook_end() { ovs_cycles_per_packet "$ovs_dir" >"$ovs_dir/cpp"; ovs_total_cycles_per_packet "$ovs_dir" >"$ovs_dir/tpp"; }
    local r; r=$(fe_run "$a" "$b" "$size")
    local cpp tpp
    if [ -s "$ovs_dir/cpp" ]; then
        cpp=$(cat "$ovs_dir/cpp"); tpp=$(cat "$ovs_dir/tpp")
    else
        cpp=$(ovs_cycles_per_packet "$ovs_dir"); tpp=$(ovs_total_cycles_per_packet "$ovs_dir")
    fi
    # OVS logs DPDK's vhost library messages in its own log (module dpdk, INFO).
    local got; got=$(dpdk_rings "$ovs_dir/ovs-vswitchd.log" "$a" "$b")
    ovs_stop; ovs_dir=
    jq -c --argjson cpp "${cpp:-null}" --argjson tpp "${tpp:-null}" --arg ring "$got" '{mpps, lost, frontend_dropped, frontend_cycles_per_packet, cycles_per_packet: $cpp, total_cycles_per_packet: $tpp, ring: $ring}' <<<"$r"
}

# The host's core-to-core round trip (bench/lib.sh) is taken right before a backend starts
# and right after it stopped, with both cores idle.
pingpong_bin >/dev/null
# Its arguments after the first, rotated left by the first.
rotate() { local k=$1; shift; local a=("$@"); k=$((k % ${#a[@]})); echo "${a[@]:k}" "${a[@]:0:k}"; }

results=$work/results.jsonl
: >"$results"
for round in $(seq "$rounds"); do
    for frontend in $frontends; do
        for ring in $rings; do
            for size in $sizes; do
                [ "$frontend" = testpmd ] && { fe_start || exit 1; }
                # The backends take turns in a rotating order (round 2 starts with the
                # second), so that none is always the first on a fresh frontend.
                # shellcheck disable=SC2086
                for who in $(rotate $((round - 1)) ferrovs $peers); do
                    if [ "$frontend" = testpmd ] && ! kill -0 "$fe_pid" 2>/dev/null; then
                        log "testpmd frontend gone: starting another for the rest of round $round"
                        fe_quit; fe_start || exit 1
                    fi
                    rtt_before=$(host_rtt "$gen" "$pmd")
                    case $who in
                        ferrovs) r=$(run_ferrovs "$size") ;;
                        base) r=$(run_ferrovs "$size" "$base_dir/target/release"); who=ferrovs-base ;;
                        testpmd) r=$(run_testpmd "$size") ;;
                        ovs) ovs_available || { log "scripts/peers/ovs-dpdk.sh missing: skipping OVS"; continue; }
                             r=$(run_ovs "$size") ;;
                    esac
                    r=$(jq -c --argjson a "$rtt_before" --argjson b "$(host_rtt "$gen" "$pmd")" '. + {host_rtt_ns: [$a, $b]}' <<<"$r")
                    log "round $round frontend $frontend ring $ring size $size $who: $r"
                    check_ring "$who" "$(jq -r '.ring' <<<"$r")"
                    jq -c --arg who "$who" --arg fe "$frontend" --arg ring "$ring" --argjson size "$size" --argjson round "$round" \
                        '. + {who: $who, frontend: $fe, ring: $ring, size: $size, round: $round}' <<<"$r" >>"$results"
                done
                [ "$frontend" = testpmd ] && fe_quit
            done
        done
    done
done

jq -s --argjson rounds "$rounds" --argjson secs "$secs" --arg base "${base_rev:+$(git rev-parse --short "$base_rev")}" \
    --arg txfreet "$fe_txfreet" --argjson huge "$fe_huge" '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def ratio($a; $b): if $a and $b then (($a / $b) * 1000 | round / 1000) else null end;
  def medians($rows): $rows | map(.mpps) | median;
  # Each backend of $by against testpmd, by the figure f (.mpps, .best).
  def to_testpmd($by; f): $by | to_entries | map({key: .key, value: ratio(.value | f; $by.testpmd | f)}) | from_entries;
  . as $all
  # The fast host state: runs whose round trips before and after were both within 1.3x the
  # shortest of the whole benchmark (both vCPUs close together the whole time, as far as
  # two samples can say).
  | ([.[] | .host_rtt_ns // [] | .[] | values] | min) as $rtt_min
  | (if $rtt_min then $rtt_min * 1.3 * 10 | round / 10 else null end) as $rtt_fast
  | def fast: $rtt_fast != null and ((.host_rtt_ns // []) | length == 2 and all(.[]; . != null and . <= $rtt_fast));
  group_by([.frontend, ((.ring // "split") != "split")]) | map(
    (.[0].frontend) as $fe | (.[0].ring // "split") as $ring
    | {frontend: $fe, ring: $ring,
       source: ((if $fe == "testpmd" then "DPDK testpmd, two net_virtio_user ports, --forward-mode=mac, start tx_first 32 (one core)" else "ferrovs-gen txonly --sink (one core)" end)
                + (if $ring == "packed" then (if $fe == "testpmd" then ", packed_vq=1" else ", --packed" end) else "" end)
                + (if $fe == "testpmd" and $txfreet != "" then ", --txfreet=\($txfreet)" else "" end)
                + (if $fe == "testpmd" and $huge then ", 2 MiB huge pages" else "" end)),
       sizes: (group_by(.size) | map(
         (.[0].size) as $size
         | (group_by(.who) | map({key: .[0].who, value: {
               mpps: (map(.mpps) | median),
               cycles_per_packet: (map(.cycles_per_packet // empty) | median),
               total_cycles_per_packet: (map(.total_cycles_per_packet // empty) | median),
               packets_per_iteration: (map(.packets_per_iteration // empty) | median),
               lost: (map(.lost // empty) | add),
               frontend_dropped: (map(.frontend_dropped // empty) | median),
               frontend_cycles_per_packet: (map(.frontend_cycles_per_packet // empty) | median),
               switch_dropped: (map(.switch_dropped // empty) | median),
               ring: (map(.ring) | unique | if length == 1 then .[0] else join(",") end),
               best: (map(.mpps) | max),
               runs: map(.mpps)}}) | from_entries) as $by
         | (map(select(.who == "testpmd")) | map({key: (.round | tostring), value: .mpps}) | from_entries) as $tp
         | (group_by(.who) | map({key: .[0].who, value: (sort_by(.round) | map(ratio(.mpps; $tp[.round | tostring])))}) | from_entries) as $per_round
         | (map(select(fast)) | group_by(.who) | map({key: .[0].who, value: {mpps: (map(.mpps) | median), cycles_per_packet: (map(.cycles_per_packet // empty) | median), runs: map(.mpps)}}) | from_entries) as $fast
         | {size: $size, results: $by,
            fast_host: {results: $fast,
                        ratio_to_testpmd: to_testpmd($fast; .mpps)},
            ratio_to_testpmd: to_testpmd($by; .mpps),
            ratio_to_testpmd_best: to_testpmd($by; .best)}
           + (if $fe == "testpmd" and $by.testpmd then {ratio_to_testpmd_per_round: $per_round,
                  ratio_to_testpmd_median_of_rounds: ($per_round | map_values(map(values) | median))} else {} end)
           + (if $by["ferrovs-base"] then {ratio_to_base: {median: ratio($by.ferrovs.mpps; $by["ferrovs-base"].mpps),
                  per_round: [range(0; [($by.ferrovs.runs | length), ($by["ferrovs-base"].runs | length)] | min) as $i
                               | ratio($by.ferrovs.runs[$i]; $by["ferrovs-base"].runs[$i])]}} else {} end)
           + (if $ring == "packed" then
                ($all | map(select(.frontend == $fe and (.ring // "split") == "split" and .size == $size))) as $split
                | if ($split | length) > 0 then {ratio_to_split: ($by | to_entries | map(
                      .key as $who | {key: $who, value: ratio(.value.mpps; medians($split | map(select(.who == $who))))}) | from_entries)}
                  else {} end
              else {} end)))})
  | {benchmark: "vhost-fwd", rounds: $rounds, seconds: $secs,
     frontend_options: {txfreet: (if $txfreet == "" then null else ($txfreet | tonumber) end), hugepages: $huge},
     host_rtt_ns: {min: $rtt_min, fast_below: $rtt_fast, median: ([$all[] | .host_rtt_ns // [] | .[] | values] | median),
                   max: ([$all[] | .host_rtt_ns // [] | .[] | values] | max)}, base: (if $base == "" then null else $base end), frontends: .}
' "$results"
