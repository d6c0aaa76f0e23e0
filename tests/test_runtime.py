"""The runtime hook with a real torch on CPU: DataParallel's semantics on simulated devices, and the checks."""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from dplint import runtime  # noqa: E402
from dplint.runtime import PitfallError, PitfallWarning, dataparallel  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class Recorder(nn.Module):
    """Linear 5 -> 2 that records the batch size each replica receives."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 2)

    def forward(self, x, *rest, **options):
        SEEN.append(x.size(0))
        return self.fc(x)


SEEN: list = []


@pytest.fixture(autouse=True)
def clean_hook():
    SEEN.clear()
    yield
    while runtime.is_installed():
        runtime.uninstall()
    assert nn.DataParallel.forward is dataparallel._original_forward


@pytest.mark.parametrize(
    "devices, expected",
    [
        (2, [[15, 15]] * 3 + [[5, 5]]),
        (3, [[10, 10, 10]] * 3 + [[4, 4, 2]]),
        (8, [[4] * 7 + [2]] * 3 + [[2] * 5]),
    ],
)
def test_tutorial_replica_sizes_match_dataparallel_on_n_gpus(devices, expected):
    completed = subprocess.run(
        [sys.executable, str(ROOT / "fixtures" / "dataparallel_devices.py"), "--devices", str(devices)],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stderr
    batches, current = [], []
    for line in completed.stdout.splitlines():
        inside = re.search(r"In Model: input size torch.Size\(\[(\d+), 5\]\)", line)
        if inside:
            current.append(int(inside.group(1)))
        elif line.startswith("Outside"):
            batches.append(current)
            current = []
    assert batches == expected
    if devices == 8:
        assert "DPL306" in completed.stderr and "3 devices sit idle" in completed.stderr


def test_install_and_uninstall_restore_the_same_function_and_nest():
    original = nn.DataParallel.forward
    with runtime.checking(devices=2):
        assert nn.DataParallel.forward is not original
        with runtime.checking(devices=3):
            nn.DataParallel(Recorder())(torch.randn(9, 5))
            assert SEEN == [3, 3, 3]
        SEEN.clear()
        nn.DataParallel(Recorder())(torch.randn(9, 5))
        assert SEEN == [5, 4]
    assert nn.DataParallel.forward is original
    runtime.install(devices=2)
    runtime.install(devices=2)
    runtime.uninstall()
    assert runtime.is_installed()
    runtime.uninstall()
    assert nn.DataParallel.forward is original and nn.Module._apply is dataparallel._original_apply
    assert nn.DataParallel.__init__ is dataparallel._original_init
    assert nn.Module.load_state_dict is dataparallel._original_load_state_dict
    runtime.uninstall()  # one too many: harmless


def test_subclasses_of_dataparallel_are_checked():
    class MyDataParallel(nn.DataParallel):
        pass

    with runtime.checking(devices=4):
        MyDataParallel(Recorder())(torch.randn(8, 5))
    assert SEEN == [2, 2, 2, 2]


def test_invalid_arguments():
    with pytest.raises(ValueError):
        runtime.install(devices=0)
    with pytest.raises(ValueError):
        runtime.install(action="ignore")
    assert not runtime.is_installed()


def test_results_without_simulation_are_bit_identical_to_the_plain_module():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(30, 5)
    with runtime.checking():
        hooked = nn.DataParallel(module)(x)
    assert torch.equal(hooked, module(x))


def test_results_with_simulation_are_bit_identical_to_manual_chunk_apply_concatenate():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
    x = torch.randn(30, 5)
    with runtime.checking(devices=4):
        hooked = nn.DataParallel(module)(x)
    manual = torch.cat([module(chunk) for chunk in x.chunk(4, 0)], 0)
    assert torch.equal(hooked, manual)


def test_gradients_reach_the_original_parameters():
    module = nn.Linear(5, 1)
    x = torch.randn(12, 5)
    with runtime.checking(devices=3):
        nn.DataParallel(module)(x).sum().backward()
    expected = nn.Linear(5, 1)
    expected.load_state_dict(module.state_dict())
    expected(x).sum().backward()
    assert torch.allclose(module.weight.grad, expected.weight.grad)


def test_nested_outputs_are_gathered_recursively():
    Pair = collections.namedtuple("Pair", "left right")

    class Nested(nn.Module):
        def forward(self, x, scale):
            return {"pair": Pair(x * scale, [x + 1, None]), "label": "same for all"}

    x = torch.arange(12.0).reshape(6, 2)
    with runtime.checking(devices=3):
        out = nn.DataParallel(Nested())(x, 2.0)
    assert isinstance(out["pair"], Pair)
    assert torch.equal(out["pair"].left, x * 2)
    assert torch.equal(out["pair"].right[0], x + 1) and out["pair"].right[1] is None
    assert isinstance(out["label"], str)  # DataParallel turns strings into "<map object ...>" too


def test_non_tensors_are_shared_and_mismatched_chunks_truncate_like_dataparallel():
    class TwoInputs(nn.Module):
        def forward(self, x, h0):
            return x + h0.sum()

    x = torch.randn(10, 3)
    h0 = torch.zeros(2, 10, 5)  # chunked along dim 0 too: only 2 chunks, so only 2 replicas run
    with runtime.checking(devices=4):
        out = nn.DataParallel(TwoInputs())(x, h0)
    assert out.shape == (6, 3)


def test_keyword_padding_gives_dataparallels_type_error():
    with runtime.checking(devices=8, action="warn"), pytest.raises(TypeError), warnings.catch_warnings():
        warnings.simplefilter("ignore", PitfallWarning)
        nn.DataParallel(Recorder())(torch.randn(10, 5), flag=True)


def test_keyword_tensor_split_differently_gives_dataparallels_assertion():
    with runtime.checking(devices=8), pytest.raises(AssertionError, match="number of kwargs_tup"):
        nn.DataParallel(Recorder())(torch.randn(30, 5), mask=torch.ones(10))


class TimeMajor(nn.Module):
    def forward(self, x):
        return x.permute(1, 0, 2)  # [B, T, C] -> [T, B, C]


def test_dpl301_names_the_per_replica_and_gathered_shapes():
    with runtime.checking(devices=2), pytest.raises(PitfallError) as raised:
        nn.DataParallel(TimeMajor())(torch.randn(6, 5, 8))
    error = raised.value
    assert error.code == "DPL301" and isinstance(error, RuntimeError)
    assert "forward returned [5, 3, 8] per replica" in error.message
    assert "gathered along dim 0 this became [10, 3, 8] for a batch of 6" in error.message
    assert error.module_class == "TimeMajor" and error.filename == __file__
    assert error.lineno == TimeMajor.forward.__code__.co_firstlineno


class KeepsTimeMajor(nn.Module):
    def forward(self, x):
        return x.transpose(0, 1).relu().transpose(0, 1)  # [T, B, C] in and out


def test_dpl301_is_silent_when_output_keeps_the_batch_at_the_gather_dim():
    with runtime.checking(devices=2):
        out = nn.DataParallel(KeepsTimeMajor(), dim=1)(torch.randn(5, 6, 8))
    assert out.shape == (5, 6, 8)


def test_dpl301_reports_the_gather_dim_of_a_dim_1_wrapper():
    with runtime.checking(devices=2), pytest.raises(PitfallError, match="gathered along dim 1 this became"):
        nn.DataParallel(TimeMajor(), dim=1)(torch.randn(5, 6, 8))


def test_warn_mode_returns_what_dataparallel_returns():
    with runtime.checking(devices=2, action="warn"), pytest.warns(PitfallWarning, match="DPL301"):
        out = nn.DataParallel(TimeMajor())(torch.randn(6, 5, 8))
    assert out.shape == (10, 3, 8)


class Loss(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 1)

    def forward(self, x):
        return self.fc(x).mean()


def test_dpl305_scalar_output():
    with runtime.checking(devices=3), pytest.raises(PitfallError, match="DPL305"):
        nn.DataParallel(Loss())(torch.randn(10, 5))
    with runtime.checking(devices=3, action="warn"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = nn.DataParallel(Loss())(torch.randn(10, 5))
    assert out.shape == (3,)
    texts = [str(w.message) for w in caught]
    assert any("all input tensors were scalars" in t for t in texts)
    assert any("uneven ([4, 4, 2])" in t for t in texts)


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 2)
        self.steps = 0
        self.history = []

    def forward(self, x):
        self.steps += 1
        return self.fc(x)


def test_dpl304_attribute_updates_are_lost_on_replicas():
    model = Counter()
    with runtime.checking(devices=2), pytest.raises(PitfallError, match=r"DPL304 `Counter.forward` rebinds `self.steps`"):
        nn.DataParallel(model)(torch.randn(4, 5))
    with runtime.checking(devices=2, action="warn"), pytest.warns(PitfallWarning, match="DPL304"):
        nn.DataParallel(model)(torch.randn(4, 5))
    assert model.steps == 0  # lost, as on replicas


def test_dpl304_in_place_changes_and_nothing_for_buffers():
    class Appends(Counter):
        def forward(self, x):
            self.history.append(1)
            return self.fc(x)

    class BufferUpdate(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm1d(5)

        def forward(self, x):
            return self.norm(x)

    with runtime.checking(devices=2), pytest.raises(PitfallError, match="changes `self.history` in place"):
        nn.DataParallel(Appends())(torch.randn(4, 5))
    module = BufferUpdate()
    with runtime.checking(devices=2):
        nn.DataParallel(module)(torch.randn(8, 5))
    assert module.norm.num_batches_tracked.item() == 1  # only the first replica's update is kept


def test_dpl103_names_offenders_and_is_rechecked_after_a_move():
    model = nn.DataParallel(Recorder())
    model.module.fc.to("meta")
    with runtime.checking(devices=2), pytest.raises(PitfallError) as raised:
        model(torch.randn(4, 5))
    assert raised.value.code == "DPL103"
    assert "fc.weight on meta, fc.bias on meta, expected cpu" in raised.value.message
    model.module.to_empty(device="cpu")
    with runtime.checking(devices=2):
        model(torch.randn(4, 5))


def test_advice_always_warns_even_in_raise_mode():
    with runtime.checking(devices=1), pytest.warns(PitfallWarning, match="DPL307"):
        out = nn.DataParallel(Loss())(torch.randn(4, 5))
    assert out.dim() == 0  # one device: called directly, nothing gathered
    with runtime.checking(devices=8), pytest.warns(PitfallWarning, match="DPL306"):
        nn.DataParallel(Recorder())(torch.randn(3, 5))


def test_concurrent_calls_from_threads():
    errors = []
    model = nn.DataParallel(Recorder())

    def work():
        try:
            for _ in range(20):
                assert model(torch.randn(8, 5)).shape == (8, 2)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    with runtime.checking(devices=4):
        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []


def test_dpl303_load_state_dict_with_module_prefix_raises_even_when_not_strict():
    wrapped = nn.DataParallel(nn.Linear(3, 2))
    plain = nn.Linear(3, 2)
    with runtime.checking(devices=2):
        with pytest.raises(PitfallError, match="DPL303 load_state_dict: the checkpoint's keys start with `module.`"):
            plain.load_state_dict(wrapped.state_dict(), strict=False)
        with pytest.raises(PitfallError, match="the model's keys start with `module.`"):
            wrapped.load_state_dict(plain.state_dict())
        plain.load_state_dict(wrapped.module.state_dict())  # the fix loads
    assert torch.equal(plain.weight, wrapped.module.weight)
    # Without the hook, torch silently loads nothing under strict=False: the pitfall itself.
    result = nn.Linear(3, 2).load_state_dict(wrapped.state_dict(), strict=False)
    assert len(result.missing_keys) == 2 and len(result.unexpected_keys) == 2
