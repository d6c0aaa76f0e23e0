"""Issue 19: what a parameter holds, read from every call of its function across the project's files
(DPL101), and the functional `data_parallel` inside `forward` on a time-first tensor (DPL301), also
through a project function that hands its arguments on to it."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from dplint.analysis.facts import ProjectFacts, collect_file_facts

LOSS = (
    "import torch.nn as nn\n\n\n"
    "class YoloLoss(nn.Module):\n"
    "    def __init__(self, anchors, num_classes, device='cuda'):\n"
    "        super(YoloLoss, self).__init__()\n"
    "        self.anchors = anchors\n"
    "        self.anchors.to(device)\n"
)
ANCHORS = "import torch\n\n\ndef make_anchors(sizes):\n    anchors = torch.tensor(sizes)\n    return anchors.float()\n"
TRAIN = (
    "import torch\nfrom anchors import make_anchors\nfrom loss import YoloLoss\n\n\n"
    "def main(n):\n    anchors = make_anchors([[10, 13]])\n    return YoloLoss(anchors, n)\n"
)
FOUND = ["loss.py:8:9 DPL101"]


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def dplint(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dplint", "--format", "concise", *args], cwd=cwd, capture_output=True, text=True)


def codes(result: subprocess.CompletedProcess) -> list:
    return [line.split(": ")[0] + " " + line.split(": ")[1].split()[0] for line in result.stdout.splitlines() if ": DPL" in line]


def project(root: Path, **files: str) -> Path:
    write(root, "pyproject.toml", "[project]\nname = 'detector'\n")
    for name, text in {"loss": LOSS, "anchors": ANCHORS, "train": TRAIN, **files}.items():
        if text is not None:
            write(root, f"{name.replace('__', '/')}.py", text)
    return root


def discarded(root: Path, *args: str) -> list:
    return codes(dplint("--no-cache", "--select", "DPL101", *args, ".", cwd=root))


# ----- DPL101: parameters from the calls of other files -----------------------------------------------


def test_a_parameter_every_call_in_another_file_passes_a_tensor_is_a_tensor(tmp_path):
    assert discarded(project(tmp_path)) == FOUND
    result = dplint("--no-cache", "--select", "DPL101", ".", cwd=tmp_path)
    assert "`self.anchors.to(device)` returns a moved copy that is discarded; `self.anchors` itself does not move." in result.stdout


@pytest.mark.parametrize(
    "train",
    [
        # A module-level name of another module, assigned a project function's tensor.
        "import torch\nimport config as cfg\nfrom loss import YoloLoss\n\ncriterion = YoloLoss(cfg.anchors, 3)\n",
        "import torch\nfrom config import anchors\nfrom loss import YoloLoss\n\ncriterion = YoloLoss(anchors=anchors, num_classes=3)\n",
        # A local name bound twice, a tensor both times; a torch call.
        "import torch\nimport loss\n\n\ndef run(big):\n    a = torch.ones(3, 2)\n    if big:\n        a = a * 2\n"
        "    return loss.YoloLoss(a, 3)\n",
        # Two files call it, each with a tensor; a call in a statement's header counts as well.
        TRAIN + "\n\ndef other():\n    return YoloLoss(torch.zeros(2, 2), 1)\n",
        "import torch\nfrom loss import YoloLoss\n\nif YoloLoss(torch.ones(1), 3):\n    pass\n",
    ],
)
def test_tensor_arguments_are_read_however_the_caller_names_them(tmp_path, train):
    config = "from anchors import make_anchors\n\nanchors = make_anchors([[10, 13]])\n"
    assert discarded(project(tmp_path, train=train, config=config)) == FOUND


@pytest.mark.parametrize(
    "train",
    [
        # One call passes something not known to be a tensor.
        TRAIN + "\n\ndef other(boxes):\n    return YoloLoss(boxes, 1)\n",
        TRAIN + "\n\ndef other():\n    return YoloLoss([[1, 2]], 1)\n",
        # A module: its `.to()` moves it in place.
        "import torch.nn as nn\nfrom loss import YoloLoss\n\ncriterion = YoloLoss(nn.Linear(2, 2), 3)\n",
        # Used other than by calling it: stored, subclassed, handed on.
        TRAIN + "\nLOSSES = {'yolo': YoloLoss}\n",
        TRAIN + "\n\nclass FocalLoss(YoloLoss):\n    pass\n",
        TRAIN + "\nimport functools\nmake = functools.partial(YoloLoss, num_classes=3)\n",
        TRAIN + "\nimport loss\nother = getattr(loss, 'YoloLoss')([[1, 2]], 1)\n",  # the module handed on
        # A splat hides which parameter gets what.
        TRAIN + "\n\ndef other(args):\n    return YoloLoss(torch.ones(1), *args)\n",
        TRAIN + "\n\ndef other(kwargs):\n    return YoloLoss(torch.ones(1), **kwargs)\n",
        # A name some other binding may change: a loop, a `global`, a star import's.
        "import torch\nfrom loss import YoloLoss\n\n\ndef main(sizes):\n    anchors = torch.ones(3)\n"
        "    for anchors in sizes:\n        pass\n    return YoloLoss(anchors, 3)\n",
        "import torch\nfrom loss import YoloLoss\n\nanchors = torch.ones(3)\n\n\ndef reset():\n    global anchors\n"
        "    anchors = None\n\n\ndef main():\n    return YoloLoss(anchors, 3)\n",
        "import torch\nfrom loss import YoloLoss\nfrom settings import *\n\n\ndef main():\n    return YoloLoss(anchors, 3)\n",
    ],
)
def test_a_parameter_some_use_may_give_something_else_is_unknown(tmp_path, train):
    assert discarded(project(tmp_path, train=train)) == []


@pytest.mark.parametrize(
    "files",
    [
        # Callers outside what was read: a file that never names torch imports the module (at its top,
        # or inside a function), a package re-exports the class to importers not seen.
        {"plain": "from loss import YoloLoss\n\n\ndef build(boxes):\n    return YoloLoss(boxes, 1)\n"},
        {"plain": "def build(boxes):\n    from loss import YoloLoss\n\n    return YoloLoss(boxes, 1)\n"},
    ],
)
def test_a_caller_outside_the_read_files_makes_the_parameter_unknown(tmp_path, files):
    assert discarded(project(tmp_path, **files)) == []


def test_a_package_that_re_exports_the_class_hands_it_to_callers_not_seen(tmp_path):
    write(tmp_path, "det/__init__.py", "import torch\nfrom .loss import YoloLoss\n")
    write(tmp_path, "det/loss.py", LOSS)
    write(tmp_path, "det/anchors.py", ANCHORS)
    write(tmp_path, "det/train.py", TRAIN.replace("from anchors", "from .anchors").replace("from loss", "from .loss"))
    write(tmp_path, "pyproject.toml", "[project]\nname = 'det'\n")
    assert discarded(tmp_path) == []
    write(tmp_path, "det/__init__.py", "")
    assert discarded(tmp_path) == ["det/loss.py:8:9 DPL101"]


def test_a_default_counts_only_where_a_call_leaves_the_parameter_out(tmp_path):
    norm = "import torch\n\n\ndef normalize(x, mean=torch.zeros(3)):\n    mean.cuda()\n    return x - mean\n"
    caller = "import torch\nfrom norm import normalize\n\nnormalize(torch.ones(3))\n"
    assert discarded(project(tmp_path, norm=norm, train=caller)) == ["norm.py:5:5 DPL101"]
    assert discarded(project(tmp_path, norm=norm, train=caller + "normalize(torch.ones(3), mean=[0.5, 0.5, 0.5])\n")) == []
    assert discarded(project(tmp_path, norm=norm, train=caller + "normalize(torch.ones(3), torch.ones(3))\n")) == ["norm.py:5:5 DPL101"]


def test_a_class_built_some_other_way_is_unknown(tmp_path):
    built_by_itself = LOSS + "\n    @classmethod\n    def from_config(cls, cfg):\n        return cls(cfg.anchors, cfg.n)\n"
    assert discarded(project(tmp_path, loss=built_by_itself)) == []
    decorated = LOSS.replace("class YoloLoss", "@LOSSES.register_module()\nclass YoloLoss")
    assert discarded(project(tmp_path, loss=decorated)) == []


def test_a_caller_that_changes_its_argument_rechecks_the_defining_file_from_the_cache(tmp_path):
    project(tmp_path)
    assert codes(dplint("--select", "DPL101", ".", cwd=tmp_path)) == FOUND
    assert codes(dplint("--select", "DPL101", ".", cwd=tmp_path)) == FOUND  # warm
    write(tmp_path, "train.py", TRAIN.replace("YoloLoss(anchors, n)", "YoloLoss(anchors.tolist(), n)"))
    assert codes(dplint("--select", "DPL101", ".", cwd=tmp_path)) == []
    assert codes(dplint("--select", "DPL101", "loss.py", cwd=tmp_path)) == []


def test_one_staged_file_knows_the_calls_of_the_others(tmp_path):
    project(tmp_path)
    assert codes(dplint("--no-cache", "--select", "DPL101", "loss.py", cwd=tmp_path)) == FOUND


def test_the_facts_record_tensor_arguments_and_every_other_use():
    text = (
        "import torch\nimport config as cfg\nfrom loss import Loss, helper\n\n\n"
        "def main(args, items):\n    t = torch.zeros(3)\n    Loss(t, cfg.anchors, n=args.n)\n    Loss(t, *args)\n"
        "    helper([x for x in items])\n    run(helper)\n"
    )
    facts = collect_file_facts(text, "train", "", "train.py", "/p/train.py")
    (call,) = facts.project_calls
    assert (call.function, call.line, call.passed) == ("loss.Loss", 8, (2, ("n",)))
    assert call.tensors == ((0, ()), (1, ("config.anchors",)))
    assert set(facts.other_references) >= {"loss.Loss", "loss.helper"}
    assert pickle.loads(pickle.dumps(facts)) == facts  # the cache keeps them
    # A file that names no torch is not read for calls; the modules it imports inside functions are kept.
    plain = collect_file_facts("def f():\n    from loss import Loss\n", "plain", "", "plain.py", "/p/plain.py")
    assert plain.other_references is None and plain.nested_imports == ("loss", "loss.Loss")
    # A torch library's own modules are called from outside: never read for tensor arguments.
    assert collect_file_facts(text, "torch.train", "torch", "torch/train.py", "/p/torch/train.py").project_calls == ()


def test_parameter_kinds_join_the_calls_and_depend_on_the_tensor_facts():
    loss = collect_file_facts(LOSS, "loss", "", "loss.py", "/p/loss.py")
    anchors = collect_file_facts(ANCHORS, "anchors", "", "anchors.py", "/p/anchors.py")
    train = collect_file_facts(TRAIN, "train", "", "train.py", "/p/train.py")
    facts = ProjectFacts.build([loss, anchors, train])
    (call,) = facts.calls_from_other_files("/p/loss.py", "YoloLoss")
    assert call.tensors == ((0, ("anchors.make_anchors()",)),) and facts.tensors_known(call.tensors[0][1])
    without = ProjectFacts.build([loss, train])  # nothing shows what `make_anchors` returns
    assert not without.tensors_known(call.tensors[0][1])
    assert facts.digest != ProjectFacts.build([loss, anchors, collect_file_facts(TRAIN.replace("anchors, n", "[1], n"), "train", "", "train.py", "/p/train.py")]).digest


# ----- DPL301: the functional data_parallel inside forward ---------------------------------------------

PARALLEL = (
    "import torch.nn as nn\n\n\ndef data_parallel(model, inputs, ngpu):\n    if ngpu > 1:\n"
    "        return nn.parallel.data_parallel(model, inputs, range(ngpu))\n    return model(inputs)\n"
)
CRNN = (
    "import torch.nn as nn\nimport utils\n\n\nclass CRNN(nn.Module):\n    def __init__(self, ngpu):\n"
    "        super().__init__()\n        self.ngpu = ngpu\n        self.cnn = nn.Conv2d(1, 64, 3)\n        self.rnn = nn.LSTM(64, 32)\n\n"
    "    def forward(self, images):\n        conv = utils.data_parallel(self.cnn, images, self.ngpu).squeeze(2)\n"
    "        conv = conv.permute(2, 0, 1)\n        output, _ = utils.data_parallel(self.rnn, conv, self.ngpu)\n        return output\n"
)


def scattered(root: Path, **files: str) -> list:
    write(root, "pyproject.toml", "[project]\nname = 'ocr'\n")
    for name, text in files.items():
        write(root, f"{name}.py", text)
    return codes(dplint("--no-cache", "--select", "DPL301", ".", cwd=root))


def test_a_project_function_that_hands_its_arguments_to_data_parallel_scatters(tmp_path):
    assert scattered(tmp_path, utils=PARALLEL, crnn=CRNN) == ["crnn.py:15:21 DPL301"]
    result = dplint("--no-cache", "--select", "DPL301", "crnn.py", cwd=tmp_path)
    assert "`utils.data_parallel` scatters `conv` along dim 0 (utils.py:6), but `conv.permute(2, 0, 1)` put its batch at dim 1." in result.stdout


@pytest.mark.parametrize(
    "utils",
    [
        PARALLEL.replace("range(ngpu))", "range(ngpu), dim=1)"),  # scatters along the batch
        PARALLEL.replace("    if ngpu > 1:", "    inputs = prepare(inputs)\n    if ngpu > 1:"),  # not the caller's input
        PARALLEL.replace("return model(inputs)", "return nn.parallel.data_parallel(model, inputs, [0], dim=1)"),  # two dims
        "def data_parallel(model, inputs, ngpu):\n    return model(inputs)\n",
    ],
)
def test_a_helper_that_does_not_scatter_the_callers_input_along_dim_0_is_silent(tmp_path, utils):
    assert scattered(tmp_path, utils=utils, crnn=CRNN) == []


@pytest.mark.parametrize(
    "call, expected",
    [
        ("P.data_parallel(self.rnn, seq, [0, 1])", ["seq.py:9:21 DPL301"]),
        ("P.data_parallel(self.rnn, (seq, h), [0, 1])", ["seq.py:9:21 DPL301"]),
        ("P.data_parallel(self.rnn, seq, [0, 1], None, 1)", []),
        ("P.data_parallel(self.rnn, seq, [0, 1], dim=dim)", []),
        ("P.data_parallel(self.rnn, seq.transpose(0, 1), [0, 1])", []),
        ("P.data_parallel(self.rnn, *inputs)", []),
    ],
)
def test_data_parallel_by_any_import_name_on_a_time_first_tensor(tmp_path, call, expected):
    source = (
        "import torch\nimport torch.nn as nn\nimport torch.nn.parallel as P\n\n\nclass Seq(nn.Module):\n"
        "    def forward(self, x, h, dim=1, inputs=()):\n        seq = x.transpose(0, 1)\n"
        f"        output, _ = {call}\n        return output\n"
    )
    assert scattered(tmp_path, seq=source) == expected


def test_a_class_wrapped_along_another_dim_has_no_known_input_layout(tmp_path):
    source = (
        "import torch.nn as nn\nfrom torch.nn.parallel import data_parallel\n\n\nclass Seq(nn.Module):\n"
        "    def forward(self, x):\n        seq = x.transpose(0, 1)\n        return data_parallel(self.body, seq, [0, 1])\n"
    )
    assert scattered(tmp_path, seq=source) == ["seq.py:8:16 DPL301"]
    assert scattered(tmp_path, seq=source + "\n\nmodel = nn.DataParallel(Seq(), dim=1)\n") == []
    assert scattered(tmp_path, seq=source + "\n\nmodel = nn.DataParallel(Seq(), dim=args.dim)\n") == []
