"""The bundled example for `kfelastic local` and `make demo`: a small model on
synthetic data, data-parallel over torch.distributed (gloo), started with
torchrun's environment (init_process_group("gloo") reads it). It prints

    loss = 0.1234, step = 12

per step, as DLRover's examples do (kfelastic local's --chaos step=N counts
these), and checkpoints every --ckpt-every steps to --ckpt-dir (rank 0 writes,
atomically); every rank resumes from the latest checkpoint after a restart,
so a recovered job goes on where it was, not from step 0.

Options: --steps N (default 200), --sleep SEC per step (default 0.05),
--ckpt-dir DIR (default: none), --ckpt-every N (default 10), --fail-at N: every
rank raises ValueError("loss diverged") at step N, a bug in the training code
that no restart fixes (make demo's fault that ends the job); --alloc-at
N:MB:RANK: global rank RANK allocates and touches MB megabytes at step N and
holds them (a memory leak that outgrows a container's limit: the kernel's
OOM kill, which a relaunch with more memory fixes); --nccl-timeout-at N:POD:
at step N every rank in the pod whose hostname ends with POD raises what
torch's NCCL watchdog raises when a GPU stopped answering (the text of a
real log, LlamaFactory#7396): how the ranks of a node whose GPU fell off
the bus fail, while the node's GPU daemon reports the Xid.
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def say(line):
    # One write per line: the workers of a command share its stdout, and
    # print() writes the text and the newline apart, so lines interleave.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def load(ckpt_dir, model, opt):
    path = os.path.join(ckpt_dir, "ckpt.pt")
    if not ckpt_dir or not os.path.exists(path):
        return 0
    state = torch.load(path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return state["step"] + 1


def save(ckpt_dir, model, opt, step):
    os.makedirs(ckpt_dir, exist_ok=True)
    tmp = os.path.join(ckpt_dir, ".ckpt.pt.tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, os.path.join(ckpt_dir, "ckpt.pt"))


@record
def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--ckpt-dir", default="")
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--fail-at", type=int, default=-1)
    p.add_argument("--alloc-at", default="")
    p.add_argument("--nccl-timeout-at", default="")
    a = p.parse_args()
    alloc_step, alloc_mb, alloc_rank = (int(v) for v in a.alloc_at.split(":")) if a.alloc_at else (-1, 0, -1)
    hang_step, hang_pod = a.nccl_timeout_at.split(":", 1) if a.nccl_timeout_at else (-1, None)
    hang_step = int(hang_step) if hang_pod and socket.gethostname().endswith(hang_pod) else -1
    held = []
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = load(a.ckpt_dir, model, opt)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    say(f"rank {rank} of {world}: restart {restart}, resumed from step {start}")
    # Synthetic regression data: y = w·x + noise, a different batch per rank and step.
    w = torch.randn(16, 1, generator=torch.Generator().manual_seed(1))
    for step in range(start, a.steps):
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(32, 16, generator=g)
        y = x @ w + 0.01 * torch.randn(32, 1, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step == a.fail_at:
            raise ValueError(f"loss diverged at step {step} on rank {rank}: {loss.item() * float('inf')}")
        if step == hang_step:
            say(f"rank {rank}: the GPU stops answering at step {step}")
            # torch 2.x raises DistBackendError, 1.x RuntimeError.
            error = getattr(dist, "DistBackendError", RuntimeError)
            raise error(
                f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={4 * step + 1}, OpType=ALLREDUCE, "
                "NumelIn=32, NumelOut=32, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
            )
        if step == alloc_step and rank == alloc_rank:
            say(f"rank {rank} allocates {alloc_mb} MB at step {step}")
            held.append(torch.ones(alloc_mb, 1 << 18))  # 1 MB a row of float32
        opt.zero_grad()
        loss.backward()
        for prm in model.parameters():
            dist.all_reduce(prm.grad)
            prm.grad /= world
        opt.step()
        say(f"loss = {loss.item():.4f}, step = {step}")
        if a.ckpt_dir and rank == 0 and (step + 1) % a.ckpt_every == 0:
            save(a.ckpt_dir, model, opt, step)
        if a.sleep:
            time.sleep(a.sleep)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
