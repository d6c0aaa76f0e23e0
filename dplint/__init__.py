"""dplint: a static and runtime linter for PyTorch multi-GPU pitfalls."""

from typing import Any

__version__ = "0.1.0"

__all__ = ["Edit", "Finding", "Fix", "Location", "__version__", "lint_paths", "lint_source"]

_EXPORTS = {
    "lint_paths": "dplint.api",
    "lint_source": "dplint.api",
    "Edit": "dplint.finding",
    "Finding": "dplint.finding",
    "Fix": "dplint.finding",
    "Location": "dplint.finding",
}


def __getattr__(name: str) -> Any:
    # Imported on first use, so that `import dplint.pytest_plugin` (run by every pytest session of
    # the environment) does not pay for libcst.
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dplint' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
