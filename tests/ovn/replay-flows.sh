#!/usr/bin/env bash
# Replays flows that ovn-controller installed on an OVS chassis into a private switch, one
# `ovs-ofctl add-flow` each, and tallies what it refuses and why: the flow-level half of the
# gap list in docs/ovn.md, measurable before ferrovs speaks OpenFlow 1.5 to ovn-controller.
#
#   tests/ovn/replay-flows.sh [--switch ferrovs|ovs] [--protocol OpenFlow13] [--keep] FLOWS...
#   tests/ovn/replay-flows.sh --probes [--protocol P] FLOWS...
#
# FLOWS: `ovs-ofctl dump-flows` output (tests/ovn/lab.sh's flows/sN-chM.flows; statistics
# are stripped). tests/ovn/reference/sN-ch1.flows are chassis 1's flows after scenario N
# with OVS 3.1 and OVN 23.03 (2026-11-28), so that this runs without an OVS lab. The switch runs privately with its own directory and a bridge br-int:
# ferrovsd (release build, FERROVS_BIN_DIR overrides), or OVS (ovs-vswitchd, netdev, in a
# namespace of its own). Flows go to br-int.mgmt over --protocol (default OpenFlow13: the
# version ferrovs speaks today; ovs-ofctl encodes OVN's Nicira actions in it as in 1.5).
# Port numbers need not exist (OpenFlow allows rules on absent ports). Groups dumped beside
# the flows (sN-chM.groups) are added first, over OpenFlow 1.5.
#
# Without --probes: how many flows were accepted, then each distinct refusal (ovs-ofctl's
# error, which names the first thing the switch refused in that flow) with its count and an
# example; per-flow results (status, flow) in the work directory, which --keep keeps.
# With --probes: `tally.py probes` makes one minimal flow per distinct match field and per
# distinct action of FLOWS; each goes to OVS and to ferrovs, and a table says per field and
# action what each switch answered (a probe OVS refuses is the probe's fault, not ferrovs's).
# Exit status 0 when the replay ran, whatever it counted.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${FERROVS_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
OVS_VSWITCHD=${OVS_VSWITCHD:-/usr/sbin/ovs-vswitchd}
proto=OpenFlow13 keep=0 switch=ferrovs probes=0
while [ $# -gt 0 ]; do
    case $1 in
    --protocol) proto=$2; shift 2 ;;
    --switch) switch=$2; shift 2 ;;
    --probes) probes=1; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || { sed -n '2,24p' "$0" >&2; exit 1; }

W=$(mktemp -d /tmp/ferrovs-ovn-replay.XXXXXX)
declare -A TLV_MAP
pids=() nss=()
cleanup() {
    set +e
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "$W"/*/ovs-vswitchd.pid "$W"/*/ovsdb-server.pid; do
        [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null
    done
    for p in "${nss[@]}"; do ip netns del "$p" 2>/dev/null; done
    sleep 0.2
    if [ $keep = 1 ]; then echo "work directory: $W" >&2; else rm -rf "$W"; fi
}
trap cleanup EXIT

# start_switch KIND: a private switch with bridge br-int; sets SOCK to its management socket.
start_switch() {
    local kind=$1 d=$W/$1
    mkdir -p "$d"
    case $kind in
    ferrovs)
        [ -x "$BIN/ferrovsd" ] || { echo "no $BIN/ferrovsd: cargo build --release" >&2; return 1; }
        FERROVS_RUN_DIR=$d "$BIN/ferrovsd" --run-dir "$d" --pmd-cores 1 --log-level info \
            >"$d/ferrovsd.log" 2>&1 &
        pids+=($!)
        for _ in $(seq 50); do "$BIN/ferrovs" --run-dir "$d" show >/dev/null 2>&1 && break; sleep 0.1; done
        "$BIN/ferrovs" --run-dir "$d" add-bridge br-int >/dev/null
        ;;
    ovs)
        local ns=ovl-replay-$$
        ip netns add "$ns"
        nss+=("$ns")
        ovsdb-tool create "$d/conf.db" /usr/share/openvswitch/vswitch.ovsschema
        ovsdb-server "$d/conf.db" --remote="punix:$d/db.sock" --unixctl="$d/ovsdb-server.ctl" \
            --pidfile="$d/ovsdb-server.pid" --log-file="$d/ovsdb-server.log" --detach --no-chdir \
            2>>"$d/start.log"
        ovs-vsctl --db="unix:$d/db.sock" --no-wait init
        ip netns exec "$ns" env OVS_RUNDIR="$d" OVS_LOGDIR="$d" OVS_DBDIR="$d" "$OVS_VSWITCHD" \
            "unix:$d/db.sock" --unixctl="$d/ovs-vswitchd.ctl" --pidfile="$d/ovs-vswitchd.pid" \
            --log-file="$d/ovs-vswitchd.log" --detach --no-chdir 2>>"$d/start.log"
        ovs-vsctl --db="unix:$d/db.sock" --timeout=20 add-br br-int -- set bridge br-int \
            datapath_type=netdev fail_mode=secure
        ;;
    esac
    for _ in $(seq 50); do [ -S "$d/br-int.mgmt" ] && break; sleep 0.1; done
    SOCK=unix:$d/br-int.mgmt
    # OVN's one Geneve option (class 0x0102, type 0x80, 4 bytes) as tun_metadata0, as
    # ovn-controller maps it with NXT_TLV_TABLE_MOD before its first flow.
    TLV_MAP[$kind]=$(ovs-ofctl -O "$proto" add-tlv-map "$SOCK" \
        '{class=0x102,type=0x80,len=4}->tun_metadata0' 2>&1 | head -1 |
        sed -E "s#unix:$W/[a-z]+/##g; s/ ?\(xid=0x[0-9a-f]+\)//; s/^ovs-ofctl: //" || true)
    TLV_MAP[$kind]=${TLV_MAP[$kind]:-ok}
}

# add S FLOW: "ok" or the switch's first error line (xid and paths removed).
add() {
    local err
    if err=$(ovs-ofctl -O "$proto" add-flow "$1" "$2" 2>&1 >/dev/null); then
        echo ok
    else
        echo "$err" | grep -v '^$' | head -1 | sed -E "s#unix:$W/[a-z]+/##g; s/ ?\(xid=0x[0-9a-f]+\)//; s/^ovs-ofctl: //"
    fi
}

# A dumped flow without its statistics (what add-flow takes).
strip() {
    sed -E 's/^ +//; s/(duration|n_packets|n_bytes|idle_age|hard_age)=[^,]*, ?//g; s/, priority/,priority/'
}

if [ $probes = 1 ]; then
    start_switch ovs
    S_OVS=$SOCK
    start_switch ferrovs
    S_FV=$SOCK
    for flows in "$@"; do
        switch=ovs add_groups "$S_OVS" "$flows"
        switch=ferrovs add_groups "$S_FV" "$flows"
    done
    python3 "$ROOT/tests/ovn/tally.py" probes "$@" >"$W/probes.tsv"
    n=0 ok=0 bad=0
    echo "| kind | name | OVS | ferrovs ($proto) | probe |"
    echo "|---|---|---|---|---|"
    while IFS=$'\t' read -r kind name flow; do
        a=$(add "$S_OVS" "$flow")
        b=$(add "$S_FV" "$flow")
        n=$((n + 1))
        if [ "$a" = ok ]; then
            if [ "$b" = ok ]; then ok=$((ok + 1)); else bad=$((bad + 1)); fi
        fi
        printf '| %s | `%s` | %s | %s | `%s` |\n' "$kind" "$name" "$a" "$b" "$(echo "$flow" | cut -c1-140 | sed 's/|/\\|/g')"
    done <"$W/probes.tsv"
    echo
    echo "$n probes; of those OVS accepts, ferrovs accepts $ok and refuses $bad. The Geneve"
    echo "option map (add-tlv-map, NXT_TLV_TABLE_MOD) before them: OVS ${TLV_MAP[ovs]}, ferrovs ${TLV_MAP[ferrovs]}."
    exit 0
fi

# add_groups S FLOWS: the groups dumped beside FLOWS (sN-chM.groups, `dump-groups` output),
# added first over OpenFlow 1.5 (their selection_method needs it) so that the flows' `group:N`
# actions find them; prints how many the switch took.
add_groups() {
    local g=${2%.flows}.groups n=0 ok=0 line
    [ -f "$g" ] || return 0
    while IFS= read -r line; do
        n=$((n + 1))
        if ovs-ofctl -O OpenFlow15 add-group "$1" "$line" >"$W/group.err" 2>&1; then
            ok=$((ok + 1))
        else
            echo "group refused: $(head -1 "$W/group.err" | sed -E "s#unix:$W/[a-z]+/##g; s/ ?\(xid=0x[0-9a-f]+\)//; s/^ovs-ofctl: //") ($(echo "$line" | cut -c1-100))"
        fi
    done < <(grep -E 'group_id=' "$g" | sed -E 's/^ +//')
    [ $n = 0 ] || echo "$ok of $n groups of $(basename "$g") accepted by $switch over OpenFlow15"
}

start_switch "$switch"
S=$SOCK
for flows in "$@"; do
    add_groups "$S" "$flows"
    out=$W/$(basename "$flows").$switch.tsv
    : >"$out"
    grep -E 'actions=' "$flows" | strip | while IFS= read -r f; do
        printf '%s\t%s\n' "$(add "$S" "$f")" "$f" >>"$out"
    done
    total=$(wc -l <"$out")
    ok=$(grep -c '^ok	' "$out" || true)
    echo "$ok of $total flows of $(basename "$flows") accepted by $switch over $proto (Geneve option map: ${TLV_MAP[$switch]})"
    echo
    echo "| refusal (the first thing refused in the flow) | flows | example |"
    echo "|---|---|---|"
    awk -F'\t' '$1 != "ok" { n[$1]++; if (!($1 in ex)) ex[$1] = $2 }
        END { for (e in n) printf "%d\t%s\t%s\n", n[e], e, ex[e] }' "$out" | sort -rn |
        while IFS=$'\t' read -r n e ex; do
            printf '| %s | %d | `%s` |\n' "$(echo "$e" | sed 's/|/\\|/g')" "$n" "$(echo "$ex" | cut -c1-140 | sed 's/|/\\|/g')"
        done
    echo
done
