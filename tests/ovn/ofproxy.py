#!/usr/bin/env python3
"""An OpenFlow tap between ovn-controller and the switch's management socket.

    ofproxy.py LISTEN_PATH TARGET_PATH LOG_FILE

Listens on the unix socket LISTEN_PATH; every connection accepted is relayed, byte for byte,
to a new connection to TARGET_PATH (the switch's BRIDGE.mgmt). Both directions are cut into
OpenFlow messages (8-byte header: version, type, length, xid) and each message becomes one
JSON line in LOG_FILE:

    {"t": 1.234, "conn": 2, "dir": "to-switch"|"to-controller", "ver": 6, "type": "FLOW_MOD",
     "len": 96, "xid": 17, ...}

with, where it applies: "sub" (the Nicira/ONF subtype, the multipart type, the message inside
a BUNDLE_ADD_MESSAGE), "cmd" (FLOW_MOD/GROUP_MOD command), "table" (FLOW_MOD table id),
"err" ([type, code] of an ERROR and the type of the message it answers).

ovn-controller finds the switch at unix:$OVS_RUNDIR/BRIDGE.mgmt, so tests/ovn/lab.sh runs it
with OVS_RUNDIR set to the directory of LISTEN_PATH. The relay does not change a byte; it only
reads. It is a test tool: one thread per direction, no limits beyond the lab's few connections.
Parsing never stops the relay: a stream that does not parse as OpenFlow is logged once
("unparsed") and relayed on.
"""

import json
import os
import socket
import struct
import sys
import threading
import time

TYPES = {
    0: "HELLO", 1: "ERROR", 2: "ECHO_REQUEST", 3: "ECHO_REPLY", 4: "EXPERIMENTER",
    5: "FEATURES_REQUEST", 6: "FEATURES_REPLY", 7: "GET_CONFIG_REQUEST",
    8: "GET_CONFIG_REPLY", 9: "SET_CONFIG", 10: "PACKET_IN", 11: "FLOW_REMOVED",
    12: "PORT_STATUS", 13: "PACKET_OUT", 14: "FLOW_MOD", 15: "GROUP_MOD", 16: "PORT_MOD",
    17: "TABLE_MOD", 18: "MULTIPART_REQUEST", 19: "MULTIPART_REPLY", 20: "BARRIER_REQUEST",
    21: "BARRIER_REPLY", 22: "QUEUE_GET_CONFIG_REQUEST", 23: "QUEUE_GET_CONFIG_REPLY",
    24: "ROLE_REQUEST", 25: "ROLE_REPLY", 26: "GET_ASYNC_REQUEST", 27: "GET_ASYNC_REPLY",
    28: "SET_ASYNC", 29: "METER_MOD", 30: "ROLE_STATUS", 31: "TABLE_STATUS",
    32: "REQUESTFORWARD", 33: "BUNDLE_CONTROL", 34: "BUNDLE_ADD_MESSAGE",
    35: "CONTROLLER_STATUS",
}
# Nicira extension subtypes (vendor 0x00002320), OVS include/openvswitch/ofp-msgs.h.
NXT = {
    10: "NXT_ROLE_REQUEST", 11: "NXT_ROLE_REPLY", 12: "NXT_SET_FLOW_FORMAT",
    13: "NXT_FLOW_MOD", 14: "NXT_FLOW_REMOVED", 15: "NXT_FLOW_MOD_TABLE_ID",
    16: "NXT_SET_PACKET_IN_FORMAT", 17: "NXT_PACKET_IN", 18: "NXT_FLOW_AGE",
    19: "NXT_SET_ASYNC_CONFIG", 20: "NXT_SET_CONTROLLER_ID", 21: "NXT_FLOW_MONITOR_CANCEL",
    22: "NXT_FLOW_MONITOR_PAUSED", 23: "NXT_FLOW_MONITOR_RESUMED", 24: "NXT_TLV_TABLE_MOD",
    25: "NXT_TLV_TABLE_REQUEST", 26: "NXT_TLV_TABLE_REPLY", 27: "NXT_SET_ASYNC_CONFIG2",
    28: "NXT_RESUME", 29: "NXT_CT_FLUSH_ZONE", 30: "NXT_PACKET_IN2", 31: "NXT_GROUP_MOD",
    32: "NXT_CT_FLUSH",
}
MULTIPART = {
    0: "DESC", 1: "FLOW", 2: "AGGREGATE", 3: "TABLE", 4: "PORT_STATS", 5: "QUEUE_STATS",
    6: "GROUP", 7: "GROUP_DESC", 8: "GROUP_FEATURES", 9: "METER", 10: "METER_CONFIG",
    11: "METER_FEATURES", 12: "TABLE_FEATURES", 13: "PORT_DESC", 14: "TABLE_DESC",
    15: "QUEUE_DESC", 16: "FLOW_MONITOR", 0xFFFF: "EXPERIMENTER",
}
FLOW_MOD_CMD = {0: "ADD", 1: "MODIFY", 2: "MODIFY_STRICT", 3: "DELETE", 4: "DELETE_STRICT"}
GROUP_MOD_CMD = {0: "ADD", 1: "MODIFY", 2: "DELETE", 3: "INSERT_BUCKET", 5: "REMOVE_BUCKET"}
BUNDLE_CTRL = {0: "OPEN_REQUEST", 1: "OPEN_REPLY", 2: "CLOSE_REQUEST", 3: "CLOSE_REPLY",
               4: "COMMIT_REQUEST", 5: "COMMIT_REPLY", 6: "DISCARD_REQUEST",
               7: "DISCARD_REPLY"}
NICIRA = 0x00002320


def describe(msg):
    """One message's log fields (msg: the whole message, header included)."""
    ver, typ, length, xid = struct.unpack_from("!BBHI", msg)
    d = {"ver": ver, "type": TYPES.get(typ, "TYPE_%d" % typ), "len": length, "xid": xid}
    body = msg[8:]
    if typ == 4 and len(body) >= 8:
        vendor, sub = struct.unpack_from("!II", body)
        d["sub"] = NXT.get(sub, "NXT_%d" % sub) if vendor == NICIRA else "0x%08x/%d" % (vendor, sub)
    elif typ in (18, 19) and len(body) >= 2:
        (mp,) = struct.unpack_from("!H", body)
        d["sub"] = MULTIPART.get(mp, "MP_%d" % mp)
    elif typ == 14 and len(body) >= 18:
        # ofp11_flow_mod: cookie, cookie_mask (16), table_id, command.
        d["table"], cmd = body[16], body[17]
        d["cmd"] = FLOW_MOD_CMD.get(cmd, str(cmd))
    elif typ == 15 and len(body) >= 2:
        (cmd,) = struct.unpack_from("!H", body)
        d["cmd"] = GROUP_MOD_CMD.get(cmd, str(cmd))
    elif typ == 33 and len(body) >= 6:
        d["cmd"] = BUNDLE_CTRL.get(struct.unpack_from("!H", body, 4)[0], "?")
    elif typ == 34 and len(body) >= 16:
        inner = describe(body[8:])
        d["sub"] = inner["type"] + ("/" + inner["sub"] if "sub" in inner else "")
        for k in ("cmd", "table"):
            if k in inner:
                d[k] = inner[k]
    elif typ == 1 and len(body) >= 4:
        etype, code = struct.unpack_from("!HH", body)
        d["err"] = [etype, code]
        if etype == 0:
            # OFPET_HELLO_FAILED carries text, not the message it answers.
            d["sub"] = "HELLO_FAILED: " + body[4:68].decode("ascii", "replace").strip("\x00")
        elif len(body) >= 12:
            inner = describe(body[4:])
            d["sub"] = inner["type"] + ("/" + inner["sub"] if "sub" in inner else "")
    return d


class Log:
    def __init__(self, path):
        self.f = open(path, "a", buffering=1)
        self.lock = threading.Lock()
        self.t0 = time.monotonic()

    def write(self, rec):
        rec["t"] = round(time.monotonic() - self.t0, 4)
        with self.lock:
            self.f.write(json.dumps(rec, sort_keys=True) + "\n")


def pump(src, dst, log, conn, direction):
    buf = b""
    parsing = True
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
            if not parsing:
                continue
            buf += data
            while len(buf) >= 8:
                (length,) = struct.unpack_from("!H", buf, 2)
                if length < 8:
                    log.write({"conn": conn, "dir": direction, "type": "unparsed",
                               "head": buf[:16].hex()})
                    parsing, buf = False, b""
                    break
                if len(buf) < length:
                    break
                msg, buf = buf[:length], buf[length:]
                rec = describe(msg)
                rec.update(conn=conn, dir=direction)
                log.write(rec)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        log.write({"conn": conn, "dir": direction, "type": "closed"})


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    listen, target, logpath = sys.argv[1:]
    log = Log(logpath)
    try:
        os.unlink(listen)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(listen)
    srv.listen(16)
    n = 0
    while True:
        c, _ = srv.accept()
        n += 1
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(target)
        except OSError as e:
            log.write({"conn": n, "type": "connect-failed", "error": str(e)})
            c.close()
            continue
        log.write({"conn": n, "type": "accepted"})
        for a, b, d in ((c, s, "to-switch"), (s, c, "to-controller")):
            threading.Thread(target=pump, args=(a, b, log, n, d), daemon=True).start()


if __name__ == "__main__":
    main()
