"""One side of a torch TCPStore pair, for the store proxy's real-torch test.

store_pair.py server|client PORT: imports torch, prints "ready", waits for a
line on stdin, then the server hosts the store on PORT and prints
"up <time.time()>", and the client connects to PORT (as init_process_group
does), makes one round trip and prints "answered <time.time()>", then sets a
key the server reads and prints.
"""
import sys
import time
from datetime import timedelta

import torch.distributed as dist

role, port = sys.argv[1], int(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
if role == "server":
    s = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=10), wait_for_workers=False)
    print(f"up {time.time():.6f}", flush=True)
    print(s.get("k").decode(), flush=True)
else:
    print(f"connecting {time.time():.6f}", flush=True)
    s = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=10), wait_for_workers=False)
    s.add("n", 1)
    print(f"answered {time.time():.6f}", flush=True)
    s.set("k", "v")
