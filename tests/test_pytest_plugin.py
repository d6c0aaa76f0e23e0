"""The pytest plugin, run as a user runs it: `pytest --dplint` in a separate process."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

CRNN_MODEL = (Path(__file__).resolve().parent.parent / "fixtures" / "crnn_model.py").read_text()

CRNN_TESTS = """
import torch
import torch.nn as nn
from crnn_model import CRNN, BatchFirstCRNN

def test_crnn():
    model = nn.DataParallel(CRNN(n_class=37))
    assert model(torch.randn(8, 1, 32, 100)).shape[1] == 8

def test_fixed_crnn():
    model = nn.DataParallel(BatchFirstCRNN(n_class=37))
    assert model(torch.randn(8, 1, 32, 100)).shape == (8, 25, 37)
"""


@pytest.fixture
def crnn_project(pytester):
    pytester.makepyfile(crnn_model=CRNN_MODEL, test_crnn=CRNN_TESTS)
    return pytester


def test_without_the_option_the_plugin_changes_nothing(crnn_project):
    result = crnn_project.runpytest_subprocess()
    result.assert_outcomes(passed=2)  # on a CPU, DataParallel calls the module directly: both look fine
    assert "dplint:" not in result.stdout.str()


def test_crnn_fails_with_dpl301_and_the_gathered_shape(crnn_project):
    result = crnn_project.runpytest_subprocess("--dplint")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "dplint: DataParallel runtime checks on, 2 simulated devices",
            "    def test_crnn():",
            "        model = nn.DataParallel(CRNN(n_class=37))",
            ">       assert model(torch.randn(8, 1, 32, 100)).shape[[]1[]] == 8",
            "E       dplint.runtime.dataparallel.checks.PitfallError: DPL301 forward returned [[]25, 4, 37[]] per replica (output); "
            "gathered along dim 0 this became [[]50, 4, 37[]] for a batch of 8*[[]CRNN.forward at *crnn_model.py:*[]]",
            "test_crnn.py:7: PitfallError",
        ]
    )
    # As pytest shows an assertion: the test's own lines, not frames inside torch or dplint.
    output = result.stdout.str()
    assert "torch/nn/modules" not in output and "dplint/runtime/" not in output


def test_ini_options_and_device_count(crnn_project):
    crnn_project.makeini("[pytest]\ndplint = true\ndplint_devices = 4\n")
    result = crnn_project.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["dplint: DataParallel runtime checks on, 4 simulated devices", "*[[]25, 2, 37[]] per replica*"])


def test_marker_turns_checks_on_for_one_test(pytester):
    pytester.makepyfile(
        """
        import pytest
        import torch
        import torch.nn as nn

        class Counter(nn.Module):
            def __init__(self):
                super().__init__()
                self.calls = 0
            def forward(self, x):
                self.calls += 1
                return x

        @pytest.mark.dplint(devices=3)
        def test_marked():
            nn.DataParallel(Counter())(torch.randn(6, 2))

        def test_unmarked():
            nn.DataParallel(Counter())(torch.randn(6, 2))
        """
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*DPL304 `Counter.forward` rebinds `self.calls`*"])


def test_fixture_gives_explicit_control(pytester):
    pytester.makepyfile(
        """
        import torch
        import torch.nn as nn

        class Seen(nn.Module):
            sizes = []
            def forward(self, x):
                Seen.sizes.append(len(x))
                return x

        def test_fixture(dplint_runtime):
            assert dplint_runtime.devices == 2
            with dplint_runtime.checking(devices=8):
                nn.DataParallel(Seen())(torch.randn(30, 2))
            assert Seen.sizes == [4] * 7 + [2] + [30]  # and once more on the whole batch: DPL309's check
            Seen.sizes.clear()
            with dplint_runtime.checking(devices=8, ignore=["DPL309"]):
                nn.DataParallel(Seen())(torch.randn(30, 2))
            assert Seen.sizes == [4] * 7 + [2]
            dplint_runtime.install(devices=3)  # left installed: the fixture undoes it

        def test_after():
            from dplint import runtime
            assert not runtime.is_installed()
        """
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=2)


def test_github_annotations(crnn_project, monkeypatch):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKSPACE", str(crnn_project.path))
    result = crnn_project.runpytest_subprocess("--dplint")
    # The linter's annotation of the same finding: its file, line and column, then `path:line:col: CODE message`.
    result.stdout.fnmatch_lines(["::error title=dplint (DPL301),file=crnn_model.py,line=*,col=*::crnn_model.py:*:*: DPL301 forward returned*"])


def test_bad_device_count_is_a_usage_error(crnn_project):
    result = crnn_project.runpytest_subprocess("--dplint", "--dplint-devices", "0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dplint-devices must be at least 1*"])


def test_dpl303_state_dict_prefix_under_the_plugin(pytester):
    pytester.makepyfile(
        """
        import torch.nn as nn

        def test_resume_from_a_data_parallel_checkpoint():
            checkpoint = nn.DataParallel(nn.Linear(4, 2)).state_dict()
            model = nn.Linear(4, 2)
            model.load_state_dict(checkpoint, strict=False)  # silently loads nothing without dplint

        def test_resume_the_right_way():
            wrapped = nn.DataParallel(nn.Linear(4, 2))
            nn.Linear(4, 2).load_state_dict(wrapped.module.state_dict())
        """
    )
    result = pytester.runpytest_subprocess("--dplint")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*DPL303 load_state_dict: the checkpoint's keys start with `module.`*silently load nothing*"])


def test_devices_option_alone_turns_the_checks_on(crnn_project):
    result = crnn_project.runpytest_subprocess("--dplint-devices", "4", "-k", "test_crnn and not fixed")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["dplint: DataParallel runtime checks on, 4 simulated devices", "*DPL301*"])


@pytest.mark.parametrize(
    "marker, problem",
    [
        ("device=3", "unknown argument `device`"),
        ("devices=0", "`devices=0` is not devices to simulate, a positive int"),
        ("3", "positional arguments (3,) (use keywords)"),
    ],
)
def test_a_bad_marker_argument_is_a_usage_error_naming_the_accepted_ones(pytester, marker, problem):
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.dplint({marker})
        def test_marked():
            pass
        """
    )
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*@pytest.mark.dplint on test_a_bad_marker_argument_is_a_usage_error_naming_the_accepted_ones.py::test_marked: "
            f"{problem}. Accepted arguments: devices: *; action: *; ignore: *"
        ]
    )
    assert "Traceback" not in result.stderr.str()


TIME_MAJOR_TESTS = """
import pytest
import torch
import torch.nn as nn

def encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0)
    return nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False).eval()

def test_time_major():
    out = nn.DataParallel(encoder())(torch.randn(6, 4, 8))  # [S, B, E] split along S
    assert out.shape == (6, 4, 8)

@pytest.mark.dplint(ignore=["DPL309"])
def test_time_major_ignored_by_the_marker():
    nn.DataParallel(encoder())(torch.randn(6, 4, 8))

@pytest.fixture
def wrapped():
    return nn.DataParallel(encoder(), dim=1)

def test_fixed_in_a_fixture(wrapped):
    assert wrapped(torch.randn(6, 4, 8)).shape == (6, 4, 8)
"""


def test_row_independence_is_checked_by_default_and_ignorable(pytester):
    pytester.makepyfile(test_encoder=TIME_MAJOR_TESTS)
    result = pytester.runpytest_subprocess("--dplint")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*DPL309 the gathered output differs from one forward of the whole batch*splitting dim 0 split the sequence*"])
    pytester.runpytest_subprocess("--dplint", "--dplint-ignore", "DPL305,dpl309").assert_outcomes(passed=3)
    pytester.makeini("[pytest]\ndplint = true\ndplint_ignore = DPL309\n")
    pytester.runpytest_subprocess().assert_outcomes(passed=3)


def test_an_unknown_ignored_code_is_a_usage_error(crnn_project):
    result = crnn_project.runpytest_subprocess("--dplint", "--dplint-ignore", "DPL999")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dplint-ignore: DPL999 not runtime codes; they are DPL103, *"])


BATCH_NORM_TESTS = """
import torch
import torch.nn as nn

def model():
    torch.manual_seed(0)
    return nn.DataParallel(nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4)))

def test_first():
    model()(torch.randn(8, 5))

def test_second():
    model()(torch.randn(8, 5))
"""


def test_batch_norm_advice_is_said_once_per_session(pytester):
    pytester.makepyfile(test_norm=BATCH_NORM_TESTS)
    result = pytester.runpytest_subprocess("--dplint", "-W", "always")
    result.assert_outcomes(passed=2, warnings=1)
    assert result.stdout.str().count("PitfallWarning: DPL309") == 1
