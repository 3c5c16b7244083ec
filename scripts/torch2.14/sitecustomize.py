# Debian's torch 2.x is built without libuv, yet TCPStore's constructor asks
# for it by default (torch elastic's c10d backend passes nothing, env://
# passes True) and fails even as a client; USE_LIBUV=0 reaches only env://.
# scripts/torch-python shows this file as the root's sitecustomize.py
# (Debian's only installs apport's hook, which a minbase root does not have),
# so that every interpreter in it has it and the environment is left as the
# caller gave it: once torch.distributed is imported (not before: importing
# torch at every interpreter's start would cost a second), every TCPStore
# uses the classic backend, the only one this build has. The client's bytes
# are the same either way.
import sys


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
