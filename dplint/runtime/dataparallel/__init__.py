"""DataParallel at runtime: forwards checked as they run, with N devices simulated on CPU.

- `checks`: the settings (per thread), the patches, and the checks around each forward;
- `simulation`: DataParallel's scatter, replicate, parallel_apply and gather for simulated devices;
- `module_state`: what a replica's forward changed (DPL304);
- `messages`: the findings' texts;
- `frames`: dplint's frames unlinked from the tracebacks of what leaves the checks.
"""

from dplint.runtime.dataparallel.checks import (
    RUNTIME_CODES,
    PitfallError,
    PitfallWarning,
    checking,
    install,
    is_installed,
    uninstall,
)

__all__ = ["RUNTIME_CODES", "PitfallError", "PitfallWarning", "checking", "install", "is_installed", "uninstall"]
