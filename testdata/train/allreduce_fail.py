"""A tiny distributed job that fails the way real ones do.

Every rank all-reduces a tensor a few times over gloo (init_method env://, as
torchrun and kfelastic's agent launch it). At step FAIL_STEP the rank FAIL_RANK
raises ValueError; its peers, blocked in the next all-reduce, then fail with a
secondary "Connection closed by peer" error a moment later. @record writes
each rank's exception to TORCHELASTIC_ERROR_FILE, as under torchrun.
"""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

FAIL_RANK = int(os.environ.get("FAIL_RANK", "1"))
FAIL_STEP = int(os.environ.get("FAIL_STEP", "3"))


@record
def main():
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    t = torch.ones(1024)
    for step in range(10):
        if rank == FAIL_RANK and step == FAIL_STEP:
            raise ValueError(f"loss is NaN at step {step} on rank {rank}")
        dist.all_reduce(t)
        print(f"rank {rank} step {step} sum {t[0].item():.0f}", flush=True)
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
