"""A user's flytekit task for real flytekit (../shared/flytekit, 1.16.24),
run as flytekit serializes it (agent/flytekit_test.go):

    pyflyte-execute --inputs <empty LiteralMap> --output-prefix file://… \\
      --raw-output-data-prefix … --checkpoint-path … --prev-checkpoint "" \\
      --resolver flytekit.core.python_auto_container.default_task_resolver \\
      -- task-module real_task task-name train

`train` is an `Elastic` task: pyflyte-execute's flytekitplugins-kfpytorch
calls torch's elastic_launch (c10d at $PET_RDZV_ENDPOINT, spawned workers)
and each worker runs a small gloo all-reduce loop, as
testdata/train/allreduce_fail.py does under torchrun and
testdata/flytekit/elastic_task.py (our stand-in for flytekit) does.

The pod's env says how (the decorator is evaluated where the module is
imported, in pyflyte-execute and again in every spawned worker):
  NNODES (default "2"), NPROC_PER_NODE (default 2), MONITOR_INTERVAL
  (seconds torch's agent waits between looks at its workers; flytekit's
  default is 5), MAX_RESTARTS (torch's restarts of the workers; flytekit's
  default is 0: a peer's loss fails the task), STEPS (default 40), SLEEP (seconds between steps,
  default 0.05);
  FAIL_RANK, FAIL_STEP: the worker of this pod whose LOCAL rank is
  FAIL_RANK raises ValueError at step FAIL_STEP (default 20). Only the
  pod meant to fail has FAIL_RANK: which global ranks a pod gets is c10d's
  choice, its local ranks are its own. Its peers, blocked in the next
  all-reduce, then fail with gloo's "Connection closed by peer".
  FAIL_POD: where every pod has the same env (the pods of one Kubernetes
  job), only the pod whose name ($HOSTNAME) ends with FAIL_POD fails.
"""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from flytekit import task
from flytekitplugins.kfpytorch import Elastic

STEPS = int(os.environ.get("STEPS", "40"))
SLEEP = float(os.environ.get("SLEEP", "0.05"))


@task(
    task_config=Elastic(
        nnodes=os.environ.get("NNODES", "2"),
        nproc_per_node=int(os.environ.get("NPROC_PER_NODE", "2")),
        monitor_interval=float(os.environ.get("MONITOR_INTERVAL", "5")),
        max_restarts=int(os.environ.get("MAX_RESTARTS", "0")),
    )
)
def train():
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    fail_rank = int(os.environ.get("FAIL_RANK", "-1"))
    if not os.environ.get("HOSTNAME", "").endswith(os.environ.get("FAIL_POD", "")):
        fail_rank = -1
    fail_step = int(os.environ.get("FAIL_STEP", "20"))
    t = torch.ones(1024)
    for step in range(STEPS):
        if local == fail_rank and step == fail_step:
            raise ValueError(f"loss is NaN at step {step} on rank {rank} (local rank {local})")
        dist.all_reduce(t)
        print(f"rank {rank} local {local} step = {step}", flush=True)
        time.sleep(SLEEP)
    dist.destroy_process_group()
