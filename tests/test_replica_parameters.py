"""DPL311 at runtime (`next(self.parameters())` in a replica's forward), and the tracebacks of what leaves
the runtime checks: the user's frames and torch's, none of dplint's."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import traceback
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import dplint  # noqa: E402
from dplint import runtime  # noqa: E402
from dplint.runtime import PitfallError, PitfallWarning  # noqa: E402
from dplint.runtime.dataparallel import checks  # noqa: E402

PACKAGE = os.path.dirname(os.path.abspath(dplint.__file__))


def line_of(function, text: str) -> int:
    """The line of `function`'s source that holds `text`."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


class FirstParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        device = next(self.parameters()).device
        return self.fc(x.to(device))


@pytest.fixture(autouse=True)
def clean_hook():
    yield
    while runtime.is_installed():
        runtime.uninstall()


def test_next_parameters_in_a_replica_is_dpl311_at_the_users_line_chained_from_torchs_stop_iteration():
    with runtime.checking(devices=2), pytest.raises(PitfallError) as info:
        nn.DataParallel(FirstParameter())(torch.randn(4, 4))
    error = info.value
    assert error.code == "DPL311"
    assert (error.filename, error.lineno) == (__file__, line_of(FirstParameter.forward, "next(self.parameters())"))
    assert "`device = next(self.parameters()).device` raised StopIteration in replica 0" in error.message
    assert "`x.device`" in error.help and "self.fc.weight.device" in error.help
    assert str(error).splitlines()[0].endswith(f"[forward at {__file__}:{error.lineno}, on a FirstParameter replica]")
    cause = error.__cause__
    assert isinstance(cause, StopIteration) and str(cause).startswith("Caught StopIteration in replica 0 on device 0.")
    assert "next(self.parameters())" in str(cause)  # torch's "Original Traceback", as on GPUs


def test_without_gradients_replica_0_holds_the_original_parameters_and_replica_1_fails():
    # torch's broadcast_coalesced returns the input tensors themselves for devices[0]: under no_grad
    # replica 0 gets the Parameters, registered as such; the copies of the other replicas are plain.
    with runtime.checking(devices=2), torch.no_grad(), pytest.raises(PitfallError, match="DPL311") as info:
        nn.DataParallel(FirstParameter())(torch.randn(4, 4))
    assert "raised StopIteration in replica 1," in info.value.message


class ThroughChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 4)

    def forward(self, x):
        return x.to(next(iter(self.encoder.parameters())).dtype)


class DunderNext(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x.to(self.parameters().__next__().device))


class ListIndex(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x.to(list(self.parameters())[0].dtype))


class Property(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    @property
    def device(self):
        return next(self.named_parameters())[1].device

    def forward(self, x):
        return self.fc(x.to(self.device))


@pytest.mark.parametrize(
    "cls, function, text, error",
    [
        (ThroughChild, ThroughChild.forward, "self.encoder.parameters()", "StopIteration"),
        (DunderNext, DunderNext.forward, "__next__()", "StopIteration"),
        (ListIndex, ListIndex.forward, "list(self.parameters())[0]", "IndexError"),
        (Property, Property.device.fget, "next(self.named_parameters())", "StopIteration"),
    ],
    ids=["child", "dunder-next", "list-index", "property"],
)
def test_every_way_of_taking_the_first_parameter_is_reported_where_it_is_taken(cls, function, text, error):
    with runtime.checking(devices=2), pytest.raises(PitfallError, match="DPL311") as info:
        nn.DataParallel(cls())(torch.randn(4, 4))
    assert (info.value.filename, info.value.lineno) == (__file__, line_of(function, text))
    assert f"raised {error} in replica 0" in info.value.message
    assert type(info.value.__cause__).__name__ == error


def test_a_stop_iteration_from_anything_else_stays_torchs():
    class Exhausted(nn.Module):
        def forward(self, x):
            return x + next(iter([]))

    with runtime.checking(devices=2), pytest.raises(StopIteration, match="Caught StopIteration in replica 0"):
        nn.DataParallel(Exhausted())(torch.randn(4, 4))


def test_ignored_dpl311_leaves_torchs_error_and_warn_warns_then_raises_it():
    with runtime.checking(devices=2, ignore=["DPL311"]), pytest.raises(StopIteration, match="in replica 0"):
        nn.DataParallel(FirstParameter())(torch.randn(4, 4))
    with runtime.checking(devices=2, action="warn"), pytest.raises(StopIteration, match="in replica 0"):
        with pytest.warns(PitfallWarning, match="DPL311 `device = next") as warned:
            nn.DataParallel(FirstParameter())(torch.randn(4, 4))
    assert warned[0].filename == __file__ and warned[0].lineno == line_of(FirstParameter.forward, "next(self.parameters())")


def test_without_replicas_the_module_has_its_parameters():
    x = torch.randn(4, 4)
    assert FirstParameter()(x).shape == (4, 2)  # no wrapper
    with runtime.checking(devices=1), warnings.catch_warnings():
        warnings.simplefilter("ignore", PitfallWarning)  # DPL307: a single device
        assert nn.DataParallel(FirstParameter())(x).shape == (4, 2)  # one device: torch calls the module itself


def test_dpl311_is_a_runtime_code():
    assert "DPL311" in runtime.RUNTIME_CODES


# ----- tracebacks -------------------------------------------------------------------------------------


def own_frames(error: BaseException):
    """dplint's frames in the traceback of `error` and of every exception chained to it."""
    found, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        found += [f for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename).startswith(PACKAGE)]
        error = error.__cause__ or error.__context__
    return found


def test_a_finding_caught_inside_the_block_already_shows_no_dplint_frame():
    with runtime.checking(devices=2):
        with pytest.raises(PitfallError) as info:
            nn.DataParallel(FirstParameter())(torch.randn(4, 4))
        assert own_frames(info.value) == []
        frames = traceback.extract_tb(info.value.__traceback__)
        assert frames[0].filename == __file__ and "torch" in frames[-1].filename


def test_a_bug_of_dplint_itself_keeps_its_frames(monkeypatch):
    monkeypatch.setattr(checks, "_leaves", None)  # check_outputs fails inside dplint: a bug report needs its frames
    with pytest.raises(TypeError) as info, runtime.checking(devices=2):
        nn.DataParallel(nn.Linear(4, 2))(torch.randn(4, 4))
    assert [frame.name for frame in own_frames(info.value)][-2:] == ["steps", "check_outputs"]


SCRIPT_PARTS = {
    "header": """
        import torch
        import torch.nn as nn
        from dplint import runtime


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
    """,
    "first-parameter": "        return self.fc(x.to(next(self.parameters()).device))  # FORWARD\n",
    "scalar": "        return self.fc(x).mean()  # FORWARD\n",
    "own-error": "        raise ValueError('bad chunk')  # FORWARD\n",
    "checking": """

        with runtime.checking(devices=2):
            nn.DataParallel(Net())(torch.randn(4, 4))  # CALL
    """,
    "install": """

        runtime.install(devices=2)
        nn.DataParallel(Net())(torch.randn(4, 4))  # CALL
    """,
}


@pytest.mark.parametrize(
    "forward, entry, last",
    [
        ("first-parameter", "checking", "dplint.runtime.dataparallel.checks.PitfallError: DPL311 `return self.fc(x.to(next("),
        ("scalar", "checking", "dplint.runtime.dataparallel.checks.PitfallError: DPL305 forward returned a 0-dim tensor"),
        ("first-parameter", "install", "dplint.runtime.dataparallel.checks.PitfallError: DPL311 `return self.fc(x.to(next("),
        ("own-error", "checking", "ValueError: bad chunk"),
    ],
)
def test_a_script_shows_its_own_frames_and_torchs_and_none_of_dplints(tmp_path, forward, entry, last):
    script = tmp_path / "train.py"
    source = textwrap.dedent(SCRIPT_PARTS["header"]) + SCRIPT_PARTS[forward] + textwrap.dedent(SCRIPT_PARTS[entry])
    script.write_text(source)
    lines = source.splitlines()
    call = next(i for i, line in enumerate(lines, 1) if "# CALL" in line)
    in_forward = next(i for i, line in enumerate(lines, 1) if "# FORWARD" in line)
    completed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    stderr = completed.stderr
    assert completed.returncode == 1
    assert f'File "{script}", line {call}, in <module>' in stderr
    if forward != "scalar":  # torch's "Original Traceback" of the replica that raised
        assert f'File "{script}", line {in_forward}, in forward' in stderr
    assert 'torch/nn/modules/module.py", line' in stderr  # torch's frames stay
    assert PACKAGE not in stderr and "dplint/runtime" not in stderr
    # The finding ends the output, its help line last (a replica's own error ends with torch's
    # "Original Traceback" text, which ends with a newline, as on GPUs).
    if forward == "own-error":
        shown = stderr.rstrip("\n").splitlines()[-1]
    else:
        shown, help_line = stderr.splitlines()[-2:]
        assert help_line.startswith("  help: ")
    assert shown.startswith(last)
    if forward == "first-parameter":
        assert shown.endswith(f"[forward at {script}:{in_forward}, on a Net replica]")
