#!/usr/bin/env bash
# Installs, idempotently, what ferrovs's tests and benchmarks need from Debian:
#   QEMU (real guests), DPDK's testpmd (interop and the bench peer), OVS-DPDK (bench peer),
#   a Debian kernel and busybox (the guest image), and small tools (iproute2 and ping for
#   the kernel-port tests, conntrack and nftables for the conntrack differential test),
#   OVN 23.03 (ovn-central: ovn-northd and the NB/SB schemas; ovn-host: ovn-controller) for
#   the OVN lab (tests/ovn/lab.sh); and os-ken (PyPI, with eventlet) in a venv for its switch
#   test tool (scripts/osken-switch-tests.sh): $OSKEN_VENV, default target/osken/venv;
#   and a Prometheus server (prometheus) that the metrics e2e test scrapes ferrovsd with.
# Runs `apt-get update` only when something is missing. Usage: scripts/deps.sh [--hugepages N]
#
# The tests start every OVS, OVN and Prometheus daemon they need themselves, privately (their own run
# directories and namespaces); the system services these packages bring (openvswitch-switch,
# ovn-central, ovn-host) would only get in the way: a stray ovn-controller on the system's
# database, ovn-northd holding /var/run/ovn. So they are never started by an install here
# (a temporary policy-rc.d answers "not now", as Debian's invoke-rc.d and
# deb-systemd-invoke ask it), and where systemd runs they are stopped and disabled.
set -euo pipefail

packages=(
    qemu-system-x86 dpdk dpdk-dev openvswitch-switch-dpdk busybox-static linux-image-amd64
    iproute2 iputils-ping ethtool iperf3 tcpdump jq socat cpio kmod valgrind conntrack nftables
    python3 python3-venv ovn-central ovn-host prometheus
)
# Capture (issue 21): libpcap's filter compiler, which ferrovsd links (`ferrovs capture
# FILTER`); tcpdump (above) reads the pcapng files in its tests.
packages+=(libpcap-dev)
services=(ovn-central ovn-host ovn-northd ovn-controller ovn-ovsdb-server-nb ovn-ovsdb-server-sb prometheus)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    # No service starts during the install (exit 101: "action forbidden by policy").
    own_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
        $sudo chmod 755 /usr/sbin/policy-rc.d
        own_policy=1
    fi
    rc=0
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
    [ $own_policy = 0 ] || $sudo rm -f /usr/sbin/policy-rc.d
    [ $rc = 0 ] || exit $rc
fi
# Where systemd runs, OVN's units stay stopped and disabled (installed before this script
# did the above, they may have been started and enabled).
if [ -d /run/systemd/system ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    for u in "${services[@]}"; do
        if systemctl is-enabled --quiet "$u" 2>/dev/null || systemctl is-active --quiet "$u" 2>/dev/null; then
            echo "deps: stopping and disabling $u (the tests run their own OVN daemons)"
            $sudo systemctl disable --now "$u" >/dev/null 2>&1 || true
        fi
    done
fi

# os-ken's switch tester (os_ken/tests/switch) and eventlet, which it needs as its hub. The
# venv uses Debian's python3 (not a pyenv shim), so it is the same on every machine.
venv=${OSKEN_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target/osken/venv}
if ! "$venv/bin/python3" -c 'import os_ken.tests.switch.tester, eventlet' 2>/dev/null; then
    echo "deps: os-ken venv in $venv"
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check os-ken eventlet
fi

if [ "${1:-}" = "--hugepages" ]; then
    n=${2:?--hugepages needs a count of 2 MiB pages}
    have=$(cat /proc/sys/vm/nr_hugepages)
    if [ "$have" -lt "$n" ]; then
        echo "$n" > /proc/sys/vm/nr_hugepages
    fi
    mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages; mount -t hugetlbfs nodev /dev/hugepages; }
fi
# Service and packaging (tests/package/run.sh, docs/packaging.md): cargo-deb builds the
# .deb; mmdebstrap makes the clean Debian root it is installed in, systemd-nspawn
# (systemd-container) boots that root with systemd, lintian checks the package.
pkg_apt=(mmdebstrap systemd-container lintian)
pkg_missing=()
for p in "${pkg_apt[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || pkg_missing+=("$p")
done
if [ ${#pkg_missing[@]} -gt 0 ]; then
    echo "deps: installing ${pkg_missing[*]}"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${pkg_missing[@]}" >/dev/null
fi
CARGO_DEB_VERSION=3.8.0
if ! cargo deb --version 2>/dev/null | grep -qF "$CARGO_DEB_VERSION"; then
    echo "deps: cargo-deb $CARGO_DEB_VERSION"
    cargo install --locked --quiet cargo-deb --version "$CARGO_DEB_VERSION"
fi

echo "deps: ok"
