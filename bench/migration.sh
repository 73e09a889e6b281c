#!/usr/bin/env bash
# Live migration of a QEMU guest on ferrovs ports: total time and downtime, precopy against
# postcopy, the guest idle and under heavy receive traffic.
#
# Per round, mode (--modes: precopy, postcopy) and load (--loads: idle, heavy), a fresh
# ferrovsd (default config plus vhost-user server ports vma and vmb, PMD on the last core)
# and a fresh guest (TCG, the test image of tests/e2e/guest: -smp 1, 256 MiB of memfd shared
# RAM, virtio-net-pci with one queue pair and vectors=0, no IPv6; it pings a peer that does
# not exist once, so that the switch learns its MAC on vma, then sleeps) on vma.
#   heavy  ferrovs-gen on port vm1 (a vhost-user frontend, on core 0), txonly at full rate
#          (--rate 0) with --dst the guest's MAC and --size --gen-size: every frame is written
#          by the switch into the guest's receive buffers, as fast as the guest gives it
#          buffers, and the guest's kernel takes each one in (the frames are for another IP
#          address: it drops them after the IP layer). That dirties guest memory as fast as
#          this guest and switch can. Started --ramp seconds before the migration, running
#          through it.
#   idle   no traffic.
# Then the destination QEMU (the same command line on vmb, -incoming unix:...) and the
# migration, driven through QMP by target/release/ferrovs-e2e-migrate (tests/e2e): the
# capability postcopy-ram on both sides (true for postcopy, false for precopy), max-bandwidth
# (and max-postcopy-bandwidth, the same: QEMU's postcopy phase is unlimited otherwise) and
# downtime-limit (--downtime-limit ms) set explicitly on the source, `migrate`; each
# combination runs once per bandwidth of --max-bandwidth (MiB/s, a list: 128 is QEMU 7.2's
# default, 8 a throttled link on which RAM takes ~10 s to copy); for postcopy
# `migrate-start-postcopy` at once (QEMU switches over at its next iteration, with nearly
# every page still on the source). A precopy migration not completed after --timeout seconds
# is cancelled and reported as not converged (postcopy always ends). After it: the source quits,
# the switch's counters (pages it logged for the source, postcopy pages it found missing and
# fetched at the destination, drops by reason) and whether the guest's MAC is on vmb (its
# announce).
#
# Figures, from QEMU's query-migrate on the source: total-time, downtime, setup-time, ram
# transferred, dirty-sync-count, the highest dirty-pages-rate it reported; and stop_to_resume_ms: the source's STOP event to the
# destination's RESUME event (both stamped with this host's clock), the downtime as the guest
# lives it, measured the same way in both modes (QEMU 7.2's own downtime figure for postcopy
# is not reliable). Prints one JSON document (progress on stderr): every run, per mode and
# load the medians and how many runs converged; saves it as bench/results-migration-DATE.json.
# Every process under test is started with setsid and stopped by pid.
#
#   bench/migration.sh [--rounds 3] [--modes "precopy postcopy"] [--loads "idle heavy"]
#                      [--max-bandwidth "128 8"] [--downtime-limit 300] [--timeout 60]
#                      [--gen-size 1518] [--ramp 3] [--keep]
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
root=$PWD
rounds=3 modes="precopy postcopy" loads="idle heavy" bws="128 8" dl_ms=300 timeout=60
gsize=1518 ramp=3 keep=0
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --modes) modes=$2; shift 2 ;;
        --loads) loads=$2; shift 2 ;;
        --max-bandwidth) bws=$2; shift 2 ;;
        --downtime-limit) dl_ms=$2; shift 2 ;;
        --timeout) timeout=$2; shift 2 ;;
        --gen-size) gsize=$2; shift 2 ;;
        --ramp) ramp=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
bash scripts/deps.sh >/dev/null
cargo build --release --quiet --workspace
bin=$root/target/release
img=$root/target/guest
bash tests/e2e/guest/build-initramfs.sh "$img" >&2
ncpu=$(nproc)
pmd=$((ncpu - 1)); gen=0; [ "$ncpu" -gt 1 ] && gen=$((ncpu - 2))
work=$(mktemp -d /tmp/ferrovs-migration-bench.XXXXXX)
mac=52:54:00:00:00:0a

# shellcheck source=bench/lib.sh
source bench/lib.sh
cleanup() {
    stop_all
    if [ "$keep" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fv() { "$bin/ferrovs" --run-dir "$@"; }
# mac_watch DIR OUT: writes the time (seconds since the epoch) when the switch in DIR first has
# the guest's MAC on vmb; polls every 20 ms for up to 150 s.
mac_watch() {
    local end=$((SECONDS + 150))
    while [ "$SECONDS" -lt "$end" ]; do
        if fv "$1" mac-table br0 | grep -q "^ *vmb .*$mac"; then echo "$EPOCHREALTIME" >"$2"; return 0; fi
        sleep 0.02
    done
}

# qemu NAME DIR PORT [EXTRA...]: the guest on ferrovs port PORT, QMP at DIR/NAME.qmp.
qemu() {
    local name=$1 d=$2 port=$3; shift 3
    setsid qemu-system-x86_64 -accel tcg -m 256 -smp 1 -nographic -no-reboot -nodefaults \
        -serial "file:$d/$name.console" -kernel "$img/vmlinuz" -initrd "$img/initramfs.gz" \
        -append "console=ttyS0 quiet ipv6.disable=1 ferrovs.ip=10.0.0.1/24 ferrovs.cmd=tool \
                 ferrovs.peer=10.0.0.2 ferrovs.wait=1 ferrovs.args=sleep,1000000" \
        -object memory-backend-memfd,id=mem,size=256M,share=on -numa node,memdev=mem \
        -chardev "socket,id=c0,path=$d/$port.sock,reconnect=1" \
        -netdev vhost-user,id=n0,chardev=c0,queues=1 \
        -device "virtio-net-pci,netdev=n0,mac=$mac,vectors=0" \
        -qmp "unix:$d/$name.qmp,server=on,wait=off" "$@" >"$d/$name.log" 2>&1 &
    track "$!"
}

# One migration: run_one MODE LOAD BANDWIDTH_MIB ROUND; prints one JSON object.
run_one() {
    local mode=$1 load=$2 bw_mib=$3 round=$4 d=$work/$1-$2-$3-$4 g=""
    mkdir -p "$d"
    setsid "$bin/ferrovsd" --run-dir "$d" --pmd-cores "$pmd" >"$d/ferrovsd.log" 2>&1 &
    track "$!"
    wait_sock "$d/vm2.sock"
    for p in vma vmb; do
        fv "$d" add-port br0 "$p" type=vhost-user path="$d/$p.sock"
        wait_sock "$d/$p.sock"
    done
    qemu src "$d" vma
    # (One ARP request of the guest's, for a peer that does not exist: the switch learns its
    # MAC on vma, so that the generator's frames go to the guest and nowhere else.)
    wait_console "$d/src.console" FERROVS-PEER-UP 180
    if [ "$load" = heavy ]; then
        setsid taskset -c "$gen" "$bin/ferrovs-gen" --socket "$d/vm1.sock" --dst "$mac" \
            --size "$gsize" --rate 0 --duration 100000 --quiet txonly >"$d/gen.json" 2>"$d/gen.err" &
        g=$!; track "$g"
    fi
    sleep "$ramp"
    qemu dst "$d" vmb -incoming "unix:$d/mig.sock"
    wait_sock "$d/dst.qmp"
    fv "$d" port-stats --json >"$d/stats0.json"
    fv "$d" mac-table br0 --json >"$d/macs0.json"
    setsid bash -c "$(declare -f fv mac_watch); bin=$bin mac=$mac; mac_watch $d $d/moved" &
    track "$!"
    local pc=()
    [ "$mode" = postcopy ] && pc=(--postcopy)
    "$bin/ferrovs-e2e-migrate" --src "$d/src.qmp" --dst "$d/dst.qmp" --uri "unix:$d/mig.sock" \
        "${pc[@]}" --max-bandwidth $((bw_mib * 1024 * 1024)) --downtime-limit "$dl_ms" \
        --timeout "$timeout" --quit-source >"$d/migration.json" 2>"$d/migration.err" ||
        { log "$d: migration driver failed: $(tail -3 "$d/migration.err")"; echo '{"status": "driver failed"}' >"$d/migration.json"; }
    for _ in $(seq 100); do [ -s "$d/moved" ] && break; sleep 0.1; done
    [ -s "$d/moved" ] || echo null >"$d/moved"
    fv "$d" port-stats --json >"$d/stats1.json"
    fv "$d" mac-table br0 --json >"$d/macs.json"
    local gen_json=null
    if [ -n "$g" ]; then
        kill -TERM "$g" 2>/dev/null || true; wait "$g" 2>/dev/null || true
        gen_json=$(tail -1 "$d/gen.json" 2>/dev/null | jq -c '{mpps, sent}' 2>/dev/null || echo null)
    fi
    stop_all
    jq -c -n --slurpfile m "$d/migration.json" --slurpfile s0 "$d/stats0.json" \
        --slurpfile s1 "$d/stats1.json" --slurpfile macs "$d/macs.json" --slurpfile macs0 "$d/macs0.json" \
        --argjson gen "$gen_json" --argjson moved "$(cat "$d/moved")" \
        --arg mode "$mode" --arg load "$load" --argjson bw "$bw_mib" --argjson round "$round" --arg mac "$mac" '
        def port($s; $n): $s[0][] | select(.port == $n);
        def d($n; $dir; $k): ((port($s1; $n)[$dir][$k] // 0) - (port($s0; $n)[$dir][$k] // 0));
        {mode: $mode, load: $load, max_bandwidth_mib_s: $bw, round: $round} + $m[0] + {
         generator: $gen,
         mac_before: ([$macs0[0][] | select(.mac == $mac) | .port] | first),
         mac_on_destination: ([$macs[0][] | select(.mac == $mac) | .port] | first == "vmb"),
         announce_ms: (if $moved and $m[0].dest_resume_epoch then (($moved - $m[0].dest_resume_epoch) * 1000 | round) else null end),
         switch: {
           dirty_pages_logged_source: (d("vma"; "tx"; "dirty_pages_logged") + d("vma"; "rx"; "dirty_pages_logged")),
           postcopy_pages_missing_destination: (port($s1; "vmb").migration.postcopy_pages_missing),
           postcopy_pages_fetched_destination: (port($s1; "vmb").migration.postcopy_pages_fetched),
           rarp_announces: (port($s1; "vmb").migration.rarp_announces),
           drops: ([$s1[0][] | .port as $p | (.rx.drops, .tx.drops) | to_entries[]
                    | {key: ($p + " " + .key), value}]
                   | group_by(.key) | map({key: .[0].key, value: (map(.value) | add)})
                   | from_entries)}}'
}

results=$work/results.jsonl
: >"$results"
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$rounds"); do
    for bw in $bws; do
        for load in $loads; do
            for mode in $modes; do
                case $mode in precopy | postcopy) ;; *) log "unknown mode $mode"; exit 2 ;; esac
                case $load in idle | heavy) ;; *) log "unknown load $load"; exit 2 ;; esac
                r=$(run_one "$mode" "$load" "$bw" "$round")
                log "round $round $mode $load ${bw} MiB/s: $r"
                echo "$r" >>"$results"
            done
        done
    done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

out=$(jq -s --argjson rounds "$rounds" --arg bws "$bws" --argjson dl "$dl_ms" \
    --argjson timeout "$timeout" --argjson gsize "$gsize" --argjson ramp "$ramp" \
    --arg host "$(uname -r), $ncpu cpus" --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --arg qemu "$(qemu-system-x86_64 --version | head -1)" --argjson pmd "$pmd" --argjson gen "$gen" \
    --arg load0 "$load0" --arg load1 "$load1" '
  def median: map(select(. != null)) | sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  {benchmark: "migration", date: $date, host: $host, qemu: $qemu, rounds: $rounds,
   load_average: {start: $load0, end: $load1, note: "2 cores shared by the PMD, both QEMUs, the generator and the migration threads"},
   setup: {accel: "tcg (no KVM)", guest: "QEMU -smp 1 -m 256, memory-backend-memfd share=on, virtio-net-pci one queue pair, vectors=0; idle (busybox), no IPv6",
           switch: {pmd_core: $pmd, ports: "vhost-user server ports vma (source), vmb (destination), vm1 (generator)"},
           heavy_load: {generator: "ferrovs-gen txonly --rate 0 on vm1, to the guest MAC", frame_bytes: $gsize, core: $gen, ramp_s: $ramp},
           migration: {transport: "unix socket, same host", max_bandwidth_and_max_postcopy_bandwidth_mib_s: ($bws | split(" ") | map(select(. != "") | tonumber)), downtime_limit_ms: $dl,
                       precopy_timeout_s: $timeout, postcopy: "migrate-start-postcopy at once"}},
   figures: {total_time_ms: "query-migrate total-time (source)", downtime_ms: "query-migrate downtime (source; QEMU 7.2 computes it oddly for postcopy)",
             stop_to_resume_ms: "source STOP event to destination RESUME event", dirty_sync_count: "query-migrate ram dirty-sync-count",
             dirty_pages_rate_max: "the highest query-migrate ram dirty-pages-rate (pages/s) seen while polling every 20 ms",
             announce_ms: "destination RESUME event to the guest MAC on vmb in the switch MAC table (polled every 20 ms; the guest announces itself, GUEST_ANNOUNCE)",
             converged: "completed before the timeout (a precopy that did not was cancelled)"},
   median: (group_by([.max_bandwidth_mib_s, .load, .mode]) | map({key: (.[0].mode + " " + .[0].load + " " + (.[0].max_bandwidth_mib_s | tostring) + " MiB/s"), value: {
       runs: length, converged: (map(select(.converged)) | length),
       total_time_ms: (map(select(.converged) | .total_time_ms) | median),
       downtime_ms: (map(select(.converged) | .downtime_ms) | median),
       stop_to_resume_ms: (map(select(.converged) | .stop_to_resume_ms) | median),
       setup_time_ms: (map(.setup_time_ms) | median),
       ram_transferred_mib: (map(select(.converged) | .ram_transferred) | median | if . == null then null else (. / 1048576 * 10 | round / 10) end),
       dirty_sync_count: (map(.dirty_sync_count) | median),
       dirty_pages_rate_max: (map(.dirty_pages_rate_max) | median),
       postcopy_requests: (map(.postcopy_requests) | median),
       switch_dirty_pages_logged: (map(.switch.dirty_pages_logged_source) | median),
       switch_postcopy_pages_fetched: (map(.switch.postcopy_pages_fetched_destination) | median),
       mac_on_destination: (map(select(.mac_on_destination)) | length),
       announce_ms: (map(.announce_ms) | median),
       generator_mpps: (map(.generator.mpps) | median)}}) | from_entries),
   runs: .}' "$results")
mkdir -p bench
echo "$out" >"bench/results-migration-$(date -u +%Y-%m-%d).json"
echo "$out"
