#!/usr/bin/env bash
# How far apart this host's two last cores are: a cache line bounced between a thread on
# each, 2 million round trips, ns per round trip (C, bench/tools/core-pingpong.c; prints
# JSON). The rates of bench/vhost-fwd.sh and bench/many-ports.sh swing with it on a VM
# whose vCPUs the hypervisor moves (docs/datapath.md, "Many ports on one PMD": 82-84 ns
# when ferrovs ran in its fast state, 105-451 ns in its slow one).
#
#   bench/core-pingpong.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ncpu=$(nproc)
[ "$ncpu" -ge 2 ] || { echo "core-pingpong: needs two cores" >&2; exit 2; }
a=$((ncpu - 2)) b=$((ncpu - 1))
# shellcheck source=bench/lib.sh
source bench/lib.sh
"$(pingpong_bin)" "$a" "$b"
