"""dplint: a static and runtime linter for PyTorch multi-GPU pitfalls."""

__version__ = "0.1.0"

from dplint.api import lint_paths, lint_source  # noqa: E402  (the version must exist before the API imports it)
from dplint.finding import Edit, Finding, Fix, Location  # noqa: E402

__all__ = ["Edit", "Finding", "Fix", "Location", "__version__", "lint_paths", "lint_source"]
