#!/usr/bin/env python3
"""A controller that resumes continuations, as OVN's pinctrl does (standard library only).

resume.py SOCK OTHER_SOCK NEW_PACKET_HEX

Connects to SOCK with OpenFlow 1.5, asks for NXT_PACKET_IN2 (NXT_SET_PACKET_IN_FORMAT) and
packet-ins (SET_CONFIG miss_send_len=0xffff), prints "ready", waits for one NXT_PACKET_IN2
and prints it as JSON (packet, userdata, metadata, continuation in hex). Then it sends
NXT_RESUMEs, each with its own xid, and prints the ERROR each got (or none):

  1 stale     the continuation with one byte of its bridge token changed
  2 truncated the continuation cut by 3 bytes
  3 badaction the continuation plus an NXCPT_ACTIONS whose action type does not exist
  4 huge      the continuation plus 600 empty NXCPT_ACTIONS (more frames than resubmits make)
  5 nocont    no continuation at all
  6 other     the good continuation sent to OTHER_SOCK (another bridge)
  7 good      the continuation unchanged, the packet replaced by NEW_PACKET_HEX (the
              rewrite pinctrl does: the DHCP reply)
"""

import json
import socket
import struct
import sys
import time

NX = 0x00002320
OFPT_ERROR, OFPT_EXPERIMENTER, OFPT_SET_CONFIG = 1, 4, 9
NXT_RESUME, NXT_PACKET_IN2, NXT_SET_PACKET_IN_FORMAT = 28, 30, 16
PINT_PACKET, PINT_METADATA, PINT_USERDATA, PINT_CONTINUATION = 0, 6, 7, 8
V15 = 6


def msg(ty, body, xid=0):
    return struct.pack("!BBHI", V15, ty, 8 + len(body), xid) + body


def nx(subtype, body, xid=0):
    return msg(OFPT_EXPERIMENTER, struct.pack("!II", NX, subtype) + body, xid)


def prop(ty, value, nested=False):
    if nested:
        value = b"\0" * 4 + value
    p = struct.pack("!HH", ty, 4 + len(value)) + value
    return p + b"\0" * ((8 - len(p) % 8) % 8)


def props(buf):
    out = []
    while len(buf) >= 4:
        ty, ln = struct.unpack("!HH", buf[:4])
        out.append((ty, buf[4:ln]))
        buf = buf[(ln + 7) & ~7:]
    return out


class Conn:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.buf = b""
        self.s.sendall(msg(0, b""))

    def recv(self, timeout):
        end = time.time() + timeout
        while True:
            if len(self.buf) >= 8:
                ln = struct.unpack("!H", self.buf[2:4])[0]
                if len(self.buf) >= ln:
                    m, self.buf = self.buf[:ln], self.buf[ln:]
                    return m
            left = end - time.time()
            if left <= 0:
                return None
            self.s.settimeout(left)
            try:
                d = self.s.recv(65536)
            except socket.timeout:
                return None
            if not d:
                return None
            self.buf += d

    def errors(self, timeout):
        """xid -> (type, code) of every ERROR within `timeout`."""
        out = {}
        end = time.time() + timeout
        while True:
            m = self.recv(max(0.0, end - time.time()))
            if m is None:
                return out
            if m[1] == OFPT_ERROR:
                xid = struct.unpack("!I", m[4:8])[0]
                out[xid] = list(struct.unpack("!HH", m[8:12]))


def main():
    sock, other, new_packet = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
    c = Conn(sock)
    c.s.sendall(nx(NXT_SET_PACKET_IN_FORMAT, struct.pack("!I", 2)))
    c.s.sendall(msg(OFPT_SET_CONFIG, struct.pack("!HH", 0, 0xFFFF)))
    print("ready", flush=True)
    pin = None
    end = time.time() + 15
    while pin is None and time.time() < end:
        m = c.recv(end - time.time())
        if m is None:
            break
        if m[1] == OFPT_EXPERIMENTER and struct.unpack("!II", m[8:16]) == (NX, NXT_PACKET_IN2):
            pin = m[16:]
    if pin is None:
        print(json.dumps({"error": "no NXT_PACKET_IN2"}), flush=True)
        return
    ps = props(pin)
    d = {ty: v for ty, v in ps}
    cont = d.get(PINT_CONTINUATION, b"")[4:]
    print(json.dumps({
        "packet": d.get(PINT_PACKET, b"").hex(),
        "userdata": d.get(PINT_USERDATA, b"").hex(),
        "metadata": d.get(PINT_METADATA, b"").hex(),
        "continuation": cont.hex(),
    }), flush=True)

    # The resume: the packet-in's properties, the continuation last (as OVS's
    # ofputil_encode_resume), with the packet and the continuation as given.
    def resume(packet, continuation, xid):
        body = prop(PINT_PACKET, packet)
        for ty, v in ps:
            if ty not in (PINT_PACKET, PINT_CONTINUATION, PINT_USERDATA):
                body += prop(ty, v)
        if continuation is not None:
            body += prop(PINT_CONTINUATION, continuation, nested=True)
        return nx(NXT_RESUME, body, xid)

    packet = d[PINT_PACKET]
    stale = bytearray(cont)
    stale[9] ^= 0xFF  # a nonce byte of NXCPT_BRIDGE
    bad_action = prop(0x8006, struct.pack("!HH", 0x63, 8) + b"\0" * 4, nested=True)
    huge = cont + prop(0x8006, b"", nested=True) * 600
    c.s.sendall(resume(packet, bytes(stale), 1))
    c.s.sendall(resume(packet, cont[:-3], 2))
    c.s.sendall(resume(packet, cont + bad_action, 3))
    c.s.sendall(resume(packet, huge, 4))
    c.s.sendall(resume(packet, None, 5))
    errs = c.errors(1.0)
    o = Conn(other)
    o.s.sendall(resume(packet, cont, 6))
    errs.update(o.errors(1.0))
    c.s.sendall(resume(new_packet, cont, 7))
    errs.update(c.errors(1.0))
    print(json.dumps({"errors": errs}), flush=True)


main()
