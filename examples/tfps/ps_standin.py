"""A STAND-IN for a TensorFlow parameter-server job (TensorFlow is not
installable on this machine: no PyPI, not in Debian). It is not TensorFlow;
it behaves, at the seams `kfelastic local --tf-ps` and the scenarios of
docs/DESIGN.md §8 (8–10) observe, as a TF1 PS job under MonitoredTrainingSession:

- It reads TF_CONFIG as the Kubeflow training operator sets it:
  {"cluster": {"chief": [...], "ps": [...], "worker": [...]},
   "task": {"type": "ps", "index": 0}, "environment": "cloud"}
  and serves or dials the addresses there (plain TCP, one JSON line per
  request and per answer). With enableDynamicWorker the operator writes a
  sparse cluster instead, {"ps": [...], "worker": {"<index>": addr}} with
  no chief: worker 0 is then the chief, as in TF1 without a chief task.
- A ps task holds its shard of the parameters (element i of the parameter
  vector lives on ps i mod len(ps)); ps 0 also holds global_step. A ps
  starts empty (uninitialised) with a new incarnation number: a restarted ps
  has lost its variables, as a restarted TF server has.
- The chief initialises the variables (or restores them from its latest
  checkpoint in --ckpt-dir: "restored from checkpoint at step N"), saves a
  checkpoint every --ckpt-every global steps, and, when it sees a ps that
  restarted (a new incarnation, or uninitialised), restores every ps from the
  latest checkpoint, as MonitoredTrainingSession recreates its session. At
  --steps it tells every ps to finish and exits.
- The chief and the workers train asynchronously: pull the parameters, a
  gradient of a linear regression on a synthetic batch, push it (ps 0 bumps
  global_step) and print "loss = L, step = N" with the global step. A worker
  waits while a ps is unreachable or uninitialised, and exits once
  global_step reaches --steps.
- At start every task prints its memory limit (its memory cgroup's, or
  "none") so that tests can see the limit it runs under.

Options: --steps N (default 100), --sleep SEC per step (default 0.1),
--ckpt-dir DIR (chief; default none), --ckpt-every N (default 10),
--dim D parameters (default 8).
"""
import argparse
import json
import os
import random
import socket
import socketserver
import sys
import threading
import time


def log(msg):
    print(msg, flush=True)


def memory_limit():
    """This process's memory limit from its cgroup (v1 or v2), or "none"."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return "none"
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        for root, ctrl, name in (("/sys/fs/cgroup/memory", "memory", "memory.limit_in_bytes"),
                                 ("/sys/fs/cgroup", "", "memory.max")):
            if ctrls.split(",").count(ctrl) or (ctrl == "" and ctrls == ""):
                try:
                    with open(os.path.join(root + path, name)) as f:
                        v = f.read().strip()
                except OSError:
                    continue
                if v != "max" and int(v) < 1 << 60:
                    return v
    return "none"


# ---- ps ----

class PS:
    def __init__(self, index, nps, dim):
        self.index, self.nps, self.dim = index, nps, dim
        self.lock = threading.Lock()
        self.incarnation = random.getrandbits(48)
        self.w = None  # the shard; None: uninitialised
        self.step = 0
        self.finished = False

    def handle(self, req):
        op = req.get("op")
        with self.lock:
            if op == "set":
                self.w, self.step = list(req["w"]), int(req.get("step", 0))
            elif op == "push" and self.w is not None:
                lr = 0.05
                self.w = [x - lr * g for x, g in zip(self.w, req["grad"])]
                if self.index == 0:
                    self.step += 1
            elif op == "finish":
                self.finished = True
            return {"inc": self.incarnation, "init": self.w is not None, "w": self.w,
                    "step": self.step, "finished": self.finished}


def serve_ps(task_index, cluster, dim):
    host, port = cluster["ps"][task_index].rsplit(":", 1)
    ps = PS(task_index, len(cluster["ps"]), dim)

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            for line in self.rfile:
                ans = ps.handle(json.loads(line))
                self.wfile.write((json.dumps(ans) + "\n").encode())
                self.wfile.flush()

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    # TF's gRPC server listens on 0.0.0.0:<its port>, not on its own name:
    # on Kubernetes that name resolves only once the pod is ready.
    srv = Server(("127.0.0.1" if host == "localhost" else "0.0.0.0", int(port)), Handler)
    log(f"ps {task_index}: serving {dim} parameters' shard on {host}:{port} (incarnation {ps.incarnation})")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    while True:
        time.sleep(0.1)
        with ps.lock:
            done = ps.finished
        if done:
            time.sleep(1.0)  # the workers' last pulls see it
            log(f"ps {task_index}: the chief finished the job")
            srv.shutdown()
            return


# ---- chief and workers ----

class Unavailable(Exception):
    """A ps cannot be reached or lost its variables (TF's UnavailableError /
    FailedPreconditionError)."""


class Conn:
    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.addr = (host, int(port))
        self.sock = None

    def call(self, req):
        try:
            if self.sock is None:
                self.sock = socket.create_connection(self.addr, timeout=5)
                self.file = self.sock.makefile("rwb")
            self.file.write((json.dumps(req) + "\n").encode())
            self.file.flush()
            line = self.file.readline()
            if not line:
                raise OSError("connection closed")
            return json.loads(line)
        except OSError as e:
            self.close()
            raise Unavailable(f"{self.addr[0]}:{self.addr[1]}: {e}")

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None


class Trainer:
    def __init__(self, cluster, dim):
        self.ps = [Conn(a) for a in cluster["ps"]]
        self.dim = dim
        self.truth = [((i * 7919) % 13) / 13.0 - 0.5 for i in range(dim)]

    def shard(self, i):
        return list(range(i, self.dim, len(self.ps)))

    def pull(self):
        answers = [c.call({"op": "pull"}) for c in self.ps]
        w = [0.0] * self.dim
        for i, a in enumerate(answers):
            if a["init"]:
                for j, x in zip(self.shard(i), a["w"]):
                    w[j] = x
        return w, answers

    def push(self, grad):
        step = None
        for i, c in enumerate(self.ps):
            a = c.call({"op": "push", "grad": [grad[j] for j in self.shard(i)]})
            if not a["init"]:
                raise Unavailable(f"ps {i} is not initialised")
            if i == 0:
                step = a["step"]
        return step

    def set_all(self, w, step):
        for i, c in enumerate(self.ps):
            c.call({"op": "set", "w": [w[j] for j in self.shard(i)], "step": step if i == 0 else 0})

    def gradient(self, w, seed):
        rnd = random.Random(seed)
        grad, loss = [0.0] * self.dim, 0.0
        for _ in range(16):
            x = [rnd.gauss(0, 1) for _ in range(self.dim)]
            err = sum(a * b for a, b in zip(w, x)) - sum(a * b for a, b in zip(self.truth, x))
            loss += err * err / 16
            for j in range(self.dim):
                grad[j] += 2 * err * x[j] / 16
        return grad, loss


def latest_checkpoint(ckpt_dir):
    path = os.path.join(ckpt_dir, "checkpoint.json") if ckpt_dir else ""
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def save_checkpoint(ckpt_dir, w, step):
    os.makedirs(ckpt_dir, exist_ok=True)
    tmp = os.path.join(ckpt_dir, ".checkpoint.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"w": w, "step": step}, f)
    os.replace(tmp, os.path.join(ckpt_dir, "checkpoint.json"))
    log(f"chief: checkpoint saved at step {step}")


def train(task_type, task_index, cluster, a):
    chief = task_type == "chief" or (task_type == "worker" and task_index == 0 and not cluster.get("chief"))
    me = f"{task_type} {task_index}"
    t = Trainer(cluster, a.dim)
    incarnations = None  # the ps incarnations the chief initialised
    last_ckpt = -1
    while True:
        try:
            w, answers = t.pull()
            if any(x["finished"] for x in answers):
                log(f"{me}: the job finished")
                return
            incs = [x["inc"] for x in answers]
            if chief and (incarnations != incs or not all(x["init"] for x in answers)):
                # (Re)create the session: restore or initialise every ps.
                ck = latest_checkpoint(a.ckpt_dir)
                if incarnations is not None:
                    log(f"chief: a ps restarted (incarnations {incarnations} -> {incs}): restoring the session")
                if ck is not None:
                    t.set_all(ck["w"], ck["step"])
                    log(f"chief: restored from checkpoint at step {ck['step']}")
                    last_ckpt = ck["step"]
                else:
                    t.set_all([0.0] * a.dim, 0)
                    log("chief: initialised the variables (no checkpoint)")
                incarnations = incs
                continue
            if not all(x["init"] for x in answers):
                raise Unavailable("waiting for the chief to initialise the variables")
            if answers[0]["step"] >= a.steps:
                if chief:
                    save_checkpoint(a.ckpt_dir, w, answers[0]["step"]) if a.ckpt_dir else None
                    for c in t.ps:
                        c.call({"op": "finish"})
                log(f"{me}: global step {answers[0]['step']} reached {a.steps}: done")
                return
            grad, loss = t.gradient(w, hash((task_type, task_index, answers[0]["step"])) & 0xFFFFFFFF)
            step = t.push(grad)
            log(f"loss = {loss:.4f}, step = {step}")
            if chief and a.ckpt_dir and step // a.ckpt_every > last_ckpt // a.ckpt_every and step > last_ckpt:
                save_checkpoint(a.ckpt_dir, w, step)
                last_ckpt = step
        except Unavailable as e:
            log(f"{me}: {e}; retrying")
            time.sleep(0.2)
            continue
        time.sleep(a.sleep)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--sleep", type=float, default=0.1)
    p.add_argument("--ckpt-dir", default="")
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--dim", type=int, default=8)
    a = p.parse_args()
    cfg = json.loads(os.environ["TF_CONFIG"])
    cluster, task = cfg["cluster"], cfg["task"]
    task_type, task_index = task["type"], int(task["index"])
    log(f"{task_type} {task_index}: TF_CONFIG cluster {json.dumps(cluster, sort_keys=True)}; memory limit = {memory_limit()}")
    if task_type == "ps":
        serve_ps(task_index, cluster, a.dim)
    elif task_type in ("chief", "worker"):
        train(task_type, task_index, cluster, a)
    else:
        sys.exit(f"unknown task type {task_type!r}")


if __name__ == "__main__":
    main()
