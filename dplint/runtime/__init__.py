"""Runtime checks: DataParallel forwards checked as they run, with N devices simulated on CPU.

    from dplint import runtime

    with runtime.checking(devices=4):
        nn.DataParallel(model)(batch)  # scattered, replicated, applied and gathered as on 4 GPUs

The simulation and its checks live in `dplint.runtime.dataparallel`.
"""

from dplint.runtime.dataparallel import PitfallError, PitfallWarning, checking, install, is_installed, uninstall

__all__ = ["PitfallError", "PitfallWarning", "checking", "install", "is_installed", "uninstall"]
