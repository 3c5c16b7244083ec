# kfelastic's node health check, one node's part of one round (docs/DESIGN.md §5.4),
# run by the agent with the job's own interpreter. It times a small compute
# and an all-reduce with its group (gloo), and prints one JSON line. The
# compute is timed after the group's barrier, so that a slow partner does
# not make a fast node look slow and every member computes under the same
# load; the all-reduce after another barrier is the same for the whole
# group. Exit 3: no torch here (the agent then runs its Go check instead).
import json
import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
except Exception as e:  # noqa: BLE001 - any import failure means "no torch"
    print("kfelastic node check: torch cannot be imported: %s" % e, file=sys.stderr, flush=True)
    sys.exit(3)

from datetime import timedelta


def main():
    rank = int(os.environ["RANK"])
    size = int(os.environ["WORLD_SIZE"])
    # The agent gives a point in time: the import of torch has spent some of
    # the round already.
    deadline = float(os.environ.get("KFELASTIC_CHECK_DEADLINE", time.time() + 60))
    work = int(os.environ.get("KFELASTIC_CHECK_WORK", "12"))
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    a = torch.rand(256, 256)
    b = torch.rand(256, 256)

    def run_compute():
        x = a
        t0 = time.perf_counter()
        for _ in range(work):
            x = torch.tanh(x @ b)
        return bool(torch.isfinite(x).all()), time.perf_counter() - t0

    bad = {"ok": False, "self": True, "error": "the compute gave non-finite numbers"}
    compute = allreduce = 0.0
    result = {"ok": True, "self": False, "error": ""}
    if size == 1:
        ok, compute = run_compute()
        if not ok:
            result = bad
    else:
        # A failure from here on is the group's (a partner that never came,
        # a collective that timed out), reported as such, not a crash; if
        # torch overruns the deadline, this line tells the agent so (and
        # when it came tells which member the group waited for).
        print(json.dumps({"phase": "group"}), flush=True)
        try:
            # torch 1.13's rank 0 waits about 2 × timeout + 1 s for a member
            # that never comes (measured): a third of the time left ends it
            # before the deadline, with torch's own error.
            timeout = timedelta(seconds=max((deadline - time.time()) / 3, 0.5))
            dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size, timeout=timeout)
            dist.barrier()
            # The compute once the whole group is here: every member times
            # it at the same moment, under the same load, so that pods
            # sharing a machine (the local engine's) do not time each
            # other's imports; a throttled node is as slow as ever, and a
            # late partner still makes nobody look slow.
            ok, compute = run_compute()
            # Untimed: a slow member's compute is its own time, not its
            # partners' all-reduce.
            dist.barrier()
            t = torch.ones(4096) * (rank + 1)
            t1 = time.perf_counter()
            for _ in range(3):
                dist.all_reduce(t)
            allreduce = time.perf_counter() - t1
            # After three all-reduces every element is (sum of rank+1) * size^2.
            want = size * (size + 1) / 2 * size * size
            if not ok:
                result = bad
            elif abs(t[0].item() - want) >= 1e-3 * want:
                result.update(ok=False, error="all-reduce gave %g, want %g" % (t[0].item(), want))
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001
            result.update(ok=False, error="all-reduce with the group failed: %s" % str(e).splitlines()[0][:300])
    result.update(elapsed=compute + allreduce, compute=compute, allreduce=allreduce)
    print(json.dumps(result), flush=True)


main()
# The result is out: skip the interpreter's teardown of torch (a few hundred
# ms here, seconds on a slowed node).
os._exit(0)
