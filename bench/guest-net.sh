#!/usr/bin/env bash
# Guest-to-guest networking through ferrovs and through the Linux kernel bridge, interleaved
# round by round in one run.
#
# Two QEMU guests (TCG, the test image of tests/e2e/guest: Debian kernel, busybox, the
# ferrovs-guest tool) with identical settings in both setups (-smp 1, 256 MiB of memfd
# shared memory, virtio-net-pci with one queue pair and vectors=0; the guests are not pinned
# to cores):
#
# ferrovs  ferrovsd on its default config (bridge br0, vhost-user server ports vm1, vm2), its
#          PMD on the last core (--pmd-cores), default adaptive rx mode (the PMD sleeps when
#          idle); the guests attach with -netdev vhost-user.
# kernel   a Linux bridge with two TAP devices (ip link add ... type bridge; ip tuntap add),
#          the guests attach with -netdev tap,...,vhost=off (no vhost-net module here: QEMU
#          itself moves the packets between the TAP and the rings).
#
# Per setup and round, fresh guests boot; guest A then sends to guest B:
#   tcp  one TCP stream for --seconds (as fast as it goes); figure: the receiver's Mbit/s
#        (bytes / time from accept to EOF), and the sender's retransmitted segments.
#   udp  sequenced datagrams of --udp-size payload bytes for --seconds, unpaced; figures:
#        the receiver's datagrams per second (between its first and last datagram), the
#        sender's, and the loss.
# The guests' negotiated virtio-net features are recorded. The UDP receiver also reports its
# load while the stream flowed: virtio interrupts per second and CPU busy %.
#
# ferrovs-cN  ferrovs with guest notification coalescing on both ports
#          (set-port coalesce-usecs=N coalesce-frames=64): the receiving guest's interrupts
#          per second and CPU against plain ferrovs.
#
# Prints one JSON document on stdout (progress on stderr): every round's figures, per setup
# the medians, and the ratios ferrovs / kernel of the medians. Every process is started with
# setsid and stopped by pid; the bridge and TAPs are deleted at the end (also on failure).
#
#   bench/guest-net.sh [--rounds 3] [--seconds 10] [--udp-size 18] [--udp-pps N (paced; default
#                      unpaced)]
#                      [--setups "ferrovs kernel"]   (also ferrovs-c50 etc.)
#                      [--keep]
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
root=$PWD
rounds=3 secs=10 usize=18 setups="ferrovs kernel" keep=0 upps=0
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --seconds) secs=$2; shift 2 ;;
        --udp-size) usize=$2; shift 2 ;;
        --udp-pps) upps=$2; shift 2 ;;
        --setups) setups=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "needs root (bridge and TAP devices)" >&2; exit 1; }
bash scripts/deps.sh >/dev/null
cargo build --release --quiet
bin=$root/target/release
img=$root/target/guest
bash tests/e2e/guest/build-initramfs.sh "$img" >&2
ncpu=$(nproc)
pmd=$((ncpu - 1))
work=$(mktemp -d /tmp/ferrovs-guest-net.XXXXXX)
# Link names carry our pid (at most 15 bytes).
tag=$(($$ % 10000000))
br=fvbr$tag tapa=fvta$tag tapb=fvtb$tag

# shellcheck source=bench/lib.sh
source bench/lib.sh
del_links() {
    local l
    for l in "$tapa" "$tapb" "$br"; do
        ip link show "$l" >/dev/null 2>&1 && ip link del "$l"
    done
    return 0
}
cleanup() {
    stop_all
    del_links
    if [ "$keep" = 1 ]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM


# Starts guest $1 (a or b) in $2 with NIC backend arguments $3 (-netdev ...).
guest() {
    local name=$1 d=$2 netdev=$3 mac args
    if [ "$name" = a ]; then
        mac=52:54:00:00:00:01
        args="ferrovs.ip=10.0.0.1/24 ferrovs.cmd=tool ferrovs.peer=10.0.0.2 ferrovs.wait=60"
        if [ "$upps" = 0 ]; then
            args+=" ferrovs.args=sleep,2+tcp-send,10.0.0.2,5000,$secs+sleep,2+udp-blast,10.0.0.2,5001,$secs,$usize"
        else
            args+=" ferrovs.args=sleep,2+tcp-send,10.0.0.2,5000,$secs+sleep,2+udp-send,10.0.0.2,5001,$upps,$((upps * secs)),$usize"
        fi
    else
        mac=52:54:00:00:00:02
        args="ferrovs.ip=10.0.0.2/24 ferrovs.cmd=tool ferrovs.args=tcp-recv,5000+udp-recv,5001,3"
    fi
    # shellcheck disable=SC2086  # $netdev: several words
    setsid qemu-system-x86_64 -accel tcg -m 256 -smp 1 -nographic -no-reboot -nodefaults \
        -serial "file:$d/$name.console" -kernel "$img/vmlinuz" -initrd "$img/initramfs.gz" \
        -append "console=ttyS0 quiet $args" \
        -object memory-backend-memfd,id=mem,size=256M,share=on -numa node,memdev=mem \
        $netdev -device "virtio-net-pci,netdev=n0,mac=$mac,vectors=0" -name "$d/$name" \
        >"$d/$name.qemu.log" 2>&1 &
    track "$!"
}

# The guests' results once both are done: one JSON object.
guest_results() {
    local d=$1
    wait_console "$d/a.console" FERROVS-TOOL-DONE $((120 + 3 * secs))
    wait_console "$d/b.console" FERROVS-TOOL-DONE 60
    sed -n 's/.*FERROVS-RESULT //p' "$d/a.console" | jq -s -c . >"$d/a.json"
    sed -n 's/.*FERROVS-RESULT //p' "$d/b.console" | jq -s -c . >"$d/b.json"
    local fa fb
    fa=$(sed -n 's/.*FERROVS-NIC .*features=\([01]*\).*/\1/p' "$d/a.console" | head -1 | tr -d '\r')
    fb=$(sed -n 's/.*FERROVS-NIC .*features=\([01]*\).*/\1/p' "$d/b.console" | head -1 | tr -d '\r')
    jq -n -c --slurpfile a "$d/a.json" --slurpfile b "$d/b.json" --arg fa "$fa" --arg fb "$fb" '
        ($a[0]) as $a | ($b[0]) as $b
        | {tcp_mbps: ($b[0].mbps), tcp_bytes: ($b[0].bytes), tcp_retransmits: ($a[0].retransmits),
           udp_rx_pps: ($b[1].pps), udp_tx_pps: ($a[1].pps), udp_sent: ($a[1].sent),
           udp_received: ($b[1].received), udp_lost: ($a[1].sent - $b[1].received),
           udp_reordered: ($b[1].reordered), udp_rx_irqs_per_s: ($b[1].irqs_per_s),
           udp_rx_cpu_busy_pct: ($b[1].cpu_busy_pct), features_a: $fa, features_b: $fb}'
}

# run_ferrovs ROUND [COALESCE_USECS]
run_ferrovs() {
    local d=$work/ferrovs-$1-${2:-0} p
    mkdir -p "$d"
    setsid "$bin/ferrovsd" --run-dir "$d" --pmd-cores "$pmd" >"$d/ferrovsd.log" 2>&1 &
    track "$!"
    wait_sock "$d/vm2.sock"
    if [ "${2:-0}" != 0 ]; then
        for p in vm1 vm2; do
            "$bin/ferrovs" --run-dir "$d" set-port "$p" "coalesce-usecs=$2" coalesce-frames=64
        done
    fi
    guest b "$d" "-chardev socket,id=c0,path=$d/vm2.sock -netdev vhost-user,id=n0,chardev=c0"
    guest a "$d" "-chardev socket,id=c0,path=$d/vm1.sock -netdev vhost-user,id=n0,chardev=c0"
    local r; r=$(guest_results "$d")
    local st; st=$("$bin/ferrovs" --run-dir "$d" port-stats --json)
    local pm; pm=$("$bin/ferrovs" --run-dir "$d" pmd-stats --json)
    stop_all
    jq -c --argjson st "$st" --argjson pm "$pm" '. + {
        switch_drops: ([$st[] | (.rx.drops, .tx.drops) | to_entries[]] | group_by(.key)
                       | map({key: .[0].key, value: (map(.value) | add)}) | from_entries),
        notifications_to_b: ($st[] | select(.port == "vm2") | .tx
            | {made: .guest_notifications, suppressed: .notifications_suppressed, coalesced: .notifications_coalesced}),
        pmd: ($pm[0] | {rx_mode, busy_pct, sleeps, kick_wakeups})}' <<<"$r"
}

run_kernel() {
    local d=$work/kernel-$1 l
    mkdir -p "$d"
    ip link add "$br" type bridge
    ip link set "$br" up
    for l in "$tapa" "$tapb"; do
        ip tuntap add dev "$l" mode tap
        ip link set "$l" master "$br"
        ip link set "$l" up
    done
    guest b "$d" "-netdev tap,id=n0,ifname=$tapb,script=no,downscript=no,vhost=off"
    guest a "$d" "-netdev tap,id=n0,ifname=$tapa,script=no,downscript=no,vhost=off"
    local r; r=$(guest_results "$d")
    # TAP drops: tx_dropped = frames the bridge could not hand to a guest's QEMU in time.
    local drops; drops=$(for l in "$tapa" "$tapb"; do
        ip -j -s link show "$l" | jq -c --arg l "$l" '{key: $l, value: {rx_dropped: .[0].stats64.rx.dropped, tx_dropped: .[0].stats64.tx.dropped}}'
    done | jq -s -c from_entries)
    stop_all
    del_links
    jq -c --argjson drops "$drops" '. + {tap_drops: $drops}' <<<"$r"
}

results=$work/results.jsonl
: >"$results"
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$rounds"); do
    for who in $setups; do
        case $who in
            ferrovs) r=$(run_ferrovs "$round") ;;
            ferrovs-c[0-9]*) r=$(run_ferrovs "$round" "${who#ferrovs-c}") ;;
            kernel) r=$(run_kernel "$round") ;;
            *) log "unknown setup $who"; exit 2 ;;
        esac
        log "round $round $who: $r"
        jq -c --arg who "$who" --argjson round "$round" '{round: $round, who: $who} + .' <<<"$r" >>"$results"
    done
done

load1=$(cut -d' ' -f1-3 /proc/loadavg)
brnf=$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo absent)
jq -s --argjson rounds "$rounds" --argjson secs "$secs" --argjson usize "$usize" --argjson upps "$upps" \
    --arg host "$(uname -r), $ncpu cpus" --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --arg qemu "$(qemu-system-x86_64 --version | head -1)" --arg brnf "$brnf" --argjson pmd "$pmd" \
    --arg load0 "$load0" --arg load1 "$load1" '
  def median: map(select(. != null)) | sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def r3: if . == null then null else (. * 1000 | round / 1000) end;
  # Virtio feature bits (the guest sysfs string: character N is bit N) worth naming here.
  def offloads: . as $f | [[0, "csum"], [1, "guest_csum"], [7, "guest_tso4"], [8, "guest_tso6"],
      [11, "host_tso4"], [12, "host_tso6"], [15, "mrg_rxbuf"], [28, "indirect_desc"],
      [29, "event_idx"], [32, "version_1"]]
      | map(select($f[.[0]:.[0] + 1] == "1") | .[1]);
  (group_by(.who) | map({key: .[0].who, value: {
      tcp_mbps: (map(.tcp_mbps) | median), udp_rx_pps: (map(.udp_rx_pps) | median),
      udp_tx_pps: (map(.udp_tx_pps) | median), tcp_retransmits: (map(.tcp_retransmits) | add),
      udp_lost: (map(.udp_lost) | add), guest_features: (.[0].features_a | offloads),
      udp_rx_irqs_per_s: (map(.udp_rx_irqs_per_s) | median),
      udp_rx_cpu_busy_pct: (map(.udp_rx_cpu_busy_pct) | median)}})
   | from_entries) as $m
  | {benchmark: "guest-net", date: $date, host: $host, qemu: $qemu, rounds: $rounds,
     load_average: {start: $load0, end: $load1, note: "the machine is shared with other builds"},
     setup: {accel: "tcg (no KVM): both setups, the same guest image and QEMU settings",
             guests: "2 x QEMU -smp 1 -m 256, memory-backend-memfd share=on, virtio-net-pci one queue pair, vectors=0, not pinned to cores",
             ferrovs: {pmd_core: $pmd, rx_mode: "adaptive (default)", ports: "vhost-user server ports vm1, vm2 on bridge br0"},
             kernel: {bridge: "ip link add type bridge (no STP), two TAPs (ip tuntap add)", qemu_netdev: "tap,vhost=off", bridge_nf_call_iptables: $brnf}},
     tcp: {seconds: $secs, figure: "receiver Mbit/s, one stream A -> B, unpaced"},
     udp: {seconds: $secs, payload_bytes: $usize, sender_pps: (if $upps > 0 then $upps else "unpaced" end),
           figure: "receiver datagrams/s between its first and last datagram; receiver virtio IRQ/s and CPU busy % meanwhile"},
     median: $m,
     ratio_ferrovs_over_kernel: (if $m.ferrovs and $m.kernel then
         {tcp_mbps: (if $m.kernel.tcp_mbps > 0 then $m.ferrovs.tcp_mbps / $m.kernel.tcp_mbps | r3 else null end),
          udp_rx_pps: (if $m.kernel.udp_rx_pps > 0 then $m.ferrovs.udp_rx_pps / $m.kernel.udp_rx_pps | r3 else null end)}
         else null end),
     coalescing_over_plain_ferrovs: ($m | to_entries | map(select(.key | startswith("ferrovs-c")))
         | map({key: .key, value: (if $m.ferrovs then
             {udp_rx_irqs_per_s: (if ($m.ferrovs.udp_rx_irqs_per_s // 0) > 0 then .value.udp_rx_irqs_per_s / $m.ferrovs.udp_rx_irqs_per_s | r3 else null end),
              udp_rx_cpu_busy_pct: (if ($m.ferrovs.udp_rx_cpu_busy_pct // 0) > 0 then .value.udp_rx_cpu_busy_pct / $m.ferrovs.udp_rx_cpu_busy_pct | r3 else null end),
              udp_rx_pps: (if ($m.ferrovs.udp_rx_pps // 0) > 0 then .value.udp_rx_pps / $m.ferrovs.udp_rx_pps | r3 else null end),
              tcp_mbps: (if ($m.ferrovs.tcp_mbps // 0) > 0 then .value.tcp_mbps / $m.ferrovs.tcp_mbps | r3 else null end)}
             else null end)}) | from_entries),
     rounds_detail: map(del(.features_a, .features_b))}' "$results"
