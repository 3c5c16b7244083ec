# kfelastic's hook in the Python of a --launcher command (agent/torchhook/
# torchhook.go says why and how it is installed). Python imports it as
# `sitecustomize` at interpreter start, before the command's own code,
# because the agent put its folder first on the command's PYTHONPATH.
#
# In the first interpreter that sees its variables (the command:
# pyflyte-execute, a script calling elastic_launch; not a launcher that only
# runs it as a child, pyflyte-fast-execute) it
#   - with KFELASTIC_SPAWN_PRELOAD (modules), except under torchrun, whose
#     workers are subprocesses, starts multiprocessing's forkserver at once,
#     which imports those modules and torch._dynamo beside the command's
#     own start, and
#     makes torch elastic's MultiprocessContext with start_method "spawn"
#     (flytekit's default) start its workers from that forkserver instead,
#     each with the command's whole environment as it is when the workers
#     start (what a spawned interpreter inherits), and imports torch._dynamo
#     in the command too while its first workers train (torch's log
#     formatter imports it at the first failed worker's log);
#   - with KFELASTIC_RDZV_POLL (seconds; set when the rendezvous store is the
#     kfelastic master's, through the agent's relay), has c10d's rendezvous
#     poll that store that often while it waits, instead of once a second;
#   - takes the variables and this folder out of the environment, so that no
#     interpreter below the command does any of it again.
# Everywhere it then runs the sitecustomize it hides (Debian's, an image's).
# It never fails the command: whatever goes wrong leaves spawn as it was.

import os
import sys

_ENV = "KFELASTIC_SPAWN_PRELOAD"
_TARGET = "torch.distributed.elastic.multiprocessing.api"
_RDZV = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
_POLL_ENV = "KFELASTIC_RDZV_POLL"
_HERE = os.path.dirname(os.path.abspath(__file__))
# Launchers that run the real command as a child; the hook waits for it.
_PASS_ON = ("pyflyte-fast-execute",)


def _say(msg):
    try:
        sys.stderr.write(f"kfelastic torch hook: {msg}\n")
        sys.stderr.flush()
    except Exception:
        pass


def _argv0():
    argv = getattr(sys, "orig_argv", None) or getattr(sys, "argv", None) or [""]
    # python [-flags] SCRIPT|-m MODULE|-c CMD …: the first that is not a flag.
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-m", "-c"):
            return argv[i + 1] if i + 1 < len(argv) else ""
        if a in ("-W", "-X"):  # flags with a value
            i += 2
            continue
        if not a.startswith("-"):
            return a
        i += 1
    return argv[0]


def _torchrun(prog):
    # torchrun runs a script or a binary, with subprocess, never with
    # multiprocessing: a forkserver would only cost an interpreter.
    return os.path.basename(prog) == "torchrun" or prog == "torch.distributed.run"


def _without_here(path):
    return os.pathsep.join(p for p in path.split(os.pathsep) if p and os.path.abspath(p) != _HERE)


def _patch(api):
    cls = getattr(api, "MultiprocessContext", None)
    if cls is None or getattr(cls, "_kfelastic_forkserver", False):
        return
    import inspect

    init = cls.__init__
    sig = inspect.signature(init)

    def __init__(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        a = bound.arguments
        if a.get("start_method") == "spawn" and isinstance(a.get("envs"), dict):
            a["start_method"] = "forkserver"
            # A forkserver's child has the server's environment, from the
            # command's start; a spawned worker the command's of now.
            base = dict(os.environ)
            a["envs"] = {r: {**base, **e} for r, e in a["envs"].items()}
        init(*bound.args, **bound.kwargs)

    __init__.__wrapped__ = init
    cls.__init__ = __init__
    start = cls._start

    def _start(self):
        start(self)
        if getattr(self, "start_method", "") == "forkserver":
            _warm_launcher()

    cls._start = _start
    cls._kfelastic_forkserver = True


_warming = []


def _warm_launcher():
    # torch 2.x's log formatter imports torch._dynamo (≈800 modules, 1.3 s
    # on an idle CPU) the first time it formats an exception: in torch's
    # agent that is the log of the first failed worker, so every restart
    # after a failure waited for it. Import it while the workers train, once,
    # in a daemon thread (the agent's main thread only sleeps and polls
    # then; the forkserver, not this process, starts the workers).
    if _warming or "torch._dynamo" in sys.modules:
        return
    import importlib
    import importlib.util
    import threading

    try:
        if importlib.util.find_spec("torch._dynamo") is None:
            return
    except Exception:
        return

    def run():
        try:
            importlib.import_module("torch._dynamo")
        except Exception:
            pass

    t = threading.Thread(target=run, name="kfelastic-warm-dynamo", daemon=True)
    _warming.append(t)
    t.start()


def _patch_poll(rdzv, seconds):
    # c10d's rendezvous reads the shared state once a second while it waits
    # for other nodes (its SYNC action: _delay(seconds=1)), to spare a store
    # that torch hosts in one node's agent. Its store here is the kfelastic
    # master's, through the agent's relay, built for far more reads: poll it
    # every `seconds`, so that a node sees the round complete as soon as the
    # last node joined, not up to a second later.
    delay = getattr(rdzv, "_delay", None)
    if delay is None or getattr(delay, "_kfelastic", False):
        return
    import time

    def _delay(seconds=0, _poll=seconds, _orig=delay):
        if seconds == 1:
            time.sleep(_poll)
        else:
            _orig(seconds=seconds)

    _delay._kfelastic = True
    rdzv._delay = _delay


_PATCHES = {}


class _Finder:
    """Patches torch's modules in _PATCHES when they are imported."""

    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.pop(name, None)
        if patch is None:
            return None
        if not _PATCHES:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        # The module's spec as the finders after this one give it (another
        # sitecustomize's may patch it too).
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is not self and find is not None:
                spec = find(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                patch(module)
            except Exception as e:
                _say(f"{name} left as it is: {e!r}")

        spec.loader.exec_module = exec_module
        return spec


def _start_forkserver(preload):
    import multiprocessing
    from multiprocessing import context, forkserver

    modules = [m for m in preload.split(",") if m]
    if "torch" in modules and "torch._dynamo" not in modules:
        # torch 2.x imports it at a model's first forward (≈800 modules);
        # a failed preload is skipped by the forkserver.
        modules.append("torch._dynamo")
    multiprocessing.set_forkserver_preload(modules)
    # Starting the server fixes multiprocessing's default start method as a
    # side effect (its preparation data asks for it); undo that, so that the
    # command may still choose its own.
    default = context._default_context
    chosen = default._actual_context
    try:
        forkserver.ensure_running()
    finally:
        default._actual_context = chosen


def _install():
    preload, poll = os.environ.get(_ENV), os.environ.get(_POLL_ENV)
    if preload is None and poll is None:
        return
    prog = _argv0()
    if os.path.basename(prog) in _PASS_ON:
        return
    os.environ.pop(_ENV, None)
    os.environ.pop(_POLL_ENV, None)
    rest = _without_here(os.environ.get("PYTHONPATH", ""))
    if rest:
        os.environ["PYTHONPATH"] = rest
    else:
        os.environ.pop("PYTHONPATH", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    if poll:
        _PATCHES[_RDZV] = lambda m: _patch_poll(m, float(poll))
    if preload is not None and not _torchrun(prog):
        try:
            _start_forkserver(preload)
            _PATCHES[_TARGET] = _patch
        except Exception as e:
            _say(f"no forkserver, workers keep torch's spawn: {e!r}")
    for name, patch in list(_PATCHES.items()):
        if name in sys.modules:
            del _PATCHES[name]
            patch(sys.modules[name])
    if _PATCHES:
        sys.meta_path.insert(0, _Finder())


def _chain():
    # Run the sitecustomize this one hides: the next on sys.path.
    import importlib

    me = sys.modules.get("sitecustomize")
    saved = sys.path[:]
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
        del sys.modules["sitecustomize"]
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as e:
        if e.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = me
    finally:
        sys.path[:] = saved


try:
    _install()
except Exception as e:  # never fail the command
    _say(f"not installed: {e!r}")
_chain()
