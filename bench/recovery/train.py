"""The training script of `make bench-recovery`, the same under kfelastic and
under torchrun: a tiny data-parallel loop (gloo, env://) that prints
"loss = L, step = N" (what kfelastic local's --chaos step=N counts) and,
with --marks DIR, writes DIR/<pid>.json once, at its first step:
{"begin": when the process began, "first": time.time() after its first
step, "world": world size, "rank": rank, "group_rank": its node's rank}. The
benchmark reads the earliest first step of the processes begun after a
fault. --ckpt FILE: rank 0 saves the step every 10 steps, all resume from it.
"""
import argparse
import json
import os
import time

BEGIN = time.time()

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000000)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--marks", default="")
    p.add_argument("--ckpt", default="")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    start = 0
    if a.ckpt and os.path.exists(a.ckpt):
        with open(a.ckpt) as f:
            start = int(f.read().strip() or 0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(start, a.steps):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for prm in model.parameters():
            dist.all_reduce(prm.grad)
        opt.step()
        print(f"loss = {loss.item():.4f}, step = {step}", flush=True)
        if a.marks and step == start:
            tmp = os.path.join(a.marks, f".{os.getpid()}")
            with open(tmp, "w") as f:
                json.dump({"begin": BEGIN, "first": time.time(), "world": world, "rank": rank,
                           "group_rank": int(os.environ.get("GROUP_RANK", "-1"))}, f)
            os.replace(tmp, os.path.join(a.marks, f"{os.getpid()}.json"))
        if a.ckpt and rank == 0 and step % 10 == 0:
            with open(a.ckpt + ".tmp", "w") as f:
                f.write(str(step))
            os.replace(a.ckpt + ".tmp", a.ckpt)
        if a.sleep:
            time.sleep(a.sleep)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
