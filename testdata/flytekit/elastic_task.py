"""Stands in for flytekit in every pod of a flytekit PyTorch `Elastic` task:
what `pyflyte-execute` (flytekit/bin/entrypoint.py) and
flytekitplugins-kfpytorch's `PytorchElasticFunctionTask._execute`
(plugins/flytekit-kf-pytorch/flytekitplugins/kfpytorch/task.py) do, with
torch's own `elastic_launch`. flytekit cannot be installed here (no PyPI);
this script is written from a reading of flytekit's source, not copied.

What it does as flytekit does:

- pyflyte-execute registers faulthandler on SIGUSR1 first (a SIGUSR1 to it
  dumps its threads' tracebacks to stderr instead of killing it).
- Of the PET_* variables only PET_RDZV_ENDPOINT is read (default
  "localhost:0"), and whether PET_NNODES is set (a warning when it is not
  and nnodes > 1). Everything else comes from the task's decorator,
  `Elastic(nnodes, nproc_per_node, start_method="spawn", monitor_interval=5,
  max_restarts=0, rdzv_configs={"timeout": 900, "join_timeout": 900})`,
  here the options --nnodes, --nproc-per-node, --start-method,
  --monitor-interval, --max-restarts and --rdzv-conf key=value (which
  replace flytekit's default rdzv_configs as a decorator's would; give
  none to keep them). PET_RDZV_CONF never reaches torch.
- OMP_NUM_THREADS=1 when unset and nproc_per_node > 1.
- LaunchConfig(run_id=<execution id>, min/max nodes from nnodes,
  rdzv_backend="c10d" (hard-coded), rdzv_configs, rdzv_endpoint,
  max_restarts, monitor_interval, start_method); with "spawn" (the default)
  the entrypoint is a module-level function given the task's arguments
  (flytekit's spawn_helper, which unpickles the task function): every
  worker is a new interpreter that imports torch and this module again,
  and multiprocessing's resource tracker runs beside the workers, a child
  of this process. With "fork" it is a closure with the arguments bound.
- A worker's exception that is a FlyteRecoverableException creates the
  `recoverable_error` marker next to its torch error file.
- ChildFailedError: torch's first failure decides. Recoverable (the marker
  exists): FlyteRecoverableException(e.format_msg()); else
  FlyteUserRuntimeException(e); both with timestamp = the first failure's
  ProcessFailure.timestamp (torch's whole second). The task runner wraps
  what the task raised in a FlyteUserRuntimeException (base_task's
  dispatch_execute), and pyflyte-execute writes one error document:
  `error-<uuid4 hex>.pb` when _F_DES (FLYTE_INTERNAL_DIST_ERROR_STRATEGY) is
  set, else `error.pb`, under --output-prefix, with
    code   = "USER:RuntimeError" ("RecoverableFlyteException" when
             recoverable: the code of the exception the wrapper wraps),
    message = "Trace:\n\n<traceback, indented>\nMessage:\n\n    <type>: <value>",
    kind   = NON_RECOVERABLE (RECOVERABLE when recoverable), origin USER,
    timestamp = whole seconds, nanos 0,
    worker = _F_WN (FLYTE_INTERNAL_WORKER_NAME) as given, "" without _F_DES;
  then it exits 0 (1 only with FLYTE_FAIL_ON_ERROR=true), and not at once:
  after the document is in place flytekit still copies its engine folder,
  logs and shuts its interpreter down, torch and all. Measured with real
  flytekit 1.16.24 (agent's TestRealFlytekitRootCause) on a loaded 2-core
  machine: 1 to 2 s from its "End Error Captured" line to its exit, long
  enough that the master's EXIT, after the first pod's report, usually
  reaches a pod whose flytekit has written its document and not exited
  yet (issue 27, item 1). --exit-delay SEC (default 1) is that wait.
- SignalException (torch's agent got SIGTERM): IgnoreOutputs, no document,
  exit 0.
- Success: the result is global rank 0's (printed here: "result {...}";
  flytekit writes outputs.pb).

The error document is a serialized flyteidl.core.ErrorDocument, encoded by
hand (no protobuf package here). --output-prefix takes a local folder, a
file:// URL, or an s3:// URL, which gets the document by one S3 PUT signed
with AWS Signature V4 (stdlib only; flytekit uses fsspec's s3fs), with
flytekit's FLYTE_AWS_ENDPOINT / FLYTE_AWS_ACCESS_KEY_ID /
FLYTE_AWS_SECRET_ACCESS_KEY (falling back to the AWS_* names) and
path-style addressing, as against MinIO.

The task function is a small data-parallel gloo loop: it prints
"restart R rank N world W start S" once its process group is ready, then
"step = N" per step; rank 0 checkpoints every 5 steps to --ckpt and every
rank resumes from it, so that steps go on after torch's agent restarts the
workers. The dump signal (SIGUSR1) makes rank 0 checkpoint at once and
print "dumped at step N". --raise RANK:STEP:TYPE makes global rank RANK
raise TYPE (ValueError, RuntimeError, FlyteRecoverableException, ...) at
step STEP, in its first attempt only; --raise-local LOCAL_RANK:STEP:TYPE
the same for the worker of that local rank (give it to one pod: which
global ranks a pod gets is c10d's choice).

Task options: --steps N, --sleep SEC per step, --ckpt PATH, --raise, --raise-local,
--marks DIR (each worker's first step, for make bench-recovery);
--hold WORLD:STEP (a test's pacing: a worker in a world smaller than WORLD
waits at step STEP until torch's agent restarts it into a larger one, so
that a scale-up test does not depend on how fast the new pod starts);
--run-id ID (default FLYTE_INTERNAL_EXECUTION_ID or "standin").
"""
import argparse
import builtins
import datetime
import faulthandler
import hashlib
import hmac
import logging
import os
import signal
import sys
import textwrap
import time
import traceback
import urllib.parse
import urllib.request
import uuid

BEGIN = time.time()  # this process's start, for --marks (a worker imports this module again)
if __name__ == "__main__" and os.environ.get("LOGLEVEL"):
    # (debug_timing's line, before it is defined: the command's Python is
    # up, its sitecustomize run; the phases of a recovery, make bench-e2e)
    sys.stderr.write(f"{datetime.datetime.now().isoformat()} pid {os.getpid()}: command started, importing torch\n")

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


# ---- flytekit's exceptions, as far as the document shows them ----


class FlyteException(Exception):
    """flytekit.exceptions.base.FlyteException: a code, a timestamp."""

    code = "UnknownFlyteException"

    def __init__(self, *args, timestamp=None):
        super().__init__(*args)
        self.timestamp = timestamp

    def __str__(self):
        s = "error=" + (",".join(self.args) if self.args else "None")
        if self.__cause__:
            s += f", cause={self.__cause__}"
        return f"{self.code}: {s}"


class FlyteRecoverableException(FlyteException):
    code = "RecoverableFlyteException"


class FlyteUserRuntimeException(FlyteException):
    """Wraps what user code raised; its code is the wrapped one's, if any."""

    code = "USER:RuntimeError"

    def __init__(self, value, timestamp=None):
        super().__init__(str(value), timestamp=timestamp)
        self.value = value

    @property
    def error_code(self):
        v = self.value
        if isinstance(v, FlyteUserRuntimeException):
            return v.error_code
        if isinstance(v, FlyteException):
            return v.code
        return self.code


class IgnoreOutputs(Exception):
    pass


# ---- the document ----


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num, wire, payload):
    key = _varint(num << 3 | wire)
    if wire == 0:
        return key + _varint(payload)
    return key + _varint(len(payload)) + payload


def error_document(code, message, recoverable, origin_user, seconds, nanos, worker):
    """flyteidl.core.ErrorDocument{error: ContainerError{code=1, message=2,
    kind=3 (NON_RECOVERABLE=0, RECOVERABLE=1), origin=4 (USER=1, SYSTEM=2),
    timestamp=5, worker=6}}; zero values are left out, as protobuf does."""
    ts = b""
    if seconds:
        ts += _field(1, 0, seconds)
    if nanos:
        ts += _field(2, 0, nanos)
    ce = _field(1, 2, code.encode()) + _field(2, 2, message.encode("utf-8", "replace"))
    if recoverable:
        ce += _field(3, 0, 1)
    ce += _field(4, 0, 1 if origin_user else 2)
    ce += _field(5, 2, ts)
    if worker:
        ce += _field(6, 2, worker.encode())
    return _field(1, 2, ce)


def one_of(*names):
    for n in names:
        if n in os.environ:
            return os.environ[n]
    return ""


def traceback_str(e):
    """pyflyte-execute's message: the wrapped exception's traceback (the
    chain torch's ChildFailedError started), then "<type>: <value>"."""
    root = e.__cause__ if e.__cause__ else e
    trace = "".join(traceback.format_exception(type(root), root, root.__traceback__))
    value = e.value
    return "Trace:\n\n{}\nMessage:\n\n{}".format(
        textwrap.indent(trace, "    "), textwrap.indent(f"{type(value).__name__}: {value}", "    "))


def write_document(prefix, e):
    if one_of("FLYTE_INTERNAL_DIST_ERROR_STRATEGY", "_F_DES"):
        name, worker = f"error-{uuid.uuid4().hex}.pb", one_of("FLYTE_INTERNAL_WORKER_NAME", "_F_WN")
    else:
        name, worker = "error.pb", ""
    ts = e.value.timestamp if isinstance(e.value, FlyteException) else None
    if ts is None:
        ts = time.time()
    seconds = int(ts)
    nanos = int((ts - seconds) * 1_000_000_000)
    data = error_document(e.error_code, traceback_str(e), isinstance(e.value, FlyteRecoverableException), True,
                          seconds, nanos, worker)
    if prefix.startswith("s3://"):
        s3_put(prefix.rstrip("/") + "/" + name, data)
        return name
    folder = prefix[len("file://"):] if prefix.startswith("file://") else prefix
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, "." + name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(folder, name))
    return name


def s3_put(url, data):
    """One PUT of data to s3://bucket/key, path-style, signed with SigV4."""
    env = lambda *names, default="": next((os.environ[n] for n in names if os.environ.get(n)), default)
    endpoint = env("FLYTE_AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    if not endpoint:
        raise RuntimeError(f"no S3 endpoint (FLYTE_AWS_ENDPOINT) to write {url}")
    access = env("FLYTE_AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID")
    secret = env("FLYTE_AWS_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY")
    region = env("AWS_REGION", "AWS_DEFAULT_REGION", default="us-east-1")
    bucket, _, key = url[len("s3://"):].partition("/")
    ep = urllib.parse.urlsplit(endpoint)
    path = "/" + bucket + "/" + urllib.parse.quote(key, safe="/-_.~")
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(data).hexdigest()
    headers = {"host": ep.netloc, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canonical = "\n".join(["PUT", path, "", *(f"{k}:{headers[k]}" for k in sorted(headers)), "", signed, payload])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    k = ("AWS4" + secret).encode()
    for part in (day, region, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = f"AWS4-HMAC-SHA256 Credential={access}/{scope}, SignedHeaders={signed}, Signature={sig}"
    req = urllib.request.Request(f"{ep.scheme}://{ep.netloc}{path}", data=data, method="PUT", headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


# ---- the task ----


def save(path, step):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(step))
    os.replace(tmp, path)


EXCEPTIONS = {"FlyteRecoverableException": FlyteRecoverableException}


def debug_timing(what):
    # The stand-in's own diagnostic, not flytekit's: with LOGLEVEL set (as
    # for torch's elastic loggers), say when each phase of a start is
    # reached, so that a slow recovery shows where its time goes.
    if os.environ.get("LOGLEVEL"):
        sys.stderr.write(f"{datetime.datetime.now().isoformat()} pid {os.getpid()}: {what}\n")
        sys.stderr.flush()


def mark(marks, rank, world):
    """--marks DIR: DIR/<pid>.json once, at the worker's first step, as
    bench/recovery/train.py writes it (make bench-recovery reads them)."""
    tmp = os.path.join(marks, f".{os.getpid()}")
    with open(tmp, "w") as f:
        f.write('{"begin": %r, "first": %r, "world": %d, "rank": %d, "group_rank": %d}' % (
            BEGIN, time.time(), world, rank, int(os.environ.get("GROUP_RANK", "-1"))))
    os.replace(tmp, os.path.join(marks, f"{os.getpid()}.json"))


def train(steps, sleep, ckpt, fail="", marks="", hold="", fail_local="", message_bytes=0):
    """The task function: runs in every worker torch's agent starts."""
    dist.init_process_group("gloo")
    debug_timing("process group ready")
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
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    say(f"restart {restart} rank {rank} world {world} start {start}")
    raise_rank, raise_step, raise_type = -1, -1, ""
    if fail and restart == "0":
        r, s, raise_type = fail.split(":", 2)
        raise_rank, raise_step = int(r), int(s)
    if fail_local and restart == "0":
        r, s, raise_type = fail_local.split(":", 2)
        if int(r) == int(os.environ["LOCAL_RANK"]):
            raise_rank, raise_step = rank, int(s)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    progress = os.environ.get("KFELASTIC_PROGRESS_FILE", "")
    hold_world, hold_step = (int(x) for x in hold.split(":")) if hold else (0, -1)
    for step in range(start, steps):
        current[0] = step
        if step == hold_step and world < hold_world:
            say(f"holding at step {step} for a world of {hold_world}")
            while True:
                time.sleep(0.1)
        if rank == raise_rank and step == raise_step:
            exc = EXCEPTIONS.get(raise_type) or getattr(builtins, raise_type, RuntimeError)
            msg = f"rank {rank} failed at step {step} on purpose"
            if message_bytes > len(msg):
                # A long exception text (a tensor printed whole): flytekit
                # writes its document whole, over the reader's limit.
                msg += "; the batch was " + "[nan, nan, nan] " * ((message_bytes - len(msg)) // 16 + 1)
            raise exc(msg)
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        say(f"step = {step}")
        if marks and step == start:
            mark(marks, rank, world)
        if progress:
            with open(progress, "a"):
                os.utime(progress)
        if ckpt and rank == 0 and step % 5 == 0:
            save(ckpt, step)
        time.sleep(sleep)
    dist.destroy_process_group()
    return {"rank": rank, "steps": steps}


def recoverable_marker():
    """flytekit's create_recoverable_error_file: `recoverable_error` next to
    the worker's torch error file."""
    path = os.path.join(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"]), "recoverable_error")
    with open(path, "w"):
        pass


def run_task(kwargs):
    """The spawn entrypoint (flytekit's spawn_helper): module level, so that
    spawn can pickle it; the worker imports this module again."""
    debug_timing("worker imported, entrypoint called")
    try:
        return train(**kwargs)
    except FlyteRecoverableException:
        recoverable_marker()
        raise


def execute(a):
    """PytorchElasticFunctionTask._execute."""
    min_nodes, max_nodes = run.parse_min_max_nnodes(str(a.nnodes))
    if os.environ.get("PET_NNODES") is None and min_nodes > 1:
        say(f"`nnodes` is set to {a.nnodes} in elastic task but execution appears to not run in a `PyTorchJob`. "
            "Rendezvous might timeout.")
    if "OMP_NUM_THREADS" not in os.environ and a.nproc_per_node > 1:
        os.environ["OMP_NUM_THREADS"] = "1"
    rdzv_configs = {"timeout": 900, "join_timeout": 900}
    if a.rdzv_conf:
        rdzv_configs = {}
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
        start_method=a.start_method,
    )
    kwargs = {"steps": a.steps, "sleep": a.sleep, "ckpt": a.ckpt, "fail": getattr(a, "raise"), "marks": a.marks, "hold": a.hold,
              "fail_local": a.raise_local, "message_bytes": a.message_bytes}
    if a.start_method == "spawn":
        entrypoint, args = run_task, (kwargs,)
    elif a.start_method == "fork":
        def fn_partial():
            try:
                return train(**kwargs)
            except FlyteRecoverableException:
                recoverable_marker()
                raise

        entrypoint, args = fn_partial, ()
    else:
        raise ValueError("Bad start method")
    try:
        out = elastic_launch(config=config, entrypoint=entrypoint)(*args)
    except ChildFailedError as e:
        _, first = e.get_first_failure()
        marker = os.path.join(os.path.dirname(first.error_file), "recoverable_error")
        if os.path.exists(marker):
            raise FlyteRecoverableException(e.format_msg(), timestamp=first.timestamp)
        raise FlyteUserRuntimeException(e, timestamp=first.timestamp)
    except SignalException as e:
        say(f"Elastic launch agent process terminating: {e}")
        raise IgnoreOutputs()
    if 0 in out:
        return out[0]
    raise IgnoreOutputs()


def main():
    debug_timing("command imported torch")
    faulthandler.register(signal.SIGUSR1)
    p = argparse.ArgumentParser()
    p.add_argument("--output-prefix", required=True)
    # the decorator: Elastic(...)
    p.add_argument("--nnodes", default="1")
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--start-method", default="spawn", choices=["spawn", "fork"])
    p.add_argument("--monitor-interval", type=float, default=5)
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--rdzv-conf", action="append", default=[])
    # the task's inputs
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--ckpt", default="")
    p.add_argument("--raise", default="")
    p.add_argument("--raise-local", default="")
    p.add_argument("--marks", default="")
    p.add_argument("--hold", default="")
    p.add_argument("--exit-delay", type=float, default=1.0)
    # --message-bytes N: the raised exception's message is N bytes long
    # (issue 27, item 4: a document over the reader's 1 MiB).
    p.add_argument("--message-bytes", type=int, default=0)
    p.add_argument("--run-id", default=os.environ.get("FLYTE_INTERNAL_EXECUTION_ID", "standin"))
    a = p.parse_args()
    if os.environ.get("LOGLEVEL"):
        # torch's elastic loggers take their level from LOGLEVEL but have no
        # handler; give them one, as torchrun's users see them.
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        try:
            result = execute(a)
        except Exception as e:
            # base_task.dispatch_execute: what the task raised, wrapped
            raise FlyteUserRuntimeException(e) from e
    except FlyteUserRuntimeException as e:
        if isinstance(e.value, IgnoreOutputs):
            return 0
        name = write_document(a.output_prefix, e)
        say("!! Begin User Error Captured by Flyte !!")
        say(traceback_str(e))
        say("!! End Error Captured by Flyte !!")
        say(f"error document {name}")
        time.sleep(a.exit_delay)
        if os.environ.get("FLYTE_FAIL_ON_ERROR", "").lower() in ("1", "true"):
            return 1
        return 0
    say(f"result {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
