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
            "*DPL301 forward returned [[]25, 4, 37[]] per replica (output); gathered along dim 0 this became [[]50, 4, 37[]] for a batch of 8*",
            "CRNN.forward at *crnn_model.py:*",
        ]
    )
    # The failure shows the finding, not a traceback from inside DataParallel.
    assert "data_parallel.py" not in result.stdout.str() and "dplint/runtime/" not in result.stdout.str()


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
    result.stdout.fnmatch_lines(["::error title=dplint (DPL301),file=crnn_model.py,line=*::DPL301 forward returned*"])


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
