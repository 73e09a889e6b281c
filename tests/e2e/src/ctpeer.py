"""TCP/UDP peers for the conntrack end-to-end tests (tests/conntrack.rs), run inside network
namespaces with `ip netns exec NS python3 ctpeer.py MODE ARGS...`. Each mode prints one JSON
line (its result) on stdout; control between processes goes through files in a run directory
(both namespaces share the file system).

  hold-server PORT COUNT DIR SECS   accept COUNT connections (each: "hello I" -> "ok hello I"),
                                    wait for DIR/go, then push "push I" on each and read
                                    "pong I" back within SECS
  hold-client HOST PORT COUNT DIR SECS
                                    open COUNT connections (source ports in order), say hello
                                    on each, touch DIR/ready, wait for DIR/go, answer each push
  name-server NAME PORT             every connection: send "NAME\\n", then echo until closed
  name-client HOST PORT COUNT SPORT open COUNT connections from source ports SPORT, SPORT+1,
                                    ...: read the server's name, stream 256 KiB through it
  connect HOST PORT SECS            one TCP connect: connected, refused or timeout
  udp-rel HOST PORT SECS            a datagram to a closed port: refused (the ICMP error came
                                    back) or timeout
"""

import json
import os
import resource
import socket
import socketserver
import sys
import time

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def recv_line(s, deadline):
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.time()
        if left <= 0:
            raise TimeoutError("timed out")
        s.settimeout(left)
        b = s.recv(256)
        if not b:
            raise ConnectionError("closed by the peer")
        buf += b
    return buf.decode().strip()


def wait_file(path, secs):
    t = time.time()
    while not os.path.exists(path):
        if time.time() - t > secs:
            raise TimeoutError("no " + path)
        time.sleep(0.05)


def touch(path):
    open(path, "w").close()


def count_error(errors, e):
    k = type(e).__name__
    errors[k] = errors.get(k, 0) + 1


def hold_server(port, count, d, secs):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(4096)
    touch(os.path.join(d, "listening"))
    conns = {}
    errors = {}
    ls.settimeout(60)
    try:
        while len(conns) < count:
            c, _ = ls.accept()
            line = recv_line(c, time.time() + 10)
            c.sendall(("ok " + line + "\n").encode())
            conns[int(line.split()[1])] = c
    except Exception as e:
        count_error(errors, e)
    wait_file(os.path.join(d, "go"), 600)
    pushed = 0
    for i, c in conns.items():
        try:
            c.sendall(b"push %d\n" % i)
            pushed += 1
        except Exception as e:
            count_error(errors, e)
    deadline = time.time() + secs
    pong = 0
    for i, c in conns.items():
        try:
            if recv_line(c, deadline) == "pong %d" % i:
                pong += 1
        except Exception as e:
            count_error(errors, e)
    print(json.dumps({"accepted": len(conns), "pushed": pushed, "pong": pong, "errors": errors}))


def hold_client(host, port, count, d, secs):
    conns = []
    errors = {}
    for i in range(count):
        try:
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"hello %d\n" % i)
            if recv_line(s, time.time() + 5) != "ok hello %d" % i:
                raise ValueError("bad answer")
            conns.append(s)
        except Exception as e:
            count_error(errors, e)
            break
    hello = len(conns)
    touch(os.path.join(d, "ready"))
    wait_file(os.path.join(d, "go"), 600)
    deadline = time.time() + secs
    push = 0
    for i, s in enumerate(conns):
        try:
            if recv_line(s, deadline) != "push %d" % i:
                raise ValueError("bad push")
            s.sendall(b"pong %d\n" % i)
            push += 1
        except Exception as e:
            count_error(errors, e)
    # Let the last pongs leave before the sockets close.
    time.sleep(1)
    print(json.dumps({"hello": hello, "push": push, "errors": errors}))


def name_server(name, port):
    class H(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.sendall((name + "\n").encode())
            while True:
                b = self.request.recv(65536)
                if not b:
                    return
                self.request.sendall(b)

    socketserver.ThreadingTCPServer.allow_reuse_address = True
    socketserver.ThreadingTCPServer.daemon_threads = True
    with socketserver.ThreadingTCPServer(("0.0.0.0", port), H) as srv:
        srv.serve_forever()


def name_client(host, port, count, sport):
    out = []
    chunk = bytes(range(256)) * 64
    for i in range(count):
        r = {"sport": sport + i}
        try:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", sport + i))
            s.settimeout(5)
            s.connect((host, port))
            deadline = time.time() + 20
            r["name"] = recv_line(s, deadline)
            got = 0
            for _ in range(16):
                s.sendall(chunk)
                want = len(chunk)
                buf = b""
                while len(buf) < want:
                    s.settimeout(max(0.01, deadline - time.time()))
                    b = s.recv(want - len(buf))
                    if not b:
                        raise ConnectionError("closed by the peer")
                    buf += b
                if buf != chunk:
                    raise ValueError("echo differs")
                got += len(buf)
            r["bytes"] = got
            s.close()
        except Exception as e:
            r["error"] = type(e).__name__ + ": " + str(e)
        out.append(r)
    print(json.dumps(out))


def connect(host, port, secs):
    s = socket.socket()
    s.settimeout(secs)
    try:
        s.connect((host, port))
        r = "connected"
    except ConnectionRefusedError:
        r = "refused"
    except (TimeoutError, socket.timeout):
        r = "timeout"
    except OSError as e:
        r = "error: " + str(e)
    print(json.dumps({"result": r}))


def udp_rel(host, port, secs):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((host, port))
    s.settimeout(secs)
    try:
        s.send(b"anyone there?")
        s.recv(100)
        r = "answered"
    except ConnectionRefusedError:
        r = "refused"
    except (TimeoutError, socket.timeout):
        r = "timeout"
    print(json.dumps({"result": r}))


def main():
    a = sys.argv[1:]
    m = a[0]
    if m == "hold-server":
        hold_server(int(a[1]), int(a[2]), a[3], float(a[4]))
    elif m == "hold-client":
        hold_client(a[1], int(a[2]), int(a[3]), a[4], float(a[5]))
    elif m == "name-server":
        name_server(a[1], int(a[2]))
    elif m == "name-client":
        name_client(a[1], int(a[2]), int(a[3]), int(a[4]))
    elif m == "connect":
        connect(a[1], int(a[2]), float(a[3]))
    elif m == "udp-rel":
        udp_rel(a[1], int(a[2]), float(a[3]))
    else:
        sys.exit("unknown mode " + m)


main()
