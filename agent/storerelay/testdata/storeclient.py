# A torch TCPStore client for the store relay's tests (agent/storerelay_test.go):
# `storeclient.py HOST PORT ops` runs every operation torch's client has and
# prints one line per answer; `storeclient.py HOST PORT count KEY N` adds 1
# to KEY N times, checking each answer, and prints the final value;
# `storeclient.py HOST PORT hold` sets "held", prints "ready" and keeps its
# store (its connections) until stdin ends.
import datetime
import sys

import torch
import torch.distributed as dist

host, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
v2 = int(torch.__version__.split(".")[0]) >= 2
# Debian's torch 2.x is built without libuv: its client is the same either way.
kw = {"use_libuv": False} if v2 else {}
s = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=60), **kw)

if mode == "hold":
    s.set("held", "1")
    print("ready", flush=True)
    sys.stdin.read()
    sys.exit(0)

if mode == "count":
    key, n = sys.argv[4], int(sys.argv[5])
    print("started", flush=True)
    for i in range(1, n + 1):
        got = s.add(key, 1)
        if got != i:
            print(f"add {i} answered {got}", flush=True)
            sys.exit(1)
        if i % 100 == 0:
            print(i, flush=True)
    print("final", int(s.get(key)), flush=True)
    sys.exit(0)

s.set("a", "1")
print("get a", s.get("a"))
print("add n 5", s.add("n", 5))
print("add n -2", s.add("n", -2))
print("compare_set c '' x", s.compare_set("c", "", "x"))
print("compare_set c y z", s.compare_set("c", "y", "z"))
print("compare_set c x z", s.compare_set("c", "x", "z"))
print("compare_set d y z", s.compare_set("d", "y", "z"))
if hasattr(s, "check"):  # not in 1.13's Python API
    print("check a n", s.check(["a", "n"]))
    print("check missing", s.check(["missing"]))
print("num_keys", s.num_keys())
print("delete a", s.delete_key("a"))
print("delete a", s.delete_key("a"))
s.wait(["n", "c"])
print("wait n c")
if v2:
    s.append("l", "a")
    s.append("l", "b")
    print("append l", s.get("l"))
    s.multi_set(["m1", "m2"], ["x", "y"])
    print("multi_get", s.multi_get(["m1", "m2"]))
try:
    s.wait(["never"], datetime.timedelta(milliseconds=300))
    print("wait never returned")
except Exception as e:
    print("wait never timed out")
# The key the timed-out wait wanted comes late. 1.13's client sent no
# CANCEL_WAIT: torch's own server would answer the stale wait now, a byte
# the next reply would start with. The relay dropped that wait.
s.set("never", "late")
print("add n 0 after the late key", s.add("n", 0))
