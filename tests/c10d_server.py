#!/usr/bin/env python3
# SPDX-License-Identifier: MIT (see LICENSE)
"""tests/c10d_server.py — a real torch.distributed.TCPStore server for tests/test_c10d_store.c.

Starts TCPStore(is_master=True) on 127.0.0.1 and a free port, prints "port N torch VERSION" and
then answers one command per line on stdin, one line each on stdout, through its own Python
client (so every value the C client sees was really stored by PyTorch, and the other way):

    set KEY HEX           -> ok               store.set(KEY, bytes)
    get KEY               -> HEX              store.get(KEY) (waits for the key, as torch does)
    add KEY N             -> the new value    store.add(KEY, N)
    cas KEY HEXEXP HEXNEW -> HEX              store.compare_set(KEY, expected, desired)
    check KEY             -> 1 or 0           store.check([KEY]) (1.13: see check() below)
    delete KEY            -> 1 or 0           store.delete_key(KEY)
    setlater MS KEY HEX   -> ok               sets KEY MS milliseconds later, from another thread
                                              and another client connection

HEX "-" is the empty value. It exits when stdin closes (or on "quit"). Keys are whatever the
C side uses, without torch's "/" (the Python client adds it, as the C client does).
"""
import datetime
import sys
import threading
import time

import torch
import torch.distributed as dist


def unhex(h):
    return b"" if h == "-" else bytes.fromhex(h)


def tohex(b):
    return b.hex() if b else "-"


# A value no test stores: compare_set(key, S, S) answers S itself for a missing key (torch's
# server returns `expected` then) and the stored value otherwise, without changing anything.
_SENTINEL = b"\x01c10d_server.py check sentinel\x02"


def check(store, key):
    if hasattr(store, "check"):         # PyTorch 2.x has Store.check; 1.13's binding does not
        return store.check([key])
    return store.compare_set(key, _SENTINEL, _SENTINEL) != _SENTINEL


def main():
    timeout = datetime.timedelta(seconds=120)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout, wait_for_workers=False)
    port = store.port
    print("port %d torch %s" % (port, torch.__version__), flush=True)
    later = []

    def set_later(ms, key, value):
        time.sleep(ms / 1000.0)
        other = dist.TCPStore("127.0.0.1", port, None, False, timeout, wait_for_workers=False)
        other.set(key, value)

    for line in sys.stdin:
        w = line.split()
        if not w:
            continue
        cmd = w[0]
        if cmd == "quit":
            break
        if cmd == "set":
            store.set(w[1], unhex(w[2]))
            out = "ok"
        elif cmd == "get":
            out = tohex(store.get(w[1]))
        elif cmd == "add":
            out = str(store.add(w[1], int(w[2])))
        elif cmd == "cas":
            out = tohex(store.compare_set(w[1], unhex(w[2]), unhex(w[3])))
        elif cmd == "check":
            out = "1" if check(store, w[1]) else "0"
        elif cmd == "delete":
            out = "1" if store.delete_key(w[1]) else "0"
        elif cmd == "setlater":
            t = threading.Thread(target=set_later, args=(int(w[1]), w[2], unhex(w[3])), daemon=True)
            t.start()
            later.append(t)
            out = "ok"
        else:
            out = "error unknown command " + cmd
        print(out, flush=True)
    for t in later:
        t.join(timeout=30)


if __name__ == "__main__":
    main()
