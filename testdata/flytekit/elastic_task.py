"""Stands in for flytekit's launch path of an `Elastic` task: what
`pyflyte-execute` runs in every pod of a flytekit PyTorch elastic task.
flytekit cannot be installed here (no PyPI), so this script does what
flytekitplugins-kfpytorch's `PytorchElasticFunctionTask._execute` does
(plugins/flytekit-kf-pytorch/flytekitplugins/kfpytorch/task.py), with torch's
own `elastic_launch`:

- min/max nodes parsed with torch.distributed.run.parse_min_max_nnodes from
  PET_NNODES (flytekit parses the task's `nnodes`, from which the plugin makes
  the ElasticConfig that the operator turns into PET_NNODES);
- OMP_NUM_THREADS=1 when unset and nproc_per_node > 1, as flytekit does;
- LaunchConfig(run_id=<execution id>, min_nodes, max_nodes, nproc_per_node,
  rdzv_backend="c10d" (hard-coded in flytekit), rdzv_configs (flytekit's
  default {"timeout": 900, "join_timeout": 900}),
  rdzv_endpoint=os.environ.get("PET_RDZV_ENDPOINT", "localhost:0"),
  max_restarts, monitor_interval, start_method="fork");
- the entrypoint is a closure with the task's arguments bound (flytekit's
  fn_partial for start_method "fork"), called with no arguments;
- ChildFailedError becomes RuntimeError(e.format_msg()), SignalException a
  quiet exit 0 (flytekit's IgnoreOutputs); the result is global rank 0's.

Where flytekit would write its error document (error.pb, _F_WN/_F_DES) and
outputs, this script prints the traceback and exits 1, or prints the result.

The task function is a small data-parallel gloo loop: it prints
"restart R rank N world W" once its process group is ready, then "step = N"
per step; rank 0 checkpoints every 5 steps to --ckpt and every rank resumes
from it, so that steps go on after torch's agent restarts the workers. The
dump signal (SIGUSR1) makes rank 0 checkpoint at once and print
"dumped at step N".

Options: --steps N, --sleep SEC per step, --ckpt PATH, --max-restarts N,
--monitor-interval SEC, --nproc-per-node N (default PET_NPROC_PER_NODE or 1),
--run-id ID (default FLYTE_INTERNAL_EXECUTION_ID or "standin"),
--rdzv-conf key=value (repeatable; added to flytekit's defaults).
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed import run
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch


def say(line):
    # One write per line: the workers of a command share its stdout, and
    # print() writes the text and the newline apart, so lines interleave.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def save(path, step):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, path)


def train(steps, sleep, ckpt):
    """The task function: runs in every worker torch's agent forks."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    start = 0
    if ckpt and os.path.exists(ckpt):
        with open(ckpt) as f:
            start = int(f.read().strip() or 0)
    current = [start]

    def dump(signum, frame):
        if rank == 0 and ckpt:
            save(ckpt, current[0])
        say(f"dumped at step {current[0]}")

    signal.signal(signal.SIGUSR1, dump)
    say(f"restart {os.environ['TORCHELASTIC_RESTART_COUNT']} rank {rank} world {world} start {start}")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    progress = os.environ.get("KFELASTIC_PROGRESS_FILE", "")
    for step in range(start, steps):
        current[0] = step
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        say(f"step = {step}")
        if progress:
            with open(progress, "a"):
                os.utime(progress)
        if ckpt and rank == 0 and step % 5 == 0:
            save(ckpt, step)
        time.sleep(sleep)
    dist.destroy_process_group()
    return {"rank": rank, "steps": steps}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--ckpt", default="")
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--monitor-interval", type=float, default=5)
    p.add_argument("--nproc-per-node", type=int, default=int(os.environ.get("PET_NPROC_PER_NODE", "1")))
    p.add_argument("--run-id", default=os.environ.get("FLYTE_INTERNAL_EXECUTION_ID", "standin"))
    p.add_argument("--rdzv-conf", action="append", default=[])
    a = p.parse_args()

    min_nodes, max_nodes = run.parse_min_max_nnodes(os.environ.get("PET_NNODES", "1"))
    if "OMP_NUM_THREADS" not in os.environ and a.nproc_per_node > 1:
        os.environ["OMP_NUM_THREADS"] = "1"
    rdzv_configs = {"timeout": 900, "join_timeout": 900}
    for kv in a.rdzv_conf:
        k, v = kv.split("=", 1)
        rdzv_configs[k] = float(v) if v.replace(".", "", 1).isdigit() else v
    config = LaunchConfig(
        run_id=a.run_id,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=a.nproc_per_node,
        rdzv_backend="c10d",
        rdzv_configs=rdzv_configs,
        rdzv_endpoint=os.environ.get("PET_RDZV_ENDPOINT", "localhost:0"),
        max_restarts=a.max_restarts,
        monitor_interval=a.monitor_interval,
        start_method="fork",
    )

    def fn_partial():
        return train(a.steps, a.sleep, a.ckpt)

    try:
        out = elastic_launch(config=config, entrypoint=fn_partial)()
    except ChildFailedError as e:
        raise RuntimeError(e.format_msg())
    except SignalException as e:
        say(f"Elastic launch agent process terminating: {e}")
        sys.exit(0)
    if 0 in out:
        say(f"result {out[0]}")


if __name__ == "__main__":
    main()
