#!/usr/bin/env python3
"""Tallies of what ovn-controller asks of its switch, as markdown tables.

    tally.py flows DUMP...      match fields and actions of `ovs-ofctl dump-flows` output
    tally.py msgs OFLOG...      OpenFlow messages logged by tests/ovn/ofproxy.py
    tally.py ovsdb LOG...       OVSDB transactions and monitors in ovn-controller's log
                                (run with -vjsonrpc:file:dbg): tables, columns, operations
    tally.py probes DUMP...     one minimal flow per distinct match field and per distinct
                                action of the dumps, as "KIND<TAB>NAME<TAB>FLOW" lines for
                                tests/ovn/replay-flows.sh --probes: the field alone (with the
                                flow's protocol shorthand, its prerequisite) and actions=drop;
                                the action alone after the flow's shorthand

A DUMP is the text of `ovs-ofctl -O OpenFlow15 --no-stats dump-flows br-int` (with or without
statistics: they are skipped). "-" reads standard input. Each table counts flows (a field
that occurs twice in one flow counts once for it), so the numbers read "how many of the N
installed flows use this".
"""

import collections
import json
import re
import sys

STAT_KEYS = {
    "cookie", "duration", "table", "n_packets", "n_bytes", "idle_age", "hard_age",
    "priority", "idle_timeout", "hard_timeout", "importance", "reset_counts",
    "send_flow_rem", "no_packet_counts", "no_byte_counts", "check_overlap",
}
# ovs-ofctl's protocol shorthands and what they stand for.
SHORTHANDS = {"ip", "ipv6", "icmp", "icmp6", "tcp", "tcp6", "udp", "udp6", "sctp", "sctp6",
              "arp", "rarp", "mpls", "mplsm"}


def split_top(s, sep=","):
    """Splits at `sep` outside parentheses and brackets."""
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur))
    return [x.strip() for x in out if x.strip()]


def field_name(tok):
    """reg0, ct_state, ... from 'reg0=0x1/0x1'; NXM names are given as OVS prints them."""
    name = tok.split("=", 1)[0]
    return name


def action_names(act):
    """The names under which one action is counted: its kind, and a detail where useful."""
    m = re.match(r"([a-z_0-9]+)", act)
    if not m:
        return [act]
    kind = m.group(1)
    names = [kind]
    rest = act[len(kind):]
    if kind in ("load", "set_field", "move"):
        # load:V->DST[..], set_field:V->DST, move:SRC[..]->DST[..]
        parts = rest[1:].split("->")
        if len(parts) == 2:
            dst = re.sub(r"\[.*", "", parts[1])
            if kind == "move":
                src = re.sub(r"\[.*", "", parts[0])
                names.append("move %s -> %s" % (src, dst))
            else:
                names.append("%s -> %s" % (kind, dst))
    elif kind == "output" and rest.startswith(":"):
        arg = rest[1:]
        names = ["output:FIELD" if re.search(r"[A-Za-z]", arg) and "[" in arg else "output:PORT"]
    elif kind == "resubmit":
        names.append("resubmit(port,table)" if not rest.startswith("(,") else "resubmit(,table)")
    elif kind == "ct":
        inner = rest[1:-1] if rest.startswith("(") else ""
        for opt in split_top(inner):
            o = re.match(r"[a-z_]+", opt)
            o = o.group(0) if o else opt
            if o == "zone":
                o = "zone=N" if re.fullmatch(r"zone=\d+", opt) else "zone=FIELD"
            if o == "exec":
                for sub in split_top(opt[5:-1]):
                    names.append("ct exec " + action_names(sub)[-1])
            names.append("ct " + o)
    elif kind == "controller":
        inner = rest[1:-1] if rest.startswith("(") else ""
        for opt in split_top(inner):
            names.append("controller " + opt.split("=", 1)[0])
    elif kind in ("learn", "conjunction", "check_pkt_larger", "group", "meter", "dec_ttl",
                  "ct_clear", "drop", "note", "push", "pop", "clone", "sample",
                  "multipath", "bundle", "set_queue", "write_metadata", "goto_table"):
        pass
    return names


def parse_flow(line):
    line = line.strip()
    if not line or "actions=" not in line or line.startswith(("NXST", "OFPST")):
        return None
    match, actions = line.split("actions=", 1)
    # ovs-ofctl separates the statistics from the match with ", " and puts a space
    # before the priority; the match itself has no spaces.
    toks = split_top(match.replace(" ", ","))
    table = "0"
    fields = []
    for t in toks:
        k = field_name(t)
        if k == "table":
            table = t.split("=", 1)[1]
        if k in STAT_KEYS:
            continue
        if "=" not in t and k in SHORTHANDS:
            fields.append("(" + k + ")")
        else:
            fields.append(k)
    acts = split_top(actions)
    return table, fields, acts


def tally_flows(paths):
    n = 0
    per_table = collections.Counter()
    fields = collections.Counter()
    actions = collections.Counter()
    details = collections.Counter()
    for p in paths:
        f = sys.stdin if p == "-" else open(p)
        for line in f:
            r = parse_flow(line)
            if not r:
                continue
            table, fl, acts = r
            n += 1
            per_table[table] += 1
            for k in set(fl):
                fields[k] += 1
            seen, seen_d = set(), set()
            for a in acts:
                names = action_names(a)
                seen.add(names[0])
                seen_d.update(names[1:])
            for a in seen:
                actions[a] += 1
            for a in seen_d:
                details[a] += 1
    print("%d flows in %d tables (%s)\n" % (
        n, len(per_table),
        ", ".join("%s: %d" % (t, c) for t, c in sorted(per_table.items(), key=lambda x: int(x[0])))))
    print("| match field | flows |\n|---|---|")
    for k, c in fields.most_common():
        print("| `%s` | %d |" % (k, c))
    print("\n| action | flows |\n|---|---|")
    for k, c in actions.most_common():
        print("| `%s` | %d |" % (k, c))
    if details:
        print("\n| action detail | flows |\n|---|---|")
        for k, c in sorted(details.items(), key=lambda x: (-x[1], x[0])):
            print("| `%s` | %d |" % (k, c))


def tally_msgs(paths):
    c = collections.Counter()
    versions = collections.Counter()
    errors = collections.Counter()
    conns = set()
    for p in paths:
        for line in open(p):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("type") in ("accepted", "closed", "connect-failed", "unparsed"):
                if r.get("type") == "accepted":
                    conns.add((p, r["conn"]))
                continue
            key = (r["dir"], r["type"], r.get("sub", ""), r.get("cmd", ""))
            c[key] += 1
            if r["type"] == "HELLO":
                versions[(r["dir"], r["ver"])] += 1
            if r["type"] == "ERROR":
                errors[(r["err"][0], r["err"][1], r.get("sub", ""))] += 1
    print("%d connections; HELLO versions: %s\n" % (
        len(conns), ", ".join("%s 0x%02x: %d" % (d, v, n) for (d, v), n in sorted(versions.items()))))
    print("| direction | message | detail | command | count |\n|---|---|---|---|---|")
    for (d, t, s, cmd), n in sorted(c.items()):
        print("| %s | %s | %s | %s | %d |" % (d, t, s, cmd, n))
    if errors:
        print("\n| ERROR type | code | answering | count |\n|---|---|---|---|")
        for (t, code, s), n in sorted(errors.items()):
            print("| %d | %d | %s | %d |" % (t, code, s, n))


JSONRPC = re.compile(r'\|jsonrpc\|DBG\|(\S+): (send|received) (request|reply|notification), '
                     r'method="([a-z_0-9]+)", params=(.*), id=(.*)$')


def tally_ovsdb(paths):
    writes = collections.Counter()
    ops = collections.Counter()
    reads = collections.defaultdict(set)
    for p in paths:
        for line in open(p, errors="replace"):
            m = JSONRPC.search(line.rstrip("\n"))
            if not m or not m.group(1).endswith("db.sock") or m.group(2) != "send":
                continue
            method = m.group(4)
            try:
                params = json.loads(m.group(5))
            except ValueError:
                continue
            if method == "transact":
                for op in params[1:]:
                    kind = op.get("op")
                    table = op.get("table", "")
                    ops[(kind, table)] += 1
                    for col in (op.get("row") or {}):
                        writes[(table, col, kind)] += 1
                    for mut in op.get("mutations") or []:
                        writes[(table, mut[0], "mutate " + mut[1])] += 1
            elif method.startswith("monitor"):
                reqs = params[2] if len(params) > 2 else {}
                for table, req in reqs.items():
                    for r in req if isinstance(req, list) else [req]:
                        cols = r.get("columns")
                        reads[table].update(cols if cols else ["(all)"])
    print("| operation | table | count |\n|---|---|---|")
    for (k, t), n in sorted(ops.items()):
        print("| %s | %s | %d |" % (k, t, n))
    print("\n| table | column | written by | count |\n|---|---|---|---|")
    for (t, col, k), n in sorted(writes.items()):
        print("| %s | `%s` | %s | %d |" % (t, col, k, n))
    print("\n| table | columns monitored |\n|---|---|")
    for t in sorted(reads):
        print("| %s | %s |" % (t, ", ".join("`%s`" % x for x in sorted(reads[t]))))


def action_key(act):
    """The name an action is probed under: ct by its set of options, the rest by detail."""
    names = action_names(act)
    if names[0] == "ct":
        opts = sorted(set(n[3:] for n in names[1:] if not n.startswith("ct exec ")))
        execs = sorted(set(n[8:] for n in names[1:] if n.startswith("ct exec ")))
        return "ct(%s)" % ",".join(opts + ["exec(%s)" % ",".join(execs)] if execs else opts)
    if names[0] in ("controller",):
        return "controller(%s)" % ",".join(sorted(n.split(" ", 1)[1] for n in names[1:]))
    return names[-1]


def probes(paths):
    seen = set()
    for p in paths:
        for line in open(p):
            r = parse_flow(line)
            if not r:
                continue
            table, fields, acts = r
            match = line.split("actions=", 1)[0].strip().replace(" ", ",")
            toks = [t for t in split_top(match) if field_name(t) not in STAT_KEYS]
            short = [t for t in toks if "=" not in t and t in SHORTHANDS]
            pre = ",".join(["table=%s" % table, "priority=1"] + short)
            for t in toks:
                k = field_name(t)
                if "=" not in t or ("field", k) in seen:
                    continue
                seen.add(("field", k))
                # Neighbour discovery fields need the ICMPv6 type and code too.
                extra = [x for x in toks if k.startswith("nd_") and
                         field_name(x) in ("icmp_type", "icmp_code", "icmpv6_type", "icmpv6_code")]
                print("field\t%s\t%s,%s actions=drop" % (k, ",".join([pre] + extra), t))
            for a in acts:
                k = action_key(a)
                if ("action", k) in seen:
                    continue
                seen.add(("action", k))
                print("action\t%s\t%s actions=%s" % (k, pre, a))


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("flows", "msgs", "ovsdb", "probes"):
        sys.exit(__doc__.strip())
    {"flows": tally_flows, "msgs": tally_msgs, "ovsdb": tally_ovsdb,
     "probes": probes}[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
