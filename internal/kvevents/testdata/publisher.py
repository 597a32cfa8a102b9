#!/usr/bin/python3
"""A KV event publisher that is not kvroute's code: libzmq (pyzmq) and
msgpack, framed as vLLM's ZmqEventPublisher frames its messages.

usage: publisher.py PUB_ENDPOINT REPLAY_ENDPOINT TOPIC

It binds an XPUB socket (a PUB that sees subscriptions) and a ROUTER for
replays, prints "ready PUB_ADDRESS REPLAY_ADDRESS" (the endpoints as bound,
so that port * works), waits for one subscription, then publishes the
script below as [topic, seq (8 bytes big-endian), payload]; the batch with
sequence number 3 goes only to the replay buffer, so the subscriber sees a
gap. It serves replay requests, as vLLM does, until stdin closes.
"""
import sys

import msgpack
import zmq

H = bytes(range(32))

SCRIPT = [
    # 0: current events (maps with "type") in a positional batch; an
    # unsigned 64-bit and a negative hash; extra keys; an unknown field.
    [1.5, [{"type": "BlockStored", "block_hashes": [2**64 - 1, -5], "parent_block_hash": None,
            "token_ids": list(range(32)), "block_size": 16, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": [["salt"], None], "group_idx": 0}], 0],
    # 1: legacy events (positional, tag first) with a sha256-style bytes hash.
    [2.5, [["BlockStored", [H], 7, list(range(16)), 16, None, "GPU", "adapter"],
           ["BlockRemoved", [H], "GPU"]], 0],
    # 2: a map-shaped batch.
    {"ts": 3.5, "events": [{"type": "BlockRemoved", "block_hashes": [-5], "medium": "GPU", "future": 1}],
     "data_parallel_rank": None},
    # 3: not sent on the PUB socket: only replay has it (SGLang's short
    # BlockRemoved).
    [4.5, [["BlockRemoved", [9]]]],
    # 4: SGLang's legacy BlockStored (stops after lora_id) and a clear.
    [5.5, [["BlockStored", [11], None, [1, 2], 2, None], ["AllBlocksCleared"]]],
    # 5: not a batch at all.
    b"\xc1 not msgpack",
    # 6: empty.
    [6.5, [], 0],
]


def main():
    pub_ep, replay_ep, topic = sys.argv[1], sys.argv[2], sys.argv[3].encode()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.bind(pub_ep)
    router = ctx.socket(zmq.ROUTER)
    router.bind(replay_ep)
    print("ready", pub.getsockopt_string(zmq.LAST_ENDPOINT), router.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    pub.recv()  # a subscription message
    buffered = []
    for seq, batch in enumerate(SCRIPT):
        payload = batch if isinstance(batch, bytes) else msgpack.packb(batch)
        buffered.append((seq, payload))
        if seq != 3:
            pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
    print("published", flush=True)
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    while True:
        ready = dict(poller.poll(10000))
        if not ready:
            break
        if sys.stdin.fileno() in ready and not sys.stdin.readline():
            break
        if router in ready:
            frames = router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in buffered:
                if seq >= first:
                    router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            router.send_multipart([client, b"", (-1).to_bytes(8, "big", signed=True), b""])
            print("replayed from %d" % first, flush=True)


if __name__ == "__main__":
    main()
