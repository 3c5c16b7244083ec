"""A tiny data-parallel training loop for the agent's real-torch tests and
benchmark. Run under kfelastic agent or torchrun; it uses env:// only.

Prints "restart N pid P rank R" once its process group is ready, then
"step S loss L" per step. Options: --steps N (default 1000000), --sleep SEC
per step (default 0.01), --env-out DIR writes the env it sees (env-<restart>-<rank>.json) and its
argv, sys.path[0], __file__ (argv-<restart>-<rank>.json), its pid, process
group and parent (proc-<restart>-<rank>.json),
--mark DIR writes DIR/pid-<restart>-<rank> (its pid) once ready and
DIR/step-<restart>-<rank> (time.time() of its first step) and
DIR/begin-<restart>-<rank> (when the script began) for benchmarks,
--raise-at STEP raises RuntimeError on RANK --raise-rank under @record.
Checkpoint: with --ckpt PATH, rank 0 saves the step every 10 steps and all
ranks resume from it, so steps continue after a restart.
"""
import argparse
import json
import os
import sys
import time

BEGIN = time.time()  # the interpreter reached the script (for benchmarks)

PRELOADED = "torch" in sys.modules  # true in a kfelastic warm spare or fork

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def mark(folder, name, text):
    tmp = os.path.join(folder, "." + name)
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(folder, name))


@record
def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000000)
    p.add_argument("--sleep", type=float, default=0.01)
    p.add_argument("--env-out", default="")
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--raise-rank", type=int, default=0)
    p.add_argument("--ckpt", default="")
    p.add_argument("--mark", default="")
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    if a.env_out:
        tag = f"{os.environ['TORCHELASTIC_RESTART_COUNT']}-{rank}"
        with open(os.path.join(a.env_out, f"env-{tag}.json"), "w") as f:
            json.dump(dict(os.environ), f, sort_keys=True)
        with open(os.path.join(a.env_out, f"argv-{tag}.json"), "w") as f:
            json.dump({"argv": sys.argv, "path0": sys.path[0], "file": __file__, "name": __name__}, f)
        with open(os.path.join(a.env_out, f"preloaded-{tag}"), "w") as f:
            f.write(str(PRELOADED))
        with open(os.path.join(a.env_out, f"proc-{tag}.json"), "w") as f:
            json.dump({"pid": os.getpid(), "pgid": os.getpgid(0), "ppid": os.getppid()}, f)
    dist.init_process_group("gloo", init_method="env://")
    start = 0
    if a.ckpt and os.path.exists(a.ckpt):
        with open(a.ckpt) as f:
            start = int(f.read().strip() or 0)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    print(f"restart {os.environ['TORCHELASTIC_RESTART_COUNT']} pid {os.getpid()} rank {rank} world {dist.get_world_size()}", flush=True)
    progress = os.environ.get("KFELASTIC_PROGRESS_FILE", "")
    tag = f"{os.environ['TORCHELASTIC_RESTART_COUNT']}-{rank}"
    if a.mark:
        mark(a.mark, "pid-" + tag, str(os.getpid()))
        mark(a.mark, "begin-" + tag, repr(BEGIN))
    for step in range(start, a.steps):
        if step == a.raise_at and rank == a.raise_rank:
            raise RuntimeError(f"boom at step {step} on rank {rank}")
        x = torch.randn(16, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for prm in model.parameters():
            dist.all_reduce(prm.grad)
            prm.grad /= dist.get_world_size()
        opt.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if a.mark and step == start:
            mark(a.mark, "step-" + tag, repr(time.time()))
        if progress:
            with open(progress, "a"):
                os.utime(progress)
        if a.ckpt and rank == 0 and step % 10 == 0:
            tmp = a.ckpt + ".tmp"
            with open(tmp, "w") as f:
                f.write(str(step))
            os.replace(tmp, a.ckpt)
        if a.sleep:
            time.sleep(a.sleep)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
