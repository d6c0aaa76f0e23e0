"""The runtime hook with a real torch on CPU: DataParallel's semantics on simulated devices, and the checks."""

from __future__ import annotations

import collections
import importlib
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
from dplint.runtime import PitfallError, PitfallWarning  # noqa: E402
from dplint.runtime.dataparallel import checks as dataparallel  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PATCHED = {
    (owner, name): owner.__dict__[name]
    for owner, name in [
        (nn.DataParallel, "forward"),
        (nn.DataParallel, "scatter"),
        (nn.DataParallel, "replicate"),
        (nn.DataParallel, "parallel_apply"),
        (nn.DataParallel, "gather"),
        (nn.Module, "_apply"),
        (nn.Module, "load_state_dict"),
    ]
}


def torch_is_unpatched() -> bool:
    return all(owner.__dict__[name] is original for (owner, name), original in PATCHED.items())


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
    assert torch_is_unpatched()


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
    assert torch_is_unpatched()
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
    with runtime.checking(devices=4, action="warn"), pytest.warns(PitfallWarning, match="DPL310"):
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
    assert any("uneven chunks [4, 4, 2]" in t for t in texts)


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
    assert raised.value.message.endswith("on device_ids[0] (cpu), which DataParallel broadcasts from: fc.weight on meta, fc.bias on meta")
    assert raised.value.help == "call `model.to('cpu')` after building or changing the model, before the forward"
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


# ----- torch's own DataParallel code on CPU, as the reference ----------------------------------------
#
# torch 2.13's data_parallel.py:172-197 (forward), scatter_gather.py, replicate.py are pure Python
# except for the copies between devices (comm.scatter, comm.broadcast_coalesced, comm.gather) and
# parallel_apply's CUDA streams. `torch_on_cpu` replaces only those with what they do minus the copy,
# and builds a wrapper as DataParallel.__init__ does with GPUs (data_parallel.py:160-164).


def _cpu_broadcast(tensors, devices, detach=False):
    """replicate.py:83-112: device 0 gets the tensors themselves (views under autograd), the others copies."""
    if detach:
        return [list(tensors)] + [[t.detach().clone() for t in tensors] for _ in devices[1:]]
    return [[t.view_as(t) for t in tensors]] + [[t.clone() for t in tensors] for _ in devices[1:]]


def _cpu_gather(target_device, dim, *inputs):
    """_functions.py:94-109 without the CPU assertion; comm.gather allocates in the first input's dtype."""
    if all(t.dim() == 0 for t in inputs) and dim == 0:
        inputs = tuple(t.view(1) for t in inputs)
    if any(t.dim() != inputs[0].dim() for t in inputs):
        raise RuntimeError("Expected all input tensors to have the same number of dimensions")
    return torch.cat([t.to(inputs[0].dtype) for t in inputs], dim)


def _sequential_apply(modules, inputs, kwargs_tup=None, devices=None):
    """parallel_apply.py:85-138 in one thread: exceptions wrapped "in replica i on device d" (line 120)."""
    from torch._utils import ExceptionWrapper

    outputs = []
    for i, (module, args, kwargs, device) in enumerate(zip(modules, inputs, kwargs_tup, devices, strict=True)):
        try:
            outputs.append(module(*(args if isinstance(args, (list, tuple)) else (args,)), **kwargs))
        except Exception:
            ExceptionWrapper(where=f"in replica {i} on device {device}").reraise()
    return outputs


@pytest.fixture
def torch_on_cpu(monkeypatch):
    # The modules, not the functions of the same names that torch.nn.parallel exports.
    _functions = importlib.import_module("torch.nn.parallel._functions")
    data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")
    replicate_module = importlib.import_module("torch.nn.parallel.replicate")

    monkeypatch.setattr(_functions.Scatter, "apply", staticmethod(lambda gpus, sizes, dim, t: t.chunk(len(gpus), dim)))
    monkeypatch.setattr(_functions.Gather, "apply", staticmethod(_cpu_gather))
    monkeypatch.setattr(replicate_module, "_broadcast_coalesced_reshape", _cpu_broadcast)
    monkeypatch.setattr(data_parallel, "parallel_apply", _sequential_apply)

    def build(module, device_ids, dim=0, cls=nn.DataParallel):
        wrapper = cls.__new__(cls)
        nn.Module.__init__(wrapper)
        wrapper.module, wrapper.dim, wrapper.device_ids = module, dim, list(device_ids)
        wrapper.output_device, wrapper.src_device_obj = device_ids[0], torch.device("cpu")
        return wrapper

    return build


class Ragged(nn.Module):
    def forward(self, x):
        return [row for row in x]  # as many outputs as rows: chunks of 4, 4 and 2 give lists of 4, 4, 2


def test_gather_of_sequences_of_different_lengths_raises_like_torch(torch_on_cpu):
    x = torch.randn(10, 3)
    with pytest.raises(ValueError, match="zip"):  # scatter_gather.py:142, zip(*outputs, strict=True)
        torch_on_cpu(Ragged(), [0, 1, 2])(x)
    with runtime.checking(devices=3), pytest.raises(ValueError, match="zip"):
        nn.DataParallel(Ragged())(x)


def test_a_wrapper_built_before_checking_keeps_its_dim():
    wrapper = nn.DataParallel(KeepsTimeMajor(), dim=1)  # torch drops `dim` without GPUs (data_parallel.py:146-149)
    with runtime.checking(devices=2):
        assert wrapper(torch.randn(5, 6, 8)).shape == (5, 6, 8)  # with dim 0 assumed, this would be DPL301


def test_a_wrapper_built_before_dplint_was_imported_is_said_once_and_left_unsimulated():
    script = """
import warnings
import torch
import torch.nn as nn
seen = []
class M(nn.Module):
    def forward(self, x):
        seen.append(len(x))
        return x
wrapper = nn.DataParallel(M(), dim=1)
from dplint import runtime
with warnings.catch_warnings(record=True) as caught, runtime.checking(devices=2):
    warnings.simplefilter("always")
    wrapper(torch.randn(4, 6))
    wrapper(torch.randn(4, 6))
print(seen, len(caught), caught[0].category.__name__, str(caught[0].message).split(",")[0])
"""
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == (
        "[4, 4] 1 RuntimeWarning this `DataParallel` was built before dplint's checks were installed"
    )


def test_device_ids_of_one_is_torchs_single_device_shortcut(torch_on_cpu):
    x = torch.randn(8, 5)
    expected = torch_on_cpu(Loss(), [0])  # data_parallel.py:193-194: self.module(*inputs[0], ...)
    torch.manual_seed(0)
    reference = expected(x)
    torch.manual_seed(0)
    model = Loss()
    with runtime.checking(devices=4), pytest.warns(PitfallWarning, match="DPL307"):
        out = nn.DataParallel(model, device_ids=[0])(x)
    assert out.dim() == reference.dim() == 0


def test_device_ids_limit_the_simulated_devices(torch_on_cpu):
    torch_on_cpu(Recorder(), [0, 1])(torch.randn(8, 5))
    assert SEEN == [4, 4]
    SEEN.clear()
    with runtime.checking(devices=4):
        nn.DataParallel(Recorder(), device_ids=[0, 1])(torch.randn(8, 5))
    assert SEEN == [4, 4]


class Overrides(nn.DataParallel):
    calls: list = []

    def scatter(self, inputs, kwargs, device_ids):
        Overrides.calls.append("scatter")
        return super().scatter(inputs, kwargs, device_ids)

    def replicate(self, module, device_ids):
        Overrides.calls.append("replicate")
        return super().replicate(module, device_ids)

    def parallel_apply(self, replicas, inputs, kwargs):
        Overrides.calls.append("parallel_apply")
        return super().parallel_apply(replicas, inputs, kwargs)

    def gather(self, outputs, output_device):
        Overrides.calls.append("gather")
        return super().gather(outputs, output_device) * 2


def test_subclass_overrides_are_called_as_torchs_forward_calls_them(torch_on_cpu):
    module = Recorder()
    x = torch.randn(6, 5)
    reference = torch_on_cpu(module, [0, 1, 2], cls=Overrides)(x)  # data_parallel.py:186-197
    assert Overrides.calls == ["scatter", "replicate", "parallel_apply", "gather"]
    Overrides.calls.clear()
    with runtime.checking(devices=3):
        out = Overrides(module)(x)
    assert Overrides.calls == ["scatter", "replicate", "parallel_apply", "gather"]
    assert torch.equal(out, reference)


def _renorming_embedding():
    torch.manual_seed(0)
    embedding = nn.Embedding(4, 3, max_norm=1.0)
    with torch.no_grad():
        embedding.weight.mul_(10)
    return embedding


def test_replica_0_gets_the_original_parameters_and_the_others_copies(torch_on_cpu):
    ids = torch.tensor([0, 1, 2, 3])
    reference = _renorming_embedding()
    torch_on_cpu(reference, [0, 1])(ids).sum().backward()  # replicate.py:136, broadcast: replica 0 shares
    simulated = _renorming_embedding()
    with runtime.checking(devices=2):
        nn.DataParallel(simulated)(ids).sum().backward()
    # Replica 0 renormalised rows 0 and 1 in the original; replica 1 renormalised its copy's rows 2, 3.
    assert torch.equal(simulated.weight, reference.weight)
    assert simulated.weight[:2].norm(dim=1).max() <= 1.0 + 1e-6 and simulated.weight[2:].norm(dim=1).min() > 1.0
    assert torch.equal(simulated.weight.grad, reference.weight.grad)


def test_tied_weights_stay_tied_and_replicas_have_former_parameters(torch_on_cpu):
    torch_replicate = importlib.import_module("torch.nn.parallel.replicate")

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(6, 4)
            self.out = nn.Linear(4, 6, bias=False)
            self.out.weight = self.embed.weight

    model = Tied()
    reference = torch_replicate.replicate(model, [0, 1, 2])  # replicate.py:134-135 maps params by identity
    simulated = dataparallel.simulation.replicate(model, 3)
    for torch_replica, replica in zip(reference, simulated):
        assert (torch_replica.out.weight is torch_replica.embed.weight) and (replica.out.weight is replica.embed.weight)
        assert list(replica.out._former_parameters) == list(torch_replica.out._former_parameters) == ["weight"]
    assert reference[0].embed.weight._base is model.embed.weight and simulated[0].embed.weight._base is model.embed.weight
    assert simulated[1].embed.weight.data_ptr() != model.embed.weight.data_ptr()


def test_settings_are_per_thread():
    seen = collections.defaultdict(list)

    class PerThread(nn.Module):
        def forward(self, x):
            seen[threading.current_thread().name].append(len(x))
            return x

    model = nn.DataParallel(PerThread())
    both_inside = threading.Barrier(2)
    errors = []

    def work(devices):
        try:
            with runtime.checking(devices=devices):
                both_inside.wait(timeout=30)  # both settings active at once
                model(torch.randn(8, 2))
                both_inside.wait(timeout=30)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    def unchecked():
        model(torch.randn(8, 2))

    threads = [threading.Thread(target=work, args=(n,), name=f"devices={n}") for n in (8, 2)]
    for thread in threads:
        thread.start()
    with runtime.checking(devices=4):
        plain = threading.Thread(target=unchecked, name="never called checking")
        plain.start()
        plain.join()
        for thread in threads:
            thread.join()
    assert errors == []
    assert seen == {"devices=8": [1] * 8, "devices=2": [4, 4], "never called checking": [8]}


def test_gather_keeps_the_first_outputs_dtype(torch_on_cpu):
    class Mixed(nn.Module):
        def forward(self, x):
            return x.double() if len(x) == 2 else x  # chunks 4, 4, 2: the last replica returns float64

    x = torch.randn(10, 3)
    assert torch_on_cpu(Mixed(), [0, 1, 2])(x).dtype == torch.float32  # comm.gather: first input's dtype
    with runtime.checking(devices=3):
        assert nn.DataParallel(Mixed())(x).dtype == torch.float32  # torch.cat alone would promote to float64


def test_gather_of_outputs_with_different_numbers_of_dims_raises():
    class Empty(nn.Module):
        def forward(self, x):
            return x.new_zeros(0) if len(x) == 2 else x  # torch.cat skips a 1-D empty tensor; comm.gather does not

    with runtime.checking(devices=3), pytest.raises(RuntimeError, match="same number of dimensions"):
        nn.DataParallel(Empty())(torch.randn(10, 3))


def test_an_exception_in_a_replica_names_the_replica_as_torch_does(torch_on_cpu):
    class FailsOnShortChunks(nn.Module):
        def forward(self, x):
            if len(x) < 4:
                raise ValueError("short chunk")
            return x

    with pytest.raises(ValueError, match="Caught ValueError in replica 2 on device 2") as from_torch:
        torch_on_cpu(FailsOnShortChunks(), [0, 1, 2])(torch.randn(10, 3))
    with runtime.checking(devices=3), pytest.raises(ValueError) as simulated:
        nn.DataParallel(FailsOnShortChunks())(torch.randn(10, 3))
    assert str(simulated.value).splitlines()[0] == str(from_torch.value).splitlines()[0]


def test_uninstall_keeps_a_patch_made_by_someone_else_after_dplint():
    with runtime.checking(devices=2):
        dplints = nn.DataParallel.forward

        def third_party(self, *inputs, **kwargs):
            third_party.calls += 1
            return dplints(self, *inputs, **kwargs)

        third_party.calls = 0
        nn.DataParallel.forward = third_party
    try:
        assert nn.DataParallel.forward is third_party  # dplint restored only what is still its own
        assert nn.DataParallel.scatter is PATCHED[(nn.DataParallel, "scatter")]
        nn.DataParallel(Recorder())(torch.randn(4, 5))
        assert third_party.calls == 1 and SEEN == [4]  # dplint's function, now off, calls torch's
    finally:
        nn.DataParallel.forward = PATCHED[(nn.DataParallel, "forward")]


# ----- missed bugs ------------------------------------------------------------------------------------


def test_dpl310_inputs_of_different_batch_sizes_drop_samples(torch_on_cpu):
    class TwoBatches(nn.Module):
        def forward(self, x, y):
            return x

    x, y = torch.randn(8, 3), torch.randn(2, 3)
    # scatter_gather.py:66, zip(..., strict=False): 4 chunks of x, 2 of y, so 2 replicas and 4 rows lost.
    assert torch_on_cpu(TwoBatches(), [0, 1, 2, 3])(x, y).shape == (4, 3)
    with runtime.checking(devices=4), pytest.raises(PitfallError) as raised:
        nn.DataParallel(TwoBatches())(x, y)
    assert raised.value.code == "DPL310"
    assert "only 2 replicas ran and 4 of the 8 rows of `input[0]` were dropped" in raised.value.message
    with runtime.checking(devices=4):
        nn.DataParallel(TwoBatches())(x, torch.randn(8, 3))  # same batch sizes: silent


class Stateful(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 2)
        self.register_buffer("ema", torch.zeros(2))
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))
        self.cache = {"last": None}
        self.total = torch.zeros(())


@pytest.mark.parametrize(
    "body, expected",
    [
        ("self.ema = 0.9 * self.ema + 0.1 * out.mean(0).detach()", "rebinds the buffer `self.ema`"),
        ("self.extra = nn.Parameter(torch.zeros(1))", "sets the parameter `self.extra`"),
        ("self.fc = nn.Linear(5, 2)", "rebinds the submodule `self.fc`"),
        ("self.cache['last'] = out", "changes `self.cache` in place"),
        ("self.total += out.sum().detach()", "changes `self.total` in place"),
    ],
)
def test_dpl304_buffers_parameters_submodules_dict_items_and_tensor_attributes(body, expected):
    namespace = {"nn": nn, "torch": torch, "Stateful": Stateful}
    exec(f"class Changes(Stateful):\n    def forward(self, x):\n        out = self.fc(x)\n        {body}\n        return out\n", namespace)
    with runtime.checking(devices=2), pytest.raises(PitfallError, match="DPL304") as raised:
        nn.DataParallel(namespace["Changes"]())(torch.randn(4, 5))
    assert expected in raised.value.message
    assert "replica 0 keeps it" in raised.value.help  # the advice: in-place buffer updates


def test_dpl304_silent_for_in_place_buffer_updates():
    class InPlace(Stateful):
        def forward(self, x):
            out = self.fc(x)
            self.ema.mul_(0.9).add_(0.1 * out.mean(0).detach())
            self.seen += 1  # a buffer: `+=` is in place
            return out

    model = InPlace()
    with runtime.checking(devices=2):
        nn.DataParallel(model)(torch.randn(4, 5))
    assert model.seen.item() == 1  # replica 0's buffers are the originals (replicate.py:150-153, 212)


def test_dpl304_checks_user_modules_whose_class_torch_generated():
    from torch.nn.utils import parametrize

    class Symmetric(nn.Module):
        def forward(self, w):
            return w.triu() + w.triu(1).transpose(0, 1)

    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(3, 3))
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return x @ self.weight

    model = Counting()
    parametrize.register_parametrization(model, "weight", Symmetric())
    assert type(model).__module__ == "torch.nn.utils.parametrize"
    with runtime.checking(devices=2), pytest.raises(PitfallError, match="rebinds `self.calls`"):
        nn.DataParallel(model)(torch.randn(4, 3))


def test_dpl303_checkpoint_with_prefix_and_a_different_head_loads_nothing(monkeypatch):
    class Backbone(nn.Module):
        def __init__(self, head):
            super().__init__()
            self.body = nn.Linear(4, 8)
            self.add_module(head, nn.Linear(8, 3))

    checkpoint = {f"module.{key}": value for key, value in Backbone("classifier").state_dict().items()}
    calls = []
    original_state_dict = nn.Module.state_dict

    def counting_state_dict(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return original_state_dict(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "state_dict", counting_state_dict)
    model = Backbone("head")
    with runtime.checking(devices=2), pytest.raises(PitfallError) as raised:
        model.load_state_dict(checkpoint, strict=False)
    assert raised.value.code == "DPL303" and "`strict=False` would silently load nothing" in raised.value.message
    assert "only 2 of its 4 keys match the model's 4" in raised.value.message
    assert calls == []  # keys compared without running state_dict() and its hooks
    with runtime.checking(devices=2):
        model.load_state_dict({k[len("module."):]: v for k, v in checkpoint.items() if ".body." in k}, strict=False)


# ----- false positives ---------------------------------------------------------------------------------


class Tagger(nn.Module):
    """Batch-first tagger: [B, T] in, pairs of tags out, flattened across the batch as its loss wants."""

    def forward(self, x):
        return x.float().reshape(-1, 2)


class MetricsRow(nn.Module):
    def forward(self, x):
        return torch.stack([x.mean(), x.std(), x.min(), x.max()])[None]  # [1, 4]: one row per replica


@pytest.mark.parametrize("module, batch", [(Tagger(), torch.randn(4, 6)), (MetricsRow(), torch.randn(8, 3))])
def test_dpl301_is_silent_when_a_dimension_only_happens_to_equal_the_chunk_size(module, batch):
    with runtime.checking(devices=2):
        nn.DataParallel(module)(batch)


def test_dpl301_still_finds_a_time_major_output_with_even_chunks():
    with runtime.checking(devices=2), pytest.raises(PitfallError, match="DPL301"):
        nn.DataParallel(TimeMajor())(torch.randn(4, 3, 8))  # per replica [3, 2, 8]: sizes alone cannot tell


class MyConv(nn.Conv2d):
    pass


class MyLSTM(nn.LSTM):
    def forward(self, x):
        return super().forward(x)[0]


class OwnWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 3))

    def forward(self, x):
        return x.flatten(1)[:, :3] @ self.w


def _spectral(module, name):
    return nn.utils.spectral_norm(module, name=name)


def _weight_norm(module, name):
    return nn.utils.weight_norm(module, name=name)


def _pruned(module, name):
    import torch.nn.utils.prune  # noqa: F401 - a submodule torch does not import itself

    return nn.utils.prune.l1_unstructured(module, name=name, amount=0.5)


@pytest.mark.parametrize("reparametrise", [_spectral, _weight_norm, _pruned])
@pytest.mark.parametrize("build, name", [(lambda: MyConv(1, 2, 3), "weight"), (OwnWeight, "w")])
def test_dpl304_silent_for_torchs_reparametrisations(reparametrise, build, name):
    model = reparametrise(build(), name)
    with runtime.checking(devices=2), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # weight_norm's deprecation
        nn.DataParallel(model)(torch.randn(4, 1, 5, 5))


def test_dpl304_silent_for_a_user_subclass_of_lstm():
    with runtime.checking(devices=2, ignore=["DPL301"]):
        nn.DataParallel(MyLSTM(3, 4, batch_first=True))(torch.randn(4, 5, 3))


def test_ignore_codes_at_runtime():
    with runtime.checking(devices=3, ignore=["DPL305"]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert nn.DataParallel(Loss())(torch.randn(9, 5)).shape == (3,)
    with runtime.checking(devices=2, ignore=["dpl304"]):
        nn.DataParallel(Counter())(torch.randn(4, 5))
    with pytest.raises(ValueError, match="DPL999 not runtime codes"):
        runtime.install(ignore=["DPL999"])
    with pytest.raises(ValueError, match="a list of codes"):
        runtime.install(ignore="DPL305")


# ----- cost ----------------------------------------------------------------------------------------------


def test_replication_does_not_invalidate_the_dpl103_cache():
    model = nn.DataParallel(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU()))
    with runtime.checking(devices=4):
        model(torch.randn(8, 1, 5, 5))
        generation = dataparallel._generation[0]
        model(torch.randn(8, 1, 5, 5))
        assert dataparallel._generation[0] == generation  # replicas register buffers: not the model's change
        model.module.add_module("extra", nn.BatchNorm2d(2))
        assert dataparallel._generation[0] > generation


# ----- DPL309: are the rows independent? ---------------------------------------------------------------


def _transformer(batch_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=batch_first)
    return nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False).eval()


def test_dpl309_time_major_transformer_split_along_the_sequence():
    sequence_first = torch.randn(6, 4, 8)  # [S, B, E]
    with runtime.checking(devices=2):
        nn.DataParallel(_transformer(batch_first=False))(sequence_first)  # off by default: silent
    with runtime.checking(devices=2, check_rows=True), pytest.raises(PitfallError) as raised:
        nn.DataParallel(_transformer(batch_first=False))(sequence_first)
    assert raised.value.code == "DPL309"
    assert "splitting dim 0 split the sequence" in raised.value.message and "batch_first=True" in raised.value.help
    with runtime.checking(devices=2, check_rows=True):
        nn.DataParallel(_transformer(batch_first=False), dim=1)(sequence_first)  # split along the batch: fine
        nn.DataParallel(_transformer(batch_first=True))(sequence_first.transpose(0, 1))
    with runtime.checking(devices=2, check_rows=True, ignore=["DPL309"]):
        nn.DataParallel(_transformer(batch_first=False))(sequence_first)


def test_dpl309_batch_norm_in_training_is_advice():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4))
    with runtime.checking(devices=2, check_rows=True), pytest.warns(PitfallWarning, match=r"DPL309 .*\n  help: use `nn.SyncBatchNorm`"):
        nn.DataParallel(model)(torch.randn(8, 5))
    assert model[1].num_batches_tracked.item() == 1  # the extra forward ran on a copy
    with runtime.checking(devices=2, check_rows=True), warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process: the same for every BatchNorm model
        nn.DataParallel(nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4)))(torch.randn(8, 5))
    with runtime.checking(devices=2, check_rows=True):
        nn.DataParallel(model.eval())(torch.randn(8, 5))


def test_dpl309_silent_for_independent_rows_and_for_random_forwards():
    torch.manual_seed(0)
    with runtime.checking(devices=3, check_rows=True):
        nn.DataParallel(nn.Sequential(nn.Linear(5, 64), nn.Tanh(), nn.Linear(64, 3)))(torch.randn(30, 5))
        state = torch.get_rng_state()
        nn.DataParallel(nn.Sequential(nn.Linear(5, 4), nn.Dropout(0.5)))(torch.randn(30, 5))  # skipped
        assert not torch.equal(state, torch.get_rng_state())


class CRNN(nn.Module):
    """Conv features per image column, then a time-major LSTM: [B, 1, 8, T] in, [T, B, 6] out."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.rnn = nn.LSTM(4 * 8, 6)

    def forward(self, images):
        features = self.norm(self.conv(images)).relu()
        batch, channels, height, time = features.shape
        return self.rnn(features.permute(3, 0, 1, 2).reshape(time, batch, channels * height))[0]


def test_dpl301_finds_a_time_axis_as_long_as_each_replicas_batch():
    torch.manual_seed(0)
    with runtime.checking(devices=2), pytest.raises(PitfallError) as raised:
        nn.DataParallel(CRNN())(torch.randn(10, 1, 8, 5))  # per replica [5, 5, 6]: T equals the chunk
    assert raised.value.code == "DPL301" and raised.value.message.endswith("for a batch of 10, whose samples are at dim 1")


def test_dpl301_on_an_uneven_last_batch_says_torchs_gather_raises_and_warn_goes_on():
    torch.manual_seed(0)
    model = CRNN().eval()
    images = torch.randn(3, 1, 8, 5)
    with runtime.checking(devices=2), pytest.raises(PitfallError) as raised:
        nn.DataParallel(model)(images)
    assert raised.value.message.startswith(
        "forward returned [5, 2, 6], [5, 1, 6] per replica (output) for a batch split [2, 1], its samples at dim 1: on "
        "GPUs the gather along dim 0 raises a size mismatch"
    )
    with runtime.checking(devices=2, action="warn"), pytest.warns(PitfallWarning, match="DPL301.*raises a size mismatch"):
        out = nn.DataParallel(model)(images)
    with torch.no_grad():
        single = torch.cat([model(images[:2]), model(images[2:])], dim=1)
    torch.testing.assert_close(out.detach(), single)  # the batch concatenated where it is, as one device returns it


class DeviceOfFirstParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x.to(next(self.parameters()).device))  # empty on replicas since torch 1.5


@pytest.mark.parametrize("grad, failing", [(True, 0), (False, 1)])
def test_dpl311_replicas_have_no_parameters_as_torchs_replicate_leaves_them(torch_on_cpu, grad, failing):
    """replicate.py setattr()s each copy on a replica whose `_parameters` is empty: with gradients every
    replica's `parameters()` is empty; without, replica 0 gets the Parameters themselves (registered)."""
    x = torch.randn(4, 4)
    expected = f"Caught StopIteration in replica {failing} on device {failing}"
    with torch.set_grad_enabled(grad):
        with pytest.raises(StopIteration, match=expected):
            torch_on_cpu(DeviceOfFirstParameter(), [0, 1])(x)  # torch's own code
        with runtime.checking(devices=2, ignore=["DPL311"]), pytest.raises(StopIteration, match=expected):
            nn.DataParallel(DeviceOfFirstParameter())(x)  # the simulation
        # With GPUs (no simulation), the check reads torch's own error between its steps.
        with runtime.checking(), pytest.raises(PitfallError, match=f"DPL311 .* raised StopIteration in replica {failing}") as info:
            torch_on_cpu(DeviceOfFirstParameter(), [0, 1])(x)
    assert isinstance(info.value.__cause__, StopIteration) and info.value.filename == __file__
