"""What runs the user's code: DataParallel simulated in one process, DDP on N CPU ranks, GPUs emulated.

    from dplint import runtime

    with runtime.checking(devices=4):
        nn.DataParallel(model)(batch)  # scattered, replicated, applied and gathered as on 4 GPUs

- `dataparallel/`: DataParallel's forward checked as it runs, on simulated devices;
- `distributed/`: the rank harness of `dplint run` and the pytest `ranks` marker (a real gloo group);
- `devices`: the logical GPUs a rank sees, with the data on the CPU.
"""

import importlib.util
from typing import Any

__all__ = ["RUNTIME_CODES", "PitfallError", "PitfallWarning", "checking", "install", "is_installed", "uninstall"]

if importlib.util.find_spec("torch") is not None:
    # At once: DataParallel's constructor is wrapped from this import on (see `dataparallel.checks`).
    from dplint.runtime.dataparallel import (
        RUNTIME_CODES,
        PitfallError,
        PitfallWarning,
        checking,
        install,
        is_installed,
        uninstall,
    )


def __getattr__(name: str) -> Any:
    # Without torch, `dplint run` and the pytest plugin still import the torch-free `distributed` parts
    # and say which extra is missing; asking for a check raises torch's ModuleNotFoundError here.
    if name in __all__:
        from dplint.runtime import dataparallel

        return getattr(dataparallel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
