#!/usr/bin/env bash
# Builds a minimal guest initramfs from Debian packages (busybox-static, linux-image-amd64):
# busybox, the virtio-net modules of the host's Debian kernel, and an /init that configures
# eth0 from the kernel command line and runs the command given there.
#
#   build-initramfs.sh OUT_DIR      → OUT_DIR/vmlinuz, OUT_DIR/initramfs.gz (cached)
#
# Kernel command line understood by /init:
#   ferrovs.ip=10.0.0.1/24   ferrovs.cmd=ping|idle   ferrovs.peer=10.0.0.2   ferrovs.count=5
#   ferrovs.cmd=tool ferrovs.args=tcp-send,10.0.0.2,5000,8+udp-send,... (ferrovs-guest
#   commands separated by '+', their arguments by ','; after ferrovs.wait=N pings of
#   ferrovs.peer if given)
#   ferrovs.interval=0.1 (seconds between pings)   ferrovs.wait=N (ping the peer until it
#   answers, up to N tries, before the counted run)
#   A tool command written bg,CMD,ARGS runs in the background; FERROVS-TOOL-DONE comes when
#   all have ended.
#   ferrovs.mtu=N: eth0's MTU (an overlay's, e.g. 1400 under Geneve)
#   ferrovs.xps=off: clear every TX queue's XPS CPU mask (the queue then follows the flow hash)
#   ferrovs.neigh=IP,MAC: a permanent ARP entry (the guest never asks for IP, and so sends
#   nothing unasked: a migration test sees the guest's MAC move only by an announce)
#   ferrovs.control=1 (with cmd=tool): the tool commands run in the background while /init
#   reads commands from the console (the serial port): `reboot` (reboot -f: QEMU resets the
#   machine, the same kernel, initramfs and command line boot again), `reset-nic` (rmmod
#   virtio_net, load it again, configure eth0 again: a driver reset without reboot),
#   `ping ADDR COUNT` (FERROVS-PING-OK or FERROVS-PING-FAIL after COUNT pings, 0.2 s apart),
#   `tool ARGS` (ARGS as ferrovs.args; FERROVS-TOOL-CMD-DONE when its commands have ended).
# Console lines for the test: FERROVS-GUEST-READY MAC (every boot and every NIC reset),
# FERROVS-NIC queues=TX_QUEUES features=VIRTIO_FEATURE_BITS, FERROVS-NIC-RESET-DONE.
set -euo pipefail
out=${1:?usage: build-initramfs.sh OUT_DIR}
kver=$(ls /lib/modules | sort -V | tail -1)
kernel=/boot/vmlinuz-$kver
[ -f "$kernel" ] || { echo "no kernel $kernel (install linux-image-amd64)" >&2; exit 1; }
command -v busybox >/dev/null || { echo "busybox missing (install busybox-static)" >&2; exit 1; }
# The guest traffic tool (tests/e2e/guest/tool), linked statically: the initramfs has no libc.
repo=$(cd "$(dirname "$0")/../../.." && pwd)
RUSTFLAGS="-C target-feature=+crt-static -C strip=symbols" cargo build --release --quiet -p ferrovs-guest-tool \
    --target x86_64-unknown-linux-gnu --target-dir "$repo/target/guest-tool" \
    --manifest-path "$repo/Cargo.toml"
tool=$repo/target/guest-tool/x86_64-unknown-linux-gnu/release/ferrovs-guest
stamp="$kver $(sha256sum "$0" | cut -c1-16) $(sha256sum "$tool" | cut -c1-16)"
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ]; then exit 0; fi
mkdir -p "$out"
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,proc,sys,dev,tmp,lib/modules}
cp "$(command -v busybox)" "$root/bin/busybox"
cp "$tool" "$root/bin/ferrovs-guest"
for a in sh mount ip arp ping sleep cat echo insmod rmmod poweroff reboot grep sed awk seq nc ifconfig dmesg tail lspci tr ls wc; do
    ln -s busybox "$root/bin/$a"
done
# Modules in dependency order, as modprobe would load them.
mods=$( (modprobe -S "$kver" --show-depends virtio_pci; modprobe -S "$kver" --show-depends virtio_net) | awk '$1 == "insmod" {print $2}' | awk '!seen[$0]++')
order=()
for f in $mods; do
    m=$(basename "$f"); m=${m%%.ko*}
    case $f in
        *.xz) xz -dc "$f" >"$root/lib/modules/$m.ko" ;;
        *.zst) zstd -dqc "$f" >"$root/lib/modules/$m.ko" ;;
        *) cp "$f" "$root/lib/modules/$m.ko" ;;
    esac
    order+=("$m")
done
echo "${order[*]}" >"$root/lib/modules/order"
cat >"$root/init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
for m in $(cat /lib/modules/order); do
    insmod /lib/modules/$m.ko || echo "FERROVS-GUEST: insmod $m failed"
done
arg() { sed -n "s/.*ferrovs\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
ip=$(arg ip); cmd=$(arg cmd); peer=$(arg peer); count=$(arg count); interval=$(arg interval); wait=$(arg wait); targs=$(arg args)
xps=$(arg xps); control=$(arg control); neigh=$(arg neigh); mtu=$(arg mtu)
setup_eth0() {
    for i in $(seq 150); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done
    [ -e /sys/class/net/eth0 ] || { echo "FERROVS-GUEST: no eth0"; ls /sys/class/net; cat /proc/modules; ls /sys/bus/pci/devices; cat /sys/bus/pci/devices/*/vendor /sys/bus/pci/devices/*/device; dmesg | tail -15; }
    ip link set lo up
    [ -z "$mtu" ] || ip link set eth0 mtu "$mtu"
    ip link set eth0 up
    ip addr add "$ip" dev eth0
    if [ -n "$neigh" ]; then
        arp -s "${neigh%%,*}" "${neigh#*,}" || echo "FERROVS-GUEST: arp -s $neigh failed"
    fi
    if [ "$xps" = off ]; then
        for f in /sys/class/net/eth0/queues/tx-*/xps_cpus; do echo 0 >"$f"; done
    fi
    echo "FERROVS-NIC queues=$(ls -d /sys/class/net/eth0/queues/tx-* | wc -l) features=$(cat /sys/class/net/eth0/device/features)"
    echo "FERROVS-GUEST-READY $(cat /sys/class/net/eth0/address)"
}
wait_peer() {
    if [ -n "$wait" ] && [ -n "$peer" ]; then
        for i in $(seq "$wait"); do ping -c 1 -W 1 "$peer" >/dev/null 2>&1 && break; done
        echo "FERROVS-PEER-UP"
    fi
}
run_tool() {
    for c in $(echo "$targs" | tr + ' '); do
        case $c in
            # shellcheck disable=SC2046
            bg,*) ferrovs-guest $(echo "${c#bg,}" | tr , ' ') & ;;
            # shellcheck disable=SC2046
            *) ferrovs-guest $(echo "$c" | tr , ' ') ;;
        esac
    done
    wait
    echo "FERROVS-TOOL-DONE"
}
control_loop() {
    while read -r c; do
        case $c in
            reboot) echo "FERROVS-REBOOTING"; reboot -f ;;
            reset-nic)
                ip link set eth0 down
                rmmod virtio_net || echo "FERROVS-GUEST: rmmod virtio_net failed"
                insmod /lib/modules/virtio_net.ko || echo "FERROVS-GUEST: insmod virtio_net failed"
                setup_eth0
                echo "FERROVS-NIC-RESET-DONE" ;;
            ping\ *)
                # shellcheck disable=SC2086
                set -- $c
                if ping -c "$3" -i 0.2 -W 2 "$2" >/tmp/ping.out 2>&1; then
                    cat /tmp/ping.out; echo "FERROVS-PING-OK"
                else
                    cat /tmp/ping.out; echo "FERROVS-PING-FAIL"
                fi ;;
            tool\ *)
                # In a subshell: its `wait` is for this command's background jobs only.
                (targs=${c#tool }; run_tool)
                echo "FERROVS-TOOL-CMD-DONE" ;;
            "") ;;
            *) echo "FERROVS-GUEST: unknown command $c" ;;
        esac
    done
}
setup_eth0
case "$cmd" in
    ping)
        if [ -n "$wait" ]; then
            for i in $(seq "$wait"); do ping -c 1 -W 1 "$peer" >/dev/null 2>&1 && break; done
            echo "FERROVS-PEER-UP"
        fi
        if ping -c "${count:-5}" -i "${interval:-1}" -W 2 "$peer" > /tmp/ping.out 2>&1; then
            cat /tmp/ping.out; echo "FERROVS-PING-OK"
        else
            cat /tmp/ping.out; echo "FERROVS-PING-FAIL"
        fi
        poweroff -f ;;
    tool)
        wait_peer
        if [ "$control" = 1 ]; then
            run_tool &
            control_loop
        else
            run_tool
        fi
        while true; do sleep 3600; done ;;
    *)
        while true; do sleep 3600; done ;;
esac
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$out/initramfs.gz"
cp "$kernel" "$out/vmlinuz"
echo "$stamp" >"$out/stamp"
