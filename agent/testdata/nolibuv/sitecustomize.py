# Debian's torch 2.x is built without libuv, yet TCPStore's constructor asks
# for it by default (torch elastic's c10d backend passes nothing, env://
# passes True), and fails even as a client. The store relay's tests put this
# folder on PYTHONPATH for that torch only: every TCPStore uses the classic
# backend, the only one this build has; the client is the same either way.
import sys

import torch.distributed as dist

if dist.is_available():
    _TCPStore = dist.TCPStore

    class TCPStore(_TCPStore):
        def __init__(self, *args, **kwargs):
            kwargs["use_libuv"] = False
            super().__init__(*args, **kwargs)

    # torch.distributed's own modules imported the class already.
    for name, mod in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(mod, "TCPStore", None) is _TCPStore:
            mod.TCPStore = TCPStore
