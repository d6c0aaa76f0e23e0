"""Whose code a frame runs: the user's, or the machinery around it (dplint, torch, Python's own modules).

The one answer for everything at runtime that names the user's code: a finding's line, a failed rank's
line, the frames hidden from a traceback.
"""

from __future__ import annotations

import functools
import os
import sysconfig

import dplint

DPLINT_DIR = os.path.dirname(os.path.abspath(dplint.__file__)) + os.sep
# Python's own modules (multiprocessing, runpy) run the user's code, they are not it.
_STDLIB_DIRS = tuple({os.path.join(sysconfig.get_paths()[name], "") for name in ("stdlib", "platstdlib")})
# Installed packages (site-packages, which may sit inside the stdlib folder): the user's dependencies.
_INSTALLED_DIRS = tuple({os.path.join(sysconfig.get_paths()[name], "") for name in ("purelib", "platlib")})


@functools.lru_cache(maxsize=None)
def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def dplint_code(filename: str) -> bool:
    return os.path.abspath(filename).startswith(DPLINT_DIR)


def torch_code(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_torch_dir())


def installed_code(filename: str) -> bool:
    """A file of an installed package (site-packages): a framework's, a dependency's."""
    return filename.startswith(_INSTALLED_DIRS)


def user_code(filename: str) -> bool:
    """Neither torch's nor dplint's nor Python's own (`<frozen ...>`, `<string>` included); installed
    packages other than torch count as the user's: their calls are the user's program."""
    return not (
        filename.startswith((_torch_dir(), DPLINT_DIR, "<"))
        or (filename.startswith(_STDLIB_DIRS) and not filename.startswith(_INSTALLED_DIRS))
    )
