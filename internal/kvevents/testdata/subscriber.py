#!/usr/bin/python3
"""A KV event subscriber that is not kvroute's code: libzmq (pyzmq) and
msgpack, reading vLLM's framing.

usage: subscriber.py PUB_ENDPOINT REPLAY_ENDPOINT TOPIC

It prints one JSON line per message received on a SUB socket:
{"seq": n, "topic": "...", "batch": <the payload as msgpack decodes it,
bytes as {"bytes": hex}>}. A line "replay N" on stdin asks the replay
socket (a DEALER, as vLLM's ROUTER expects an empty delimiter) for the
batches from N and prints {"replayed": n, "batch": ...} for each, then
{"replay_end": true}. It exits when stdin closes or after 20 s of silence.
"""
import json
import sys

import msgpack
import zmq


def plain(v):
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    return v


def main():
    pub_ep, replay_ep, topic = sys.argv[1], sys.argv[2], sys.argv[3]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(pub_ep)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    while True:
        ready = dict(poller.poll(20000))
        if not ready:
            break
        if sub in ready:
            t, seq, payload = sub.recv_multipart()
            out = {"seq": int.from_bytes(seq, "big"), "topic": t.decode(),
                   "batch": plain(msgpack.unpackb(payload))}
            print(json.dumps(out), flush=True)
        if sys.stdin.fileno() in ready:
            line = sys.stdin.readline()
            if not line:
                break
            first = int(line.split()[1])
            dealer = ctx.socket(zmq.DEALER)
            dealer.connect(replay_ep)
            dealer.send_multipart([b"", first.to_bytes(8, "big")])
            while True:
                if not dealer.poll(5000):
                    print(json.dumps({"replay_timeout": True}), flush=True)
                    break
                _, seq, payload = dealer.recv_multipart()
                n = int.from_bytes(seq, "big", signed=True)
                if n == -1:
                    print(json.dumps({"replay_end": True}), flush=True)
                    break
                print(json.dumps({"replayed": n, "batch": plain(msgpack.unpackb(payload))}), flush=True)
            dealer.close(linger=0)


if __name__ == "__main__":
    main()
