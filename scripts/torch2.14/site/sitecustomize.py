# Debian's torch 2.x is built without libuv, yet TCPStore's constructor asks
# for it by default (torch elastic's c10d backend passes nothing, env://
# passes True) and fails even as a client; USE_LIBUV=0 reaches only env://.
# scripts/torch-python puts this folder first on PYTHONPATH: once
# torch.distributed is imported (not before: importing torch at every
# interpreter's start would cost a second), every TCPStore uses the classic
# backend, the only one this build has. The client's bytes are the same
# either way. Debian's own sitecustomize runs first.
import os
import sys

_debian = "/etc/python%d.%d/sitecustomize.py" % sys.version_info[:2]
if os.path.exists(_debian):
    with open(_debian) as _f:
        exec(compile(_f.read(), _debian, "exec"))


def _classic(dist):
    if not dist.is_available():
        return
    base = dist.TCPStore

    class TCPStore(base):
        def __init__(self, *args, **kwargs):
            kwargs["use_libuv"] = False
            super().__init__(*args, **kwargs)

    TCPStore.__name__ = TCPStore.__qualname__ = "TCPStore"
    # torch.distributed's own modules imported the class already.
    for name, mod in list(sys.modules.items()):
        if (name == "torch.distributed" or name.startswith("torch.distributed.")) and getattr(mod, "TCPStore", None) is base:
            mod.TCPStore = TCPStore


class _AfterImport:
    """Patches torch.distributed once its module has run."""

    def find_spec(self, name, path, target=None):
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _classic(module)

        spec.loader.exec_module = exec_module
        return spec


if "torch.distributed" in sys.modules:
    _classic(sys.modules["torch.distributed"])
else:
    sys.meta_path.insert(0, _AfterImport())
