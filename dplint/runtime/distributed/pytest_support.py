"""Run one pytest test body on N ranks: `@pytest.mark.dplint(ranks=2)` (the plugin routes such tests here).

Fixtures are set up once, in the pytest process, and every rank gets a pickled copy of their values
(`tmp_path` is then the same folder on every rank, as a shared filesystem is on one node); fixtures
whose values cannot be pickled fail the test with a message naming them. Fixture teardown and
`monkeypatch` changes happen in the pytest process only, not in the ranks.
"""

from __future__ import annotations

import pickle
from typing import Any, Dict

import pytest

DEFAULT_TEST_TIMEOUT = 30.0


def run_on_ranks(item: pytest.Function, ranks: int) -> bool:
    from dplint.runtime.distributed import LaunchError, launch

    __tracebackhide__ = True
    options = item.get_closest_marker("dplint").kwargs  # type: ignore[union-attr]
    arguments: Dict[str, Any] = {name: item.funcargs[name] for name in item._fixtureinfo.argnames}
    unpicklable = [name for name, value in arguments.items() if not _picklable(value)]
    if unpicklable:
        pytest.fail(f"fixture{'s' * (len(unpicklable) > 1)} {', '.join(unpicklable)} cannot be sent to the ranks "
                    "(not picklable); build such values inside the test", pytrace=False)  # fmt: skip
    try:
        launch(
            item.obj,
            nprocs=ranks,
            timeout=options.get("timeout", DEFAULT_TEST_TIMEOUT),
            checks=options.get("checks"),
            action=options.get("action", "raise"),
            kwargs=arguments,
        )
        return True
    except LaunchError as error:
        failed = error
    details = ""
    if failed.failure is not None and not failed.failure.code and failed.failure.traceback:
        details = f"\n\nrank {failed.failure.rank}'s traceback:\n{failed.failure.traceback}"
    pytest.fail(f"{failed}{details}", pytrace=False)


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 - any pickling failure means the value cannot travel
        return False
    return True
