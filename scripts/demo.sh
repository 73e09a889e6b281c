#!/usr/bin/env bash
# The README's first command: build ferrovs, start ferrovsd on its embedded default
# configuration (bridge br0, vhost-user ports vm1 and vm2), attach two ferrovs-gen "guests"
# (vm1 sends 64-byte UDP at a fixed rate, vm2 reflects every packet back) and show live
# per-port rates until Ctrl-C.
#
#   scripts/demo.sh                 switch + two generated guests + live rates
#   scripts/demo.sh --switch-only   just the switch, waiting for real VMs (see README)
#   RATE=2000000 scripts/demo.sh    another packet rate (packets/s)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
switch_only=0
[ "${1:-}" = "--switch-only" ] && switch_only=1
rate=${RATE:-500000}
export FERROVS_RUN_DIR=${FERROVS_RUN_DIR:-/tmp/ferrovs-demo}

command -v cargo >/dev/null || { echo "demo: cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }
cargo build --release --quiet
bin=$root/target/release
mkdir -p "$FERROVS_RUN_DIR"
rm -f "$FERROVS_RUN_DIR/ferrovs.conf.json"   # the demo always starts from the default

ncpu=$(nproc)
pmd_core=$((ncpu - 1))
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

setsid "$bin/ferrovsd" --run-dir "$FERROVS_RUN_DIR" --pmd-cores "$pmd_core" &
pids+=($!)
for _ in $(seq 100); do [ -S "$FERROVS_RUN_DIR/vm2.sock" ] && break; sleep 0.05; done
"$bin/ferrovs" show

if [ "$switch_only" = 1 ]; then
    echo
    echo "ferrovsd is running. Attach VMs to $FERROVS_RUN_DIR/vm1.sock and vm2.sock (see README)."
    echo "In another shell: FERROVS_RUN_DIR=$FERROVS_RUN_DIR $bin/ferrovs monitor"
    wait "${pids[0]}"
    exit 0
fi

gen_core=0
[ "$ncpu" -gt 1 ] && gen_core=$((ncpu - 2))
setsid taskset -c "$gen_core" "$bin/ferrovs-gen" --socket "$FERROVS_RUN_DIR/vm2.sock" --src 02:00:00:00:00:02 \
    --duration 1000000 --ring 1024 --quiet reflect >/dev/null &
pids+=($!)
sleep 0.3
setsid taskset -c "$gen_core" "$bin/ferrovs-gen" --socket "$FERROVS_RUN_DIR/vm1.sock" --src 02:00:00:00:00:01 \
    --dst 02:00:00:00:00:02 --rate "$rate" --duration 1000000 --ring 1024 --quiet txonly >/dev/null &
pids+=($!)
echo
echo "vm1 sends $rate packets/s to vm2, vm2 reflects them. Both generated guests share core $gen_core:"
echo "while one is descheduled its receive ring fills, and the switch counts those frames as"
echo "guest_no_rx_buffers drops ('ferrovs port-stats' names every drop reason)."
echo "Live rates (Ctrl-C to stop):"
"$bin/ferrovs" monitor
