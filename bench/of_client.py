#!/usr/bin/env python3
"""A minimal OpenFlow 1.3 client for bench/openflow.sh: what it measures, it measures the
same way on every switch (ferrovs and OVS), over the switch's management socket.

  of_client.py flowmods SOCKET N BATCH   add N rules (FLOW_MOD add, ipv4 nw_dst per rule) with a
                                         BARRIER after every BATCH of them, then delete them all
                                         (one FLOW_MOD delete + barrier); prints JSON seconds
  of_client.py packetin SOCKET SECONDS WINDOW
                                         PACKET_OUT (in_port CONTROLLER, output TABLE) of a UDP
                                         frame that the switch's table-miss rule sends back as a
                                         PACKET_IN: first one at a time (round-trip latency),
                                         then WINDOW outstanding (rate); prints JSON

Encoding is done before the clock starts: the switch's work is what is timed, not Python's.
This is our own client (no controller framework measures this); the traffic it makes is the
same bytes for both switches.
"""
import json
import socket
import struct
import sys
import time

V = 4  # OpenFlow 1.3
HELLO, ERROR, ECHO_REQ, ECHO_REP = 0, 1, 2, 3
SET_CONFIG, PACKET_IN, PACKET_OUT, FLOW_MOD = 9, 10, 13, 14
BARRIER_REQ, BARRIER_REP = 20, 21
OFPP_TABLE, OFPP_CONTROLLER, OFPP_ANY = 0xFFFFFFF9, 0xFFFFFFFD, 0xFFFFFFFF
OFPG_ANY = 0xFFFFFFFF


def msg(type_, body=b"", xid=0):
    return struct.pack("!BBHI", V, type_, 8 + len(body), xid) + body


def oxm(field, value):
    return struct.pack("!I", (0x8000 << 16) | (field << 9) | len(value)) + value


def match(*oxms):
    body = b"".join(oxms)
    m = struct.pack("!HH", 1, 4 + len(body)) + body
    return m + b"\0" * (-len(m) % 8)


def flow_mod(command, priority, m, instructions=b"", xid=0, table=0):
    body = struct.pack(
        "!QQBBHHHIIIH2x", 0, 0, table, command, 0, 0, priority, 0xFFFFFFFF, OFPP_ANY, OFPG_ANY, 0
    )
    return msg(FLOW_MOD, body + m + instructions, xid)


def apply_output(port, max_len=0xFFFF):
    action = struct.pack("!HHIH6x", 0, 16, port, max_len)
    return struct.pack("!HH4x", 4, 8 + len(action)) + action


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.buf = b""
        self.s.sendall(msg(HELLO, struct.pack("!HHI", 1, 8, 1 << V), xid=1))
        t, _, _ = self.recv()
        if t != HELLO:
            raise SystemExit(f"expected HELLO, got type {t}")

    def recv(self, timeout=None):
        """One message (type, xid, body); None on timeout. Answers echo requests."""
        self.s.settimeout(timeout)
        while True:
            if len(self.buf) >= 8:
                _, t, n, xid = struct.unpack("!BBHI", self.buf[:8])
                if len(self.buf) >= n:
                    body, self.buf = self.buf[8:n], self.buf[n:]
                    if t == ECHO_REQ:
                        self.s.sendall(msg(ECHO_REP, body, xid))
                        continue
                    if t == ERROR:
                        et, code = struct.unpack("!HH", body[:4])
                        raise SystemExit(f"switch sent ERROR type {et} code {code}")
                    return t, xid, body
            try:
                d = self.s.recv(1 << 20)
            except socket.timeout:
                return None
            if not d:
                raise SystemExit("switch closed the connection")
            self.buf += d

    def count(self, type_, timeout=None):
        """Reads what is there (waiting up to `timeout` for something) and counts the whole
        messages of `type_` in it by their headers; None on timeout. Other messages are
        skipped, except that an ERROR ends the run and an echo request is answered."""
        self.s.settimeout(timeout)
        try:
            d = self.s.recv(1 << 20)
        except socket.timeout:
            return None
        if not d:
            raise SystemExit("switch closed the connection")
        buf = self.buf + d
        k, at = 0, 0
        while len(buf) - at >= 8:
            _, t, n, xid = struct.unpack_from("!BBHI", buf, at)
            if n < 8 or len(buf) - at < n:
                break
            if t == type_:
                k += 1
            elif t == ECHO_REQ:
                self.s.sendall(msg(ECHO_REP, buf[at + 8:at + n], xid))
            elif t == ERROR:
                et, code = struct.unpack_from("!HH", buf, at + 8)
                raise SystemExit(f"switch sent ERROR type {et} code {code}")
            at += n
        self.buf = buf[at:]
        return k

    def wait(self, type_, xid=None, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"no message of type {type_} within {timeout} s")
            r = self.recv(left)
            if r and r[0] == type_ and (xid is None or r[1] == xid):
                return r


def flowmods(path, n, batch):
    c = Conn(path)
    eth_ip = oxm(5, struct.pack("!H", 0x0800))
    ins = apply_output(1)
    chunks, cur = [], []
    for i in range(n):
        dst = struct.pack("!I", 0x0A000000 + i + 1)
        cur.append(flow_mod(0, 100, match(eth_ip, oxm(12, dst)), ins, xid=i + 10))
        if len(cur) == batch or i == n - 1:
            cur.append(msg(BARRIER_REQ, xid=0x70000000 + len(chunks)))
            chunks.append(b"".join(cur))
            cur = []
    t0 = time.monotonic()
    for k, chunk in enumerate(chunks):
        c.s.sendall(chunk)
        c.wait(BARRIER_REP, 0x70000000 + k)
    add_s = time.monotonic() - t0
    t0 = time.monotonic()
    c.s.sendall(flow_mod(3, 0, match(eth_ip), xid=5) + msg(BARRIER_REQ, xid=6))
    c.wait(BARRIER_REP, 6)
    del_s = time.monotonic() - t0
    print(json.dumps({"rules": n, "batch": batch, "add_s": round(add_s, 4),
                      "flow_mods_per_s": round(n / add_s), "delete_all_s": round(del_s, 4)}))


def frame(i):
    eth = bytes.fromhex("020000000002" "020000000001" "0800")
    payload = struct.pack("!I", i) + b"\0" * 14
    udp = struct.pack("!HHHH", 1000, 2000, 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                     bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]))
    return eth + ip + udp


def packet_out(i):
    action = struct.pack("!HHIH6x", 0, 16, OFPP_TABLE, 0)
    body = struct.pack("!IIH6x", 0xFFFFFFFF, OFPP_CONTROLLER, len(action)) + action + frame(i)
    return msg(PACKET_OUT, body, xid=i)


def seq_of(body):
    """The sequence number a PACKET_IN carries (the frame's first UDP payload word)."""
    mlen = struct.unpack("!H", body[18:20])[0]
    data = body[16 + mlen + (-mlen % 8) + 2:]
    return struct.unpack("!I", data[42:46])[0]


def packetin(path, seconds, window):
    c = Conn(path)
    # A service connection gets packet-ins once it set a miss_send_len (as ovs-ofctl monitor).
    c.s.sendall(msg(SET_CONFIG, struct.pack("!HH", 0, 0xFFFF), xid=2))
    # Table miss → controller (the rule any reactive controller installs first).
    c.s.sendall(flow_mod(0, 0, match(), apply_output(OFPP_CONTROLLER), xid=3)
                + msg(BARRIER_REQ, xid=4))
    c.wait(BARRIER_REP, 4)
    outs = [packet_out(i) for i in range(200000)]
    # Latency: one outstanding.
    rtts, lost, i = [], 0, 0
    end = time.monotonic() + seconds / 2
    while time.monotonic() < end and i < len(outs):
        t0 = time.monotonic()
        c.s.sendall(outs[i])
        while True:
            r = c.recv(1.0)
            if r is None:
                lost += 1
                break
            if r[0] == PACKET_IN and seq_of(r[2]) == i:
                rtts.append(time.monotonic() - t0)
                break
        i += 1
    rtts.sort()
    pct = (lambda q: round(rtts[min(len(rtts) - 1, int(q * len(rtts)))] * 1e6, 1)) if rtts else (lambda q: None)
    # Rate: WINDOW outstanding; a packet-in that does not come back within 1 s is lost. The
    # client must not be what is measured: it refills the window in one write and counts
    # packet-ins from each read by their headers only.
    got, sent, base = 0, 0, i
    inflight = 0
    t0 = time.monotonic()
    end = t0 + seconds / 2
    while time.monotonic() < end:
        n = window - inflight
        if n > 0:
            # The frames cycle through the prebuilt list (their numbers matter only above).
            at = (base + sent) % (len(outs) - window)
            c.s.sendall(b"".join(outs[at:at + n]))
            sent += n
            inflight += n
        k = c.count(PACKET_IN, 1.0)
        if k is None:
            inflight = 0  # lost: start a new window
            continue
        got += k
        inflight -= k
    el = time.monotonic() - t0
    print(json.dumps({"latency_us_p50": pct(0.5), "latency_us_p99": pct(0.99), "samples": len(rtts),
                      "lost_sequential": lost, "window": window, "packet_ins_per_s": round(got / el),
                      "sent": sent, "received": got}))


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "flowmods":
        flowmods(path, int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "packetin":
        packetin(path, float(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown mode {mode}")
