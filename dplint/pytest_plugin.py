"""pytest plugin: run tests with dplint's DataParallel runtime checks, on N simulated devices.

Enabled by `--dplint`, by `--dplint-devices N` (or the ini options `dplint = true`,
`dplint_devices = N`), or for one test by `@pytest.mark.dplint(...)`; otherwise it changes nothing.
Under the plugin the row-independence check (DPL309) is on: `--dplint-ignore DPL309` turns it off.
torch is imported only once the checks are on: the plugin is loaded by every pytest run of the
environment.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Tuple

import pytest

DEFAULT_SIMULATED_DEVICES = 2
DEFAULT_RANKS = 2
_STATE = pytest.StashKey["_PluginState"]()


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _codes(value: Any) -> bool:
    return isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(code, str) for code in value)


# What `@pytest.mark.dplint(...)` accepts: argument -> (what it takes, check of the value).
def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _check_names(value: Any) -> bool:
    from dplint.run_options import ALL_CHECKS

    return isinstance(value, (list, tuple)) and all(name in ALL_CHECKS for name in value)


MARKER_ARGUMENTS: Dict[str, Tuple[str, Callable[[Any], bool]]] = {
    "devices": ("devices to simulate, a positive int", _positive_int),
    "action": ("'raise' or 'warn'", lambda value: value in ("raise", "warn")),
    "ignore": ("runtime codes not to report, a list such as ['DPL305']", _codes),
    "ranks": ("ranks to run the test on in a gloo group, a positive int or True (--dplint-ranks)", lambda value: value is True or _positive_int(value)),
    "timeout": ("with ranks: seconds any rank may wait on the others, a positive number", _positive_number),
    "checks": ("with ranks: distributed checks to run, a list such as ['samplers']", _check_names),
}


@dataclass
class _PluginState:
    enabled: bool
    explicit_devices: Optional[int]
    ignore: FrozenSet[str]
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
        help=f"devices to simulate on CPU (default: {DEFAULT_SIMULATED_DEVICES} when fewer GPUs are present); turns the checks on",
    )
    group.addoption(
        "--dplint-ignore",
        action="append",
        default=[],
        metavar="CODES",
        help="runtime codes not to report, comma-separated (e.g. DPL305,DPL309; DPL309 also skips its extra forward)",
    )
    group.addoption("--dplint-ranks", type=int, metavar="N", default=None, help="ranks for tests marked dplint(ranks=True) (default: 2)")
    parser.addini("dplint", type="bool", default=False, help="check every nn.DataParallel call in every test")
    parser.addini("dplint_ranks", default="", help="ranks for tests marked dplint(ranks=True)")
    parser.addini("dplint_devices", default="", help="devices to simulate for dplint's runtime checks; turns them on")
    parser.addini("dplint_ignore", type="args", default=[], help="runtime codes dplint does not report")


def _split_codes(values: List[str]) -> FrozenSet[str]:
    return frozenset(code.strip().upper() for value in values for code in value.split(",") if code.strip())


def positive_int_setting(config: pytest.Config, name: str) -> Optional[int]:
    """`--dplint-<name> N`, else the `dplint_<name>` ini option (None: neither given); at least 1."""
    value = config.getoption(f"dplint_{name}", None)
    if value is None and config.getini(f"dplint_{name}"):
        try:
            value = int(config.getini(f"dplint_{name}"))
        except ValueError:
            raise pytest.UsageError(f"dplint_{name} must be an integer, got {config.getini(f'dplint_{name}')!r}") from None
    if value is not None and value < 1:
        raise pytest.UsageError(f"--dplint-{name} must be at least 1, got {value}")
    return value


def _require_torch() -> None:
    """Without torch the checks cannot run: one line naming the extra, exit status 2, as `dplint run` says it."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "torch":
            raise
        pytest.exit(
            "dplint: the runtime checks need the runtime extra: pip install '.[runtime]' in a clone of dplint "
            f"(pip install 'dplint[runtime]' once it is published) ({error})",
            returncode=2,
        )


def pytest_configure(config: pytest.Config) -> None:
    accepted = ", ".join(f"{name}=<{what}>" for name, (what, _) in MARKER_ARGUMENTS.items())
    config.addinivalue_line("markers", f"dplint({accepted}): run this test with dplint's DataParallel runtime checks")
    devices = positive_int_setting(config, "devices")
    ignore = _split_codes(config.getoption("dplint_ignore") + list(config.getini("dplint_ignore")))
    enabled = bool(config.getoption("dplint") or config.getini("dplint") or devices is not None)
    if ignore:
        from dplint.runtime import RUNTIME_CODES

        unknown = sorted(ignore - RUNTIME_CODES)
        if unknown:
            raise pytest.UsageError(
                f"--dplint-ignore: {', '.join(unknown)} not runtime codes; they are {', '.join(sorted(RUNTIME_CODES))}"
            )
    config.stash[_STATE] = _PluginState(enabled, devices, ignore, [])
    if enabled:
        _require_torch()


def pytest_report_header(config: pytest.Config) -> Optional[str]:
    state = config.stash[_STATE]
    if not state.enabled:
        return None
    devices = state.devices
    where = f"{devices} simulated device{'s' * (devices != 1)}" if devices is not None else "the real GPUs"
    return f"dplint: DataParallel runtime checks on, {where}"


def _marker_usage_error(item: pytest.Item, problem: str) -> pytest.UsageError:
    accepted = "; ".join(f"{name}: {what}" for name, (what, _) in MARKER_ARGUMENTS.items())
    return pytest.UsageError(f"@pytest.mark.dplint on {item.nodeid}: {problem}. Accepted arguments: {accepted}.")


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if any(item.get_closest_marker("dplint") for item in items):
        _require_torch()
    for item in items:
        for marker in item.iter_markers("dplint"):
            if marker.args:
                raise _marker_usage_error(item, f"positional arguments {marker.args!r} (use keywords)")
            for name, value in marker.kwargs.items():
                if name not in MARKER_ARGUMENTS:
                    raise _marker_usage_error(item, f"unknown argument `{name}`")
                what, valid = MARKER_ARGUMENTS[name]
                if not valid(value):
                    raise _marker_usage_error(item, f"`{name}={value!r}` is not {what}")


def _settings_for(item: pytest.Item) -> Optional[Dict[str, Any]]:
    state = item.config.stash[_STATE]
    marker = item.get_closest_marker("dplint")
    if marker is None and not state.enabled:
        return None
    settings: Dict[str, Any] = {"devices": state.devices, "action": "raise", "check_rows": True}
    if marker is not None and "ranks" in marker.kwargs:  # a distributed test: see pytest_pyfunc_call
        return None
    if marker is not None:
        settings.update(marker.kwargs)
    settings["ignore"] = state.ignore | _split_codes(list(settings.get("ignore", ())))
    return settings


def _checked_phase(item: pytest.Item) -> Iterator[None]:
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
    from dplint.runtime.distributed.pytest_support import run_on_ranks

    return run_on_ranks(pyfuncitem, _ranks(pyfuncitem, marker.kwargs["ranks"]))


def _ranks(item: pytest.Item, ranks: Any) -> int:
    """`dplint(ranks=N)`; `ranks=True` takes --dplint-ranks / dplint_ranks, else 2."""
    if ranks is True:
        ranks = positive_int_setting(item.config, "ranks") or DEFAULT_RANKS
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise pytest.UsageError(f"{item.nodeid}: dplint(ranks=...) must be a positive int or True, got {ranks!r}")
    return ranks


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _checked_phase(item)  # a fixture's forwards are the test's too


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _checked_phase(item)


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


def _inside_the_machinery(entry: Any) -> bool:
    """Frames of torch's module calls and of dplint's runtime: not what the user wrote."""
    from dplint.runtime.origins import dplint_code, torch_code

    path = str(entry.path)
    return torch_code(path) or dplint_code(path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    if call.excinfo is None or "dplint.runtime.dataparallel" not in sys.modules:
        return
    pitfall = _pitfall(call.excinfo)
    if pitfall is None:
        return
    report = outcome.get_result()
    # As pytest shows any failed assertion: the test's own traceback down to the line that called
    # the model, then the finding (code, message, the forward's location) as the error line.
    def user_frames(excinfo: pytest.ExceptionInfo) -> Any:
        traceback = excinfo.traceback
        return traceback.cut(path=item.path).filter(excinfo).filter(lambda entry: not _inside_the_machinery(entry))

    style = item.config.getoption("tbstyle", "auto")
    report.longrepr = call.excinfo.getrepr(funcargs=True, style="long" if style == "auto" else style, tbfilter=user_frames)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        item.config.stash[_STATE].annotations.append(_annotation(pitfall))


def _annotation(pitfall: Any) -> str:
    from dplint.reporters import github_annotation, github_command, workspace_root

    if pitfall.finding is None:
        return github_command("error", [("title", f"dplint ({pitfall.code})")], f"{pitfall.code} {pitfall.message}")
    return github_annotation(pitfall.finding, workspace_root())  # the linter's annotation of the same finding


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    for annotation in config.stash[_STATE].annotations:
        terminalreporter.write_line(annotation)


class RuntimeControl:
    """What the `dplint_runtime` fixture gives a test: the checks, with the session's devices and ignores."""

    def __init__(self, devices: Optional[int], ignore: FrozenSet[str]) -> None:
        self.devices = devices
        self.ignore = ignore
        self._installed = 0

    def _settings(self, devices: Optional[int], action: str, ignore: Any, check_rows: bool) -> Dict[str, Any]:
        return {
            "devices": devices or self.devices,
            "action": action,
            "ignore": self.ignore | _split_codes(list(ignore)),
            "check_rows": check_rows,
        }

    def checking(self, devices: Optional[int] = None, action: str = "raise", ignore: Any = (), check_rows: bool = True):
        from dplint import runtime

        return runtime.checking(**self._settings(devices, action, ignore, check_rows))

    def install(self, devices: Optional[int] = None, action: str = "raise", ignore: Any = (), check_rows: bool = True) -> None:
        from dplint import runtime

        runtime.install(**self._settings(devices, action, ignore, check_rows))
        self._installed += 1

    def uninstall(self) -> None:
        from dplint import runtime

        if self._installed:
            runtime.uninstall()
            self._installed -= 1


@pytest.fixture
def dplint_runtime(request: pytest.FixtureRequest) -> Iterator[RuntimeControl]:
    """Explicit control of the runtime checks; installs left open by the test are undone after it."""
    state = request.config.stash[_STATE]
    control = RuntimeControl(state.devices, state.ignore)
    yield control
    while control._installed:
        control.uninstall()
