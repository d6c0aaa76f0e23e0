"""pytest plugin: run tests with dplint's DataParallel runtime checks, on N simulated devices.

Enabled by `--dplint`, the ini option `dplint = true`, or `@pytest.mark.dplint(devices=N)` on a test;
otherwise it changes nothing. torch is imported only once the checks are on: the plugin is loaded
by every pytest run of the environment.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional

import pytest

DEFAULT_SIMULATED_DEVICES = 2
_STATE = pytest.StashKey["_PluginState"]()


@dataclass
class _PluginState:
    enabled: bool
    explicit_devices: Optional[int]
    annotations: List[str]
    _devices: Optional[int] = None
    _resolved: bool = False

    @property
    def devices(self) -> Optional[int]:
        """Simulated devices: as configured, else 2 when fewer than 2 GPUs exist (None: the real GPUs)."""
        if not self._resolved:
            self._resolved = True
            if self.explicit_devices is not None:
                self._devices = self.explicit_devices
            else:
                import torch

                available = torch.cuda.device_count() if torch.cuda.is_available() else 0
                self._devices = DEFAULT_SIMULATED_DEVICES if available < DEFAULT_SIMULATED_DEVICES else None
        return self._devices


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dplint", "DataParallel runtime checks (dplint)")
    group.addoption("--dplint", action="store_true", default=False, help="check every nn.DataParallel call in every test")
    group.addoption(
        "--dplint-devices",
        type=int,
        metavar="N",
        default=None,
        help=f"devices to simulate on CPU (default: {DEFAULT_SIMULATED_DEVICES} when fewer GPUs are present)",
    )
    group.addoption("--dplint-ranks", type=int, metavar="N", default=None, help="ranks for tests marked dplint(ranks=True) (default: 2)")
    parser.addini("dplint", type="bool", default=False, help="check every nn.DataParallel call in every test")
    parser.addini("dplint_ranks", default="", help="ranks for tests marked dplint(ranks=True)")
    parser.addini("dplint_devices", default="", help="devices to simulate for dplint's runtime checks")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "dplint(devices=None, action='raise'): run this test with dplint's DataParallel runtime checks",
    )
    devices = config.getoption("dplint_devices")
    if devices is None and config.getini("dplint_devices"):
        try:
            devices = int(config.getini("dplint_devices"))
        except ValueError:
            raise pytest.UsageError(f"dplint_devices must be an integer, got {config.getini('dplint_devices')!r}") from None
    if devices is not None and devices < 1:
        raise pytest.UsageError(f"--dplint-devices must be at least 1, got {devices}")
    enabled = bool(config.getoption("dplint") or config.getini("dplint"))
    config.stash[_STATE] = _PluginState(enabled, devices, [])


def pytest_report_header(config: pytest.Config) -> Optional[str]:
    state = config.stash[_STATE]
    if not state.enabled:
        return None
    devices = state.devices
    where = f"{devices} simulated device{'s' * (devices != 1)}" if devices is not None else "the real GPUs"
    return f"dplint: DataParallel runtime checks on, {where}"


def _settings_for(item: pytest.Item) -> Optional[dict]:
    state = item.config.stash[_STATE]
    marker = item.get_closest_marker("dplint")
    if marker is None and not state.enabled:
        return None
    settings = {"devices": state.devices, "action": "raise"}
    if marker is not None and "ranks" in marker.kwargs:  # a distributed test: see pytest_pyfunc_call
        return None
    if marker is not None:
        settings.update(marker.kwargs)
    return settings


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    settings = _settings_for(item)
    if settings is None:
        yield
        return
    from dplint import runtime

    with runtime.checking(**settings):
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Optional[bool]:
    marker = pyfuncitem.get_closest_marker("dplint")
    if marker is None or "ranks" not in marker.kwargs:
        return None
    from dplint.distributed.pytest_support import ranks_for, run_on_ranks

    ranks = ranks_for(pyfuncitem)
    return None if ranks is None else run_on_ranks(pyfuncitem, ranks)


def _pitfall(excinfo: Optional[pytest.ExceptionInfo]) -> Any:
    if excinfo is None:
        return None
    from dplint.runtime import PitfallError

    error: Optional[BaseException] = excinfo.value
    while error is not None:
        if isinstance(error, PitfallError):
            return error
        error = error.__cause__ or error.__context__
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    if call.when != "call" or call.excinfo is None or "dplint.runtime" not in sys.modules:
        return
    pitfall = _pitfall(call.excinfo)
    if pitfall is None:
        return
    report = outcome.get_result()
    where = f"\n\n{pitfall.module_class}.forward at {pitfall.filename}:{pitfall.lineno}" if pitfall.filename else ""
    report.longrepr = f"{pitfall.code} {pitfall.message}{where}"
    if os.environ.get("GITHUB_ACTIONS") == "true":
        item.config.stash[_STATE].annotations.append(_annotation(pitfall))


def _annotation(pitfall: Any) -> str:
    from dplint.reporters import github_command, relative_uri, workspace_root

    properties: List[Any] = [("title", f"dplint ({pitfall.code})")]
    if pitfall.filename:
        properties += [("file", relative_uri(pitfall.filename, workspace_root())), ("line", pitfall.lineno)]
    return github_command("error", properties, f"{pitfall.code} {pitfall.message}")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    for annotation in config.stash[_STATE].annotations:
        terminalreporter.write_line(annotation)


class RuntimeControl:
    """What the `dplint_runtime` fixture gives a test: the checks, with the session's devices."""

    def __init__(self, devices: Optional[int]) -> None:
        self.devices = devices
        self._installed = 0

    def checking(self, devices: Optional[int] = None, action: str = "raise"):
        from dplint import runtime

        return runtime.checking(devices=devices or self.devices, action=action)

    def install(self, devices: Optional[int] = None, action: str = "raise") -> None:
        from dplint import runtime

        runtime.install(devices=devices or self.devices, action=action)
        self._installed += 1

    def uninstall(self) -> None:
        from dplint import runtime

        if self._installed:
            runtime.uninstall()
            self._installed -= 1


@pytest.fixture
def dplint_runtime(request: pytest.FixtureRequest) -> Iterator[RuntimeControl]:
    """Explicit control of the runtime checks; installs left open by the test are undone after it."""
    control = RuntimeControl(request.config.stash[_STATE].devices)
    yield control
    while control._installed:
        control.uninstall()
