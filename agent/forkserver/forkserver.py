# kfelastic fork server: one interpreter per pod that has imported the
# preload modules (torch) and forks each worker from itself, so that a
# restart costs a fork instead of an interpreter start and the imports.
# agent/forkserver/forkserver.go starts it and says why it is built so. The
# protocol:
#
#   fd 3 is a Unix stream socket to the agent. The agent sends requests, each
#   a 4-byte big-endian length and a JSON object {"id", "argv", "env", "cwd"},
#   with the worker's stdout and stderr as two SCM_RIGHTS descriptors. The
#   server answers lines of JSON: {"t": "ready", "failed": {module: error}}
#   once the preloads are done; {"t": "forked", "id", "pid"} or
#   {"t": "forked", "id", "error"} per request; {"t": "exit", "pid", "status"} (the raw wait status) when a
#   worker it forked ends. EOF from the agent ends the server; its workers
#   die with it (PR_SET_PDEATHSIG), as they would with the agent.
#
# The forked child returns out of _serve() and runs the worker's script
# (_become) in this program's __main__ module, so that its end is the
# interpreter's own: an uncaught exception prints its traceback and exits 1,
# SystemExit exits with its code, and non-daemon threads and atexit
# handlers run as in `python SCRIPT`.


def _serve():
    import ctypes, gc, importlib, importlib.util, io, json, os, selectors, signal, socket, struct, sys, threading

    failed = {}
    for m in os.environ.pop("KFELASTIC_FORK_PRELOAD", "").split(","):
        if m:
            try:
                importlib.import_module(m)
            except Exception as e:  # the script will meet it again and say so
                failed[m] = repr(e)
    # torch 2.x imports torch._dynamo (with sympy and mpmath: ≈ 800 modules)
    # lazily, at a model's first forward or optimizer step: 1.3 s on an idle
    # 2-CPU machine, several under load, in every restarted worker. It
    # starts no thread; with torch preloaded, it is imported here too.
    if "torch" in sys.modules and importlib.util.find_spec("torch._dynamo") is not None:
        try:
            importlib.import_module("torch._dynamo")
        except Exception as e:
            failed["torch._dynamo"] = repr(e)
    libc = ctypes.CDLL(None, use_errno=True)
    me = os.getpid()
    sock = socket.socket(fileno=3)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    pending = b""
    fds = []
    gc.freeze()

    def say(**msg):
        sock.sendall(json.dumps(msg).encode() + b"\n")

    def threads():
        # Python's threads and the native ones (an OpenMP pool, a CUDA
        # runtime): a fork copies only the calling thread, and locks the
        # others held stay locked in the child.
        return max(threading.active_count(), len(os.listdir("/proc/self/task")))

    def unsafe():
        if threads() != 1:
            return f"the fork server runs {threads()} threads; forking it is unsafe"
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return "the fork server initialised CUDA; a forked child cannot use it"
        return None

    def reap():
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            say(t="exit", pid=pid, status=status)

    def expose(env):
        # /proc/PID/environ shows the memory the kernel put the environment
        # in at exec, which a fork inherits: the server's. The agent's sweep
        # (the attempt's mark) and whoever looks for a worker by its
        # LOCAL_RANK read it there, so the worker writes its own environment
        # over it, as setproctitle writes over argv. Nothing points into it
        # any more (os.environ.clear() unset every variable; putenv keeps
        # Python's own copies); the agent padded the server's environment
        # (KFELASTIC_FORK_PAD) so that a worker's fits. If it does not, the
        # server's stays, with its mark, which the agent sweeps too.
        try:
            with open("/proc/self/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            start, end = int(fields[47]), int(fields[48])  # env_start, env_end: fields 50, 51 of proc(5)
        except (OSError, IndexError, ValueError):
            return
        data = b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in env.items())
        if 0 < start < end and len(data) <= end - start:
            ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)

    def child(req, out, err):
        os.setpgid(0, 0)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the server
        if os.getppid() != me:
            os._exit(137)  # the server died before the prctl
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sel.close()
        sock.close()
        os.close(wake_r)
        os.close(wake_w)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        os.chdir(req["cwd"])
        # The worker's environment, wholesale: what it sees and what its
        # own children inherit (os.environ calls putenv and unsetenv).
        os.environ.clear()
        os.environ.update(req["env"])
        expose(req["env"])
        if os.environ.get("PYTHONUNBUFFERED"):
            # Python built its stdio for the server; -u's are unbuffered.
            for name in ("stdout", "stderr"):
                old = getattr(sys, name)
                new = io.TextIOWrapper(io.FileIO(old.fileno(), "wb", closefd=False), encoding=old.encoding,
                                       errors=old.errors, line_buffering=False, write_through=True)
                setattr(sys, name, new)
                setattr(sys, "__" + name + "__", new)
        # Python's random reseeds itself after a fork; numpy's global state
        # does not, and a fresh interpreter would have drawn a new seed.
        np_random = sys.modules.get("numpy.random")
        if np_random is not None:
            np_random.seed()
        return req

    say(t="ready", failed=failed)
    while True:
        for key, _ in sel.select():
            if key.fileobj == wake_r:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                reap()
                continue
            data, anc, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(2 * 4))
            if not data:
                os._exit(0)  # the agent is gone
            for level, kind, blob in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds += list(struct.unpack(f"{len(blob) // 4}i", blob[: len(blob) - len(blob) % 4]))
            pending += data
            while len(pending) >= 4 and len(pending) >= 4 + int.from_bytes(pending[:4], "big"):
                n = int.from_bytes(pending[:4], "big")
                req = json.loads(pending[4 : 4 + n])
                pending = pending[4 + n :]
                out, err = fds[0], fds[1]
                del fds[:2]
                why = unsafe()
                if why:
                    os.close(out)
                    os.close(err)
                    say(t="forked", id=req["id"], error=why)
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                # The child's collections then leave the server's objects,
                # and the pages they lie in, shared.
                gc.freeze()
                pid = os.fork()
                if pid == 0:
                    try:
                        return child(req, out, err)
                    except BaseException as e:
                        os.write(2, f"kfelastic fork server: the worker could not start: {e!r}\n".encode())
                        os._exit(127)
                try:
                    os.setpgid(pid, pid)  # the child does too; whichever is first
                except OSError:
                    pass
                os.close(out)
                os.close(err)
                say(t="forked", id=req["id"], pid=pid)


def _become(argv):
    # Run the worker as `python ARGV` would, in the real __main__ module
    # (pickle and multiprocessing find its classes there).
    import os, runpy, sys
    import __main__

    if argv[0] == "-m":
        # python -m MODULE: sys.path[0] is the working directory; runpy sets
        # sys.argv[0] to the module's file, as python -m does with it.
        sys.argv = argv[1:]
        sys.path[0] = os.getcwd()
        run = getattr(runpy, "_run_module_as_main", None)
        if run is not None:
            return run(argv[1])
        return runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    # python SCRIPT: sys.argv as given, sys.path[0] the script's folder with
    # symlinks resolved, __file__ absolute (Python 3.9+: joined to the
    # working directory, not normalised).
    sys.argv = argv
    path = os.path.join(os.getcwd(), argv[0])
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    import zipfile
    from importlib.machinery import SourceFileLoader

    if os.path.isdir(path) or zipfile.is_zipfile(path):
        return runpy.run_path(argv[0], run_name="__main__")  # with a __main__.py

    g = __main__.__dict__
    for k in list(g):  # this program's own names
        if k not in ("__name__", "__builtins__"):
            del g[k]
    g.update(__file__=path, __cached__=None, __doc__=None, __package__=None, __spec__=None,
             __loader__=SourceFileLoader("__main__", path))
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    exec(code, g)


_become(_serve()["argv"])
