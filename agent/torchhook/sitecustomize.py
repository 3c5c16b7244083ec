# kfelastic's hook in the Python of a --launcher command (agent/torchhook/
# torchhook.go says why and how it is installed). Python imports it as
# `sitecustomize` at interpreter start, before the command's own code,
# because the agent put its folder first on the command's PYTHONPATH.
#
# In the first interpreter that sees its variables (the command:
# pyflyte-execute, a script calling elastic_launch; not a launcher that only
# runs it as a child, pyflyte-fast-execute) it
#   - with KFELASTIC_SPAWN_PRELOAD (modules), except under torchrun, whose
#     workers are subprocesses, starts multiprocessing's forkserver once the
#     command has imported torch (or the list's first module), as a fork
#     of the command: torch is imported once in the pod, and the server
#     has whatever else the command had imported (a fresh interpreter,
#     importing torch beside the command, where the command runs threads
#     then); the server imports the rest of the list and torch._dynamo,
#     and
#     makes torch elastic's MultiprocessContext with start_method "spawn"
#     (flytekit's default) start its workers from that forkserver instead,
#     each with the command's environment, umask and rlimits as they are
#     when it starts (what a spawned interpreter inherits; spawn stays where
#     that cannot be), and imports torch._dynamo
#     in the command too while its first workers train (torch's log
#     formatter imports it at the first failed worker's log);
#   - with KFELASTIC_RDZV_POLL (seconds; set when the rendezvous store is the
#     kfelastic master's, through the agent's relay), has c10d's rendezvous
#     poll that store that often while it waits, instead of once a second;
#   - with KFELASTIC_RDZV_ROUND_FILE (a file the agent keeps: the master's
#     round, "<nodes> <round>"), has c10d's rendezvous complete as soon as
#     it has that many participants, instead of waiting out its last call
#     (last_call_timeout, 30 s) for nodes up to max_nodes the master knows
#     are not coming;
#   - with KFELASTIC_DRAIN_ERRORS, reads each worker's error queue as the
#     worker writes it (torch.multiprocessing's ProcessContext, torch 1.x):
#     a spawned worker puts its whole traceback into a pipe before it
#     exits, and torch reads it only after the exit, so a traceback past
#     the pipe's 64 KiB (a tensor printed in an exception) blocked the
#     worker, and the job, for ever (torch 2.x writes it to a file);
#   - takes the variables and this folder out of the environment, so that no
#     interpreter below the command does any of it again; a fork of the
#     command forgets the forkserver.
# Below a Python that ran without it (python -I, -E, -S as the command) it
# only takes itself out of the environment (KFELASTIC_HOOK_PARENT).
# Everywhere it then runs the sitecustomize it hides (Debian's, an image's).
# It never fails the command: whatever goes wrong leaves spawn as it was.

import os
import sys

_ENV = "KFELASTIC_SPAWN_PRELOAD"
_TARGET = "torch.distributed.elastic.multiprocessing.api"
_RDZV = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
_POLL_ENV = "KFELASTIC_RDZV_POLL"
_DRAIN_ENV = "KFELASTIC_DRAIN_ERRORS"
_ROUND_ENV = "KFELASTIC_RDZV_ROUND_FILE"
_SPAWN = "torch.multiprocessing.spawn"
_STORE = "torch.distributed.rendezvous"
# The hook's forkserver's name (/proc/PID/comm; torchhook.ServerComm).
_SERVER_COMM = "kfe-forkserver"
# The pid of the process that set the variables (the agent, or a launcher in
# _PASS_ON that passes them on): the hook runs only in the topmost Python
# below it.
_PARENT_ENV = "KFELASTIC_HOOK_PARENT"
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
    # Empty entries stay: each is the current folder for Python.
    return os.pathsep.join(p for p in path.split(os.pathsep) if not p or os.path.abspath(p) != _HERE)


def _ppid(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def _is_python(pid):
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return os.path.basename(exe).startswith("python") or exe == os.path.realpath(sys.executable)


def _below_python(top):
    # Whether a Python lies between this interpreter and `top`, the process
    # that set the variables (or this one is not below it at all). That
    # Python did not take them out, so it ran without the hook: `python -I`,
    # `-E` or `-S`, or a hashbang with them. It was the command; the hook is
    # then nowhere, rather than in each of its Python children (a forkserver
    # importing torch in every one).
    pid = os.getppid()
    for _ in range(256):
        if pid == top:
            return False
        if pid <= 1 or _is_python(pid):
            return True
        try:
            pid = _ppid(pid)
        except (OSError, ValueError, IndexError):
            return True
    return True


def _patch(api):
    _refork()
    cls = getattr(api, "MultiprocessContext", None)
    if cls is None or getattr(cls, "_kfelastic_forkserver", False):
        return
    import inspect

    init = cls.__init__
    sig = inspect.signature(init)

    def __init__(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        a = bound.arguments
        try:
            why = _forkable() if a.get("start_method") == "spawn" and _ours() else None
        except Exception as e:
            why = repr(e)
        if why is not None:
            if why:
                _say(f"workers spawned: {why} after the forkserver started")
            else:
                # Each worker gets the command's environment, umask and
                # rlimits as they are when it starts (_LaunchState).
                a["start_method"] = "forkserver"
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


def _ours():
    # Whether multiprocessing's forkserver here is still the hook's: not in
    # a fork of the command (forget, in _started).
    from multiprocessing import forkserver

    return _server.get("pid") is not None and forkserver._forkserver._forkserver_pid == _server["pid"]


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


def _round_nodes(path):
    # The number of nodes in the master's round, from the file the agent
    # keeps; None when there is none (yet) or it cannot be read.
    try:
        with open(path) as f:
            nodes = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return nodes if nodes > 0 else None


def _patch_last_call(rdzv, path):
    # c10d's rendezvous with min_nodes participants waits out its last call
    # (last_call_timeout) for more, up to max_nodes, before it completes:
    # 30 s in every round of an elastic task whose nnodes leaves room
    # ("2:3"), though the master decided the round already. Its join
    # operation is taught that a participant may complete the rendezvous
    # once it has as many participants as the master's round: the deadline
    # the last call set is then over. Everything else is torch's own (a
    # closed or completed rendezvous, the wait list, the join timeout).
    op = getattr(rdzv, "_RendezvousJoinOp", None)
    call = getattr(op, "__call__", None)
    if call is None or getattr(call, "_kfelastic", False):
        return

    def __call__(self, ctx, deadline, _orig=call):
        try:
            state = ctx.state
            if (
                not state.closed
                and not state.complete
                and state.deadline is not None
                and ctx.node in state.participants
                and len(state.participants) >= ctx.settings.min_nodes
            ):
                nodes = _round_nodes(path)
                if nodes is not None and len(state.participants) >= nodes:
                    state.deadline = state.deadline.min.replace(tzinfo=state.deadline.tzinfo)
        except Exception:
            pass
        return _orig(self, ctx, deadline)

    __call__._kfelastic = True
    op.__call__ = __call__


def _patch_rdzv(rdzv, poll, round_file):
    if poll:
        _patch_poll(rdzv, float(poll))
    if round_file:
        _patch_last_call(rdzv, round_file)


class _DrainedQueue:
    """A worker's error queue (a SimpleQueue) read by a thread as the
    worker writes it, so that a traceback larger than the pipe never
    blocks the worker's exit; torch's join then finds it here. The thread
    ends with the worker."""

    def __init__(self, q, sentinel):
        import threading

        self._q, self._items, self._done = q, [], threading.Event()
        threading.Thread(target=self._read, args=(sentinel,), name="kfelastic-error-queue", daemon=True).start()

    def _read(self, sentinel):
        from multiprocessing.connection import wait

        try:
            # A message, or the worker's end (then whatever it wrote).
            wait([self._q._reader, sentinel])
            if self._q._reader.poll(0):
                self._items.append(self._q.get())
        except (EOFError, OSError):
            pass
        finally:
            self._done.set()

    def _settle(self):
        # torch looks once the worker exited; the thread is then done or
        # about to be (a message written whole is read at once).
        self._done.wait(5)

    def empty(self):
        self._settle()
        return not self._items

    def get(self):
        self._settle()
        return self._items.pop(0) if self._items else self._q.get()

    def __getattr__(self, name):
        return getattr(self._q, name)


def _patch_drain(spawn):
    # torch 2.x (error_files) writes the traceback to a file: nothing to do.
    cls = getattr(spawn, "ProcessContext", None)
    if cls is None or getattr(cls, "_kfelastic_drained", False):
        return
    import inspect

    if "error_queues" not in inspect.signature(cls.__init__).parameters:
        return
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.error_queues = [_DrainedQueue(q, p.sentinel) for q, p in zip(self.error_queues, self.processes)]

    __init__.__wrapped__ = init
    cls.__init__ = __init__
    cls._kfelastic_drained = True


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


def _preload_list(preload):
    modules = [m for m in preload.split(",") if m]
    if "torch" in modules and "torch._dynamo" not in modules:
        # torch 2.x imports it at a model's first forward (≈800 modules);
        # a failed preload is skipped by the forkserver.
        modules.append("torch._dynamo")
    return modules


def _plan_forkserver(preload):
    # The forkserver starts when the command's own import of torch (or of
    # the list's first module, where torch is not in it) is done, as a
    # fork of the command: torch is imported once in the pod, not twice
    # side by side on the same CPUs (under a 1-CPU limit that took the
    # replacement's start from 1.4 s to 5 s). A command that never imports
    # torch starts none.
    modules = _preload_list(preload)
    first = "torch" if "torch" in modules or not modules else modules[0]
    if first in sys.modules or not modules:
        _server_after(first, modules)
    else:
        _PATCHES[first] = lambda m: _server_after(first, modules)


def _server_after(imported, modules):
    why = _unforkable()
    if not why:
        try:
            _fork_server(modules, imported)
            _server["forked"] = modules
        except Exception as e:
            why = repr(e)
    if why:
        # A fresh interpreter, as multiprocessing starts it: it imports
        # torch again, now after the command's import rather than beside it.
        _say(f"the forkserver imports torch again: {why}")
        _spawn_server(modules)
    _started()


def _refork():
    # When the command imports torch elastic's multiprocessing (the
    # launcher's modules, just before it starts workers; a script's imports
    # below `import torch`), a server forked at torch's import that has
    # served nothing yet is forked again, if the command still runs no
    # thread: the workers then find those modules imported too (≈0.5 s of
    # each worker's start under a 1-CPU limit). The old one is stopped.
    modules = _server.get("forked")
    if modules is None or _server.get("used") or _unforkable():
        return
    import signal
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_pid != _server.get("pid"):
        return
    # The old server's state, in an object of its own that multiprocessing
    # can stop.
    old = type(server)()
    old.__dict__.update(server.__dict__)
    server._forkserver_pid = None
    try:
        # Not where the command touched CUDA since (its fork could not use
        # it): the old server stays then.
        _fork_server(modules, _TARGET, check=True)
    except Exception:
        server.__dict__.update(old.__dict__)
        return
    try:
        os.kill(old._forkserver_pid, signal.SIGKILL)
        old._stop_unlocked()
    except OSError:
        pass
    _server.update(pid=server._forkserver_pid, limits=_limits(), ids=_ids())


def _unforkable():
    # Why the command cannot be forked into the server now, or "": a
    # thread (another thread may hold a lock the fork would keep locked; a
    # Python 3.12+ warning), or an import off the main thread (the server
    # handles signals).
    import threading

    if threading.current_thread() is not threading.main_thread():
        return "torch was imported off the main thread"
    try:
        threads = len(os.listdir("/proc/self/task"))  # Python's and native ones
    except OSError:
        threads = threading.active_count()
    return f"the command runs {threads} threads" if threads != 1 else ""


def _fork_server(modules, imported, check=False):
    # multiprocessing's ForkServer.ensure_running, with a fork of this
    # process where it spawns a fresh interpreter: the same socket, alive
    # pipe and (Python 3.14) authentication key, and forkserver.main.
    import inspect
    import socket
    from multiprocessing import connection, forkserver, resource_tracker, util

    server = forkserver._forkserver
    auth = "authkey_r" in inspect.signature(forkserver.main).parameters
    with server._lock:
        resource_tracker.ensure_running()
        if server._forkserver_pid is not None:
            raise RuntimeError("multiprocessing's forkserver runs already")
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()
            key, key_r = None, None
            if auth:
                key = os.urandom(getattr(forkserver, "_AUTHKEY_LEN", 32))
                key_r, key_w = os.pipe()
                os.write(key_w, key)  # far less than a pipe holds
                os.close(key_w)
            ready_r, ready_w = os.pipe() if check else (None, None)
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except Exception:
                    pass
            try:
                pid = os.fork()
            except BaseException:
                for fd in (alive_r, alive_w, key_r, ready_r, ready_w):
                    if fd is not None:
                        os.close(fd)
                raise
            if pid == 0:
                try:
                    if ready_w is not None:
                        os.close(ready_r)
                        bad = _bad_fork()
                        os.write(ready_w, b"0" if bad else b"1")
                        os.close(ready_w)
                        if bad:
                            os._exit(0)
                    _serve(listener.fileno(), alive_r, key_r, modules, imported)
                finally:
                    os._exit(0)
            os.close(alive_r)
            if key_r is not None:
                os.close(key_r)
            if ready_r is not None:
                os.close(ready_w)
                try:
                    ok = os.read(ready_r, 1) == b"1"
                finally:
                    os.close(ready_r)
                if not ok:
                    os.close(alive_w)
                    os.waitpid(pid, 0)
                    raise RuntimeError("the command initialized CUDA")
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
        if auth:
            server._forkserver_authkey = key


def _bad_fork():
    # Whether this fork cannot use CUDA: the command had initialized it.
    cuda = sys.modules.get("torch.cuda")
    try:
        return bool(cuda is not None and cuda._is_in_bad_fork())
    except Exception:
        return False


def _serve(listener_fd, alive_r, key_r, modules, imported):
    # In the fork: become what multiprocessing's spawned forkserver is, a
    # fresh interpreter's state with torch imported, and serve.
    import gc
    import signal
    import types
    from multiprocessing import forkserver

    for finder in [f for f in sys.meta_path if isinstance(f, _Finder)]:
        sys.meta_path.remove(finder)
    _PATCHES.clear()
    # multiprocessing's own forkserver state as a fresh interpreter has it
    # (the parent holds its lock while it forks).
    server = forkserver._forkserver
    server.__dict__.update(type(server)().__dict__)
    # The module whose import just ran is whole; the modules importing it
    # are not, nor is the command's __main__: a worker imports those
    # afresh, as a spawned one would (its function may lie below the
    # import of torch).
    spec = getattr(sys.modules.get(imported), "__spec__", None)
    if spec is not None:
        spec._initializing = False
    partial = [n for n, m in list(sys.modules.items()) if getattr(getattr(m, "__spec__", None), "_initializing", False)]
    installed = _installed_dirs()
    # Those of the installation the server imports again itself (torch's
    # launcher, imported around torch elastic's multiprocessing).
    again = [n for n in partial if n != "__main__" and _installed(sys.modules[n], installed)]
    # Only the Python installation's whole modules stay (the standard
    # library, site- and dist-packages: torch, flytekit in an image): a
    # worker imports the user's modules afresh, as a spawned one does, so
    # that what they do at their import (a pid, a file, a random seed) is
    # the worker's own.
    for name, module in list(sys.modules.items()):
        half = any(name == p or name.startswith(p + ".") for p in partial)
        if half or name != "sitecustomize" and not _installed(module, installed):
            del sys.modules[name]
    sys.modules.pop("__mp_main__", None)
    sys.modules["__main__"] = types.ModuleType("__main__")
    gc.collect()
    # Named so that the agent tells it from the command's workers (its
    # command line is the command's); each worker takes the name back.
    try:
        with open("/proc/self/comm") as f:
            comm = f.read().strip()
        with open("/proc/self/comm", "w") as f:
            f.write(_SERVER_COMM)

        def _rename():
            try:
                with open("/proc/self/comm", "w") as f:
                    f.write(comm)
            except OSError:
                pass

        os.register_at_fork(after_in_child=_rename)
    except OSError:
        pass
    # Signal handlers as after exec: the command's own go back to the
    # default (ignored signals stay ignored).
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
            if callable(handler) and handler is not signal.default_int_handler:
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    # The command's other files are not the server's: each stays open on
    # /dev/null, so that an object of the command's closing its number
    # later closes nothing of a worker's.
    keep = {0, 1, 2, listener_fd, alive_r, key_r}
    null = os.open(os.devnull, os.O_RDWR)
    for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
        if fd not in keep and fd != null:
            try:
                os.dup2(null, fd)
            except OSError:
                pass
    os.close(null)
    # What the server's workers are taught (each a fork of it).
    if _STORE in sys.modules:
        _patch_store_wait(sys.modules[_STORE])
    else:
        _PATCHES[_STORE] = _patch_store_wait
        sys.meta_path.insert(0, _Finder())
    kwargs = {"authkey_r": key_r} if key_r is not None else {}
    preload = [m for m in dict.fromkeys(modules + again) if m not in sys.modules]
    forkserver.main(listener_fd, alive_r, preload, **kwargs)


def _installed_dirs():
    import site
    import sysconfig

    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    try:
        dirs.update(site.getsitepackages())
    except Exception:
        pass
    return tuple(os.path.join(os.path.abspath(d), "") for d in dirs)


def _installed(module, dirs):
    # Whether a module comes from the Python installation (builtins too).
    file = getattr(module, "__file__", None)
    files = [file] if file else list(getattr(module, "__path__", None) or [])
    return all(os.path.abspath(f).startswith(dirs) for f in files if isinstance(f, str))


def _patch_store_wait(rendezvous):
    # A worker's process group starts at torch's env:// rendezvous: rank 0
    # hosts the group's TCPStore, the others connect to it, and on torch
    # 1.13 a client whose connection is refused, because rank 0 in another
    # pod has not listened yet, waits a whole second before it tries again
    # (a second of every restart). The hook's workers wait for the
    # listener themselves, trying every 20 ms, then let torch connect.
    create = getattr(rendezvous, "_create_c10d_store", None)
    if create is None or getattr(create, "_kfelastic", False):
        return

    def _create_c10d_store(hostname, port, rank, world_size, timeout, *args, **kwargs):
        if rank != 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            _await_listener(hostname, port, timeout)
        return create(hostname, port, rank, world_size, timeout, *args, **kwargs)

    _create_c10d_store._kfelastic = True
    rendezvous._create_c10d_store = _create_c10d_store


def _await_listener(host, port, timeout):
    # Until host:port accepts a connection, at most the store's timeout
    # (10 s at most): torch reports whatever happens next.
    import socket
    import time

    try:
        limit = min(timeout.total_seconds(), 10.0)
    except Exception:
        limit = 10.0
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except ConnectionRefusedError:
            time.sleep(0.02)
        except OSError:
            return


def _spawn_server(modules):
    import multiprocessing
    from multiprocessing import context, forkserver

    # The command's own preload list comes back in a fork of it (forget).
    _server["preload"] = (forkserver._forkserver._preload_modules, modules)
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


def _started():
    from multiprocessing import forkserver, spawn

    server = forkserver._forkserver
    _server.update(pid=server._forkserver_pid, limits=_limits(), ids=_ids())

    def forget():
        # A fork of the command (torch's start_method "fork", os.fork) is
        # not the server's parent: multiprocessing there would wait for it
        # (ChildProcessError) and send it requests. It starts its own, as it
        # would without the hook, and its workers are not the hook's.
        if server._forkserver_pid != _server.get("pid"):
            return
        try:
            os.close(server._forkserver_alive_fd)
        except OSError:
            pass
        before, ours = _server.get("preload", (None, None))
        preload = before if server._preload_modules is ours else server._preload_modules
        server.__dict__.update(type(server)().__dict__)
        server._preload_modules = preload

    os.register_at_fork(after_in_child=forget)
    # Each forked worker takes the command's state of the moment, as a
    # spawned interpreter would: its preparation data carries it.
    get = spawn.get_preparation_data

    def get_preparation_data(name):
        data = get(name)
        data["kfelastic_launch_state"] = _LaunchState()
        _server["used"] = True
        return data

    spawn.get_preparation_data = get_preparation_data


# The hook's forkserver: its pid, and the rlimits and ids it was started
# with (the command's then).
_server = {}


def _limits():
    import resource

    limits = {}
    for n in dir(resource):
        if n.startswith("RLIMIT_"):
            try:
                limits[n] = resource.getrlimit(getattr(resource, n))
            except (ValueError, OSError):
                pass
    return limits


def _ids():
    return os.getresuid(), os.getresgid(), sorted(os.getgroups())


def _umask():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _forkable():
    # Why a fork of the hook's forkserver cannot be what a spawned worker
    # would be now, or "": the command raised a hard rlimit (a child of the
    # server cannot) or changed its ids since the server started.
    if _ids() != _server.get("ids"):
        return "the command changed its user or groups"
    inf = -1  # resource.RLIM_INFINITY
    for n, (_, hard) in _limits().items():
        was = _server["limits"].get(n, (inf, inf))[1]
        if was != inf and (hard == inf or hard > was):
            return f"the command raised {n}"
    return ""


# Run in the forkserver's child as it unpickles its preparation data, before
# it imports the command's main module: the command's environment, umask and
# rlimits of the moment of the request. Only there: a spawned child has them.
_APPLY = r"""
import os, resource, sys
if os.getppid() == server:
    os.environ.clear()
    os.environ.update(env)
    os.umask(umask)
    for n, want in limits.items():
        try:
            if resource.getrlimit(getattr(resource, n)) != want:
                resource.setrlimit(getattr(resource, n), want)
        except (AttributeError, ValueError, OSError) as e:
            sys.stderr.write(f"kfelastic torch hook: the worker keeps its {n}: {e!r}\n")
"""


class _LaunchState:
    """The command's state, pickled when a forkserver request is sent."""

    def __reduce__(self):
        state = {"server": _server.get("pid"), "env": dict(os.environ), "umask": _umask(), "limits": _limits()}
        return (exec, (_APPLY, state))


def _take_out():
    # The variables and this folder out of the environment and sys.path:
    # nothing below this interpreter sees the hook.
    for name in (_ENV, _POLL_ENV, _DRAIN_ENV, _ROUND_ENV, _PARENT_ENV):
        os.environ.pop(name, None)
    rest = _without_here(os.environ.get("PYTHONPATH", ""))
    if rest:
        os.environ["PYTHONPATH"] = rest
    else:
        os.environ.pop("PYTHONPATH", None)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def _install():
    preload, poll, drain = os.environ.get(_ENV), os.environ.get(_POLL_ENV), os.environ.get(_DRAIN_ENV)
    round_file = os.environ.get(_ROUND_ENV)
    if preload is None and poll is None and not drain and not round_file:
        return
    top = os.environ.get(_PARENT_ENV)
    if top and _below_python(int(top)):
        _take_out()
        return
    prog = _argv0()
    if os.path.basename(prog) in _PASS_ON:
        if top:
            os.environ[_PARENT_ENV] = str(os.getpid())
        return
    _take_out()
    if poll or round_file:
        _PATCHES[_RDZV] = lambda m: _patch_rdzv(m, poll, round_file)
    if drain:
        _PATCHES[_SPAWN] = _patch_drain
    if preload is not None and not _torchrun(prog):
        try:
            _plan_forkserver(preload)
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
