"""Facts from the whole project, whatever paths are named: how pre-commit and editors run dplint."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dplint.analysis.modules import ModuleIndex, find_project_root

ROOT = Path(__file__).resolve().parent.parent
CRNN = (ROOT / "fixtures" / "crnn_model.py").read_text()
WRAPS = "import torch.nn as nn\nfrom models.crnn import CRNN\n\nmodel = nn.DataParallel(CRNN(32, 1, 37, 256))\n"
DOES_NOT_WRAP = "from models.crnn import CRNN\n\nmodel = CRNN(32, 1, 37, 256)\n"


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def dplint(*args: str, cwd: Path, stdin: str = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dplint", "--format", "concise", *args], cwd=cwd, input=stdin, capture_output=True, text=True
    )


def codes(result: subprocess.CompletedProcess) -> list:
    return [line.split(": ")[0] + " " + line.split(": ")[1].split()[0] for line in result.stdout.splitlines() if ": DPL" in line]


@pytest.fixture
def project(tmp_path):
    """A research repo: the model in models/, the DataParallel wrap in train.py."""
    write(tmp_path, "pyproject.toml", "[project]\nname = 'crnn'\n")
    write(tmp_path, "models/__init__.py", "")
    write(tmp_path, "models/crnn.py", CRNN)
    write(tmp_path, "train.py", WRAPS)
    return tmp_path


# ----- resolution ------------------------------------------------------------------------------------


def index(root: Path, *relatives: str) -> ModuleIndex:
    return ModuleIndex([str(root / r) for r in relatives], str(root))


def test_import_resolves_from_the_importing_files_folder_first(tmp_path):
    modules = index(tmp_path, "exp1/train.py", "exp1/utils.py", "utils.py")
    assert modules.resolve("utils", str(tmp_path / "exp1/train.py")) == str(tmp_path / "exp1/utils.py")
    assert modules.resolve("utils", str(tmp_path / "exp2/train.py")) == str(tmp_path / "utils.py")  # an ancestor's


def test_a_sibling_programs_module_is_never_chosen(tmp_path):
    modules = index(tmp_path, "a/train_keras.py", "b/train/__init__.py", "b/train/model_factory.py")
    assert modules.resolve("train.model_factory", str(tmp_path / "a/train_keras.py")) is None
    assert modules.resolve("train.model_factory", str(tmp_path / "b/run.py")) == str(tmp_path / "b/train/model_factory.py")


def test_absolute_imports_inside_a_package_resolve_from_the_folder_holding_the_package(tmp_path):
    modules = index(tmp_path, "proj/__init__.py", "proj/models/__init__.py", "proj/models/crnn.py", "proj/train.py")
    assert modules.resolve("proj.models.crnn", str(tmp_path / "proj/train.py")) == str(tmp_path / "proj/models/crnn.py")
    assert modules.resolve_chain("proj.models.crnn", str(tmp_path / "proj/train.py")) == tuple(
        str(tmp_path / r) for r in ("proj/__init__.py", "proj/models/__init__.py", "proj/models/crnn.py")
    )


def test_a_scripts_own_plain_module_shadows_a_package_of_that_name(tmp_path):
    # train/src/train.py: `from ImageReward import ImageReward` takes a class of the sibling module
    # ImageReward.py, not the root package's ImageReward/ImageReward.py.
    modules = index(tmp_path, "train/src/train.py", "train/src/ImageReward.py", "ImageReward/__init__.py", "ImageReward/ImageReward.py")
    train = str(tmp_path / "train/src/train.py")
    assert modules.resolve("ImageReward", train) == str(tmp_path / "train/src/ImageReward.py")
    assert modules.resolve("ImageReward.ImageReward", train) is None
    assert modules.resolve("ImageReward.ImageReward", str(tmp_path / "run.py")) == str(tmp_path / "ImageReward/ImageReward.py")
    # Inside a package its own folder is not on sys.path: `from .distributed import is_primary` in
    # distributed/__init__.py is distributed/distributed.py, though a plain `distributed.py` sits beside it.
    modules = index(tmp_path, "train.py", "distributed/__init__.py", "distributed/distributed.py")
    package = str(tmp_path / "distributed/__init__.py")
    assert modules.resolve("distributed.distributed", package) == str(tmp_path / "distributed/distributed.py")


def test_src_layout_and_namespace_packages(tmp_path):
    modules = index(tmp_path, "src/pkg/model.py", "scripts/train.py")
    assert modules.resolve("pkg.model", str(tmp_path / "scripts/train.py")) == str(tmp_path / "src/pkg/model.py")


def test_project_root_is_the_nearest_folder_with_a_marker(tmp_path):
    write(tmp_path, "repo/setup.cfg", "")
    write(tmp_path, "repo/sub/pkg/model.py", "")
    assert find_project_root(tmp_path / "repo/sub/pkg/model.py") == tmp_path / "repo"
    (tmp_path / "repo/sub/.git").mkdir()
    assert find_project_root(tmp_path / "repo/sub/pkg") == tmp_path / "repo/sub"


# ----- through the command line ----------------------------------------------------------------------


def test_one_named_file_sees_the_wrap_in_an_unnamed_file(project):
    result = dplint("--no-cache", "models/crnn.py", cwd=project)
    assert codes(result) == ["models/crnn.py:54:16 DPL301"], result.stdout + result.stderr
    assert "train.py:4" in result.stdout


def test_findings_are_reported_for_the_named_files_only(project):
    write(project, "train.py", WRAPS + "import torch\nx = torch.zeros(1)\nx.cuda()\n")
    assert codes(dplint("--no-cache", "models/crnn.py", cwd=project)) == ["models/crnn.py:54:16 DPL301"]
    assert "train.py:7:1 DPL101" in codes(dplint("--no-cache", ".", cwd=project))


def test_without_a_project_root_the_named_paths_are_the_project(project):
    (project / "pyproject.toml").unlink()
    assert codes(dplint("--no-cache", "models/crnn.py", cwd=project)) == []
    assert codes(dplint("--no-cache", "--project-root", ".", "models/crnn.py", cwd=project)) == ["models/crnn.py:54:16 DPL301"]


def test_project_root_option_must_name_a_folder(project):
    result = dplint("--project-root", "nowhere", "models/crnn.py", cwd=project)
    assert result.returncode == 2 and "--project-root: `nowhere` is not a folder" in result.stderr


def test_excluded_files_give_no_facts(project):
    write(project, "pyproject.toml", "[tool.dplint]\nextend-exclude = ['train.py']\n")
    assert codes(dplint("--no-cache", "models/crnn.py", cwd=project)) == []


def test_a_changed_fact_in_an_unnamed_file_rechecks_the_named_file(project):
    assert codes(dplint("models/crnn.py", cwd=project)) == ["models/crnn.py:54:16 DPL301"]
    write(project, "train.py", DOES_NOT_WRAP)
    assert codes(dplint("models/crnn.py", cwd=project)) == []  # the cached result is not reused
    write(project, "train.py", WRAPS)
    assert codes(dplint("models/crnn.py", cwd=project)) == ["models/crnn.py:54:16 DPL301"]


def test_standard_input_is_linted_with_the_projects_facts(project):
    result = dplint("--no-cache", "--stdin-filename", "models/crnn.py", "-", cwd=project, stdin=CRNN)
    assert codes(result) == ["models/crnn.py:54:16 DPL301"]
    # The text read stands in for the file on disk: here train.py itself no longer wraps.
    result = dplint("--no-cache", "--stdin-filename", "train.py", "-", cwd=project, stdin=DOES_NOT_WRAP)
    assert result.returncode == 0


def test_sibling_programs_fixture_blames_only_the_program_that_imports_torch():
    result = dplint("--no-cache", "fixtures/sibling_programs", cwd=ROOT)
    assert codes(result) == ["fixtures/sibling_programs/torch_solution/run.py:7:1 DPL202"]


# ----- as pre-commit runs it -------------------------------------------------------------------------


def test_pre_commit_with_only_the_model_file_staged(project, tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    pytest.importorskip("pre_commit", reason="pre-commit comes with the test extra")
    home = tmp_path_factory.mktemp("pre-commit-home")
    environment = {**os.environ, "PRE_COMMIT_HOME": str(home), "GIT_AUTHOR_NAME": "t", "GIT_COMMITTER_NAME": "t",
                   "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_EMAIL": "t@example.com"}

    def git(*args):
        subprocess.run(["git", *args], cwd=project, check=True, env=environment, capture_output=True)

    git("init", "-q")
    git("add", "pyproject.toml", "train.py", "models/__init__.py")
    git("commit", "-qm", "training script")
    git("add", "models/crnn.py")  # the commit being made touches the model only
    write(project, "notes.py", "")  # untracked, unstaged: pre-commit must not need it either

    hook = subprocess.run(
        [sys.executable, "-m", "pre_commit", "try-repo", str(ROOT), "dplint"],
        cwd=project, capture_output=True, text=True, env=environment, timeout=900,
    )
    if "An unexpected error has occurred" in hook.stdout + hook.stderr:
        pytest.skip(f"pre-commit could not build the hook's environment here: {(hook.stdout + hook.stderr)[-600:]}")
    assert hook.returncode == 1, hook.stdout + hook.stderr
    assert "models/crnn.py:54:16: DPL301" in hook.stdout and "train.py:4" in hook.stdout


def test_a_wrapper_returned_or_held_by_an_object_of_another_file_is_followed(tmp_path):
    write(tmp_path, "pyproject.toml", "[project]\nname = 'reid'\n")
    write(
        tmp_path,
        "engine/parallel.py",
        "import torch.nn as nn\n\n\ndef build(net):\n    return nn.DataParallel(net).cuda()\n\n\n"
        "class Trainer:\n    def __init__(self, net):\n        self.net = nn.DataParallel(net)\n",
    )
    write(tmp_path, "engine/__init__.py", "")
    write(
        tmp_path,
        "train.py",
        "import torch\nfrom engine.parallel import Trainer, build\n\n"
        "model = build(Net())\nmodel.fc\ntrainer = Trainer(Net())\ntorch.save({'state_dict': trainer.net.state_dict()}, 'a.pt')\n",
    )
    result = dplint("--no-cache", "--select", "DPL302,DPL303,DPL312", "train.py", cwd=tmp_path)
    assert codes(result) == ["train.py:5:1 DPL302", "train.py:7:27 DPL312"]
    assert "(`build()`, engine/parallel.py:5)" in result.stdout


GRIT_BASE = """\
import torch


class Encoder(torch.nn.Module):
    def __init__(self, name, is_inference=True):
        super().__init__()
        self.model = load(name)
        if is_inference:
            self.model = torch.nn.DataParallel(self.model)
"""


def test_a_subclass_that_passes_its_base_a_constant_the_wrap_tests_never_holds_that_wrap(tmp_path):
    write(tmp_path, "pyproject.toml", "[project]\nname = 'grit'\n")
    write(tmp_path, "grit/__init__.py", "")
    write(tmp_path, "grit/encoder.py", GRIT_BASE)
    train = (
        "from grit.encoder import Encoder\n\n\nclass TrainEncoder(Encoder):\n    def __init__(\n        self,\n        **kwargs,\n    ):\n"
        "        super().__init__(**kwargs, is_inference=FLAG)\n\n    def setup(self):\n        self.model.gradient_checkpointing_enable()\n\n\n"
        "model = TrainEncoder(name='m')\nmodel.model.resize_token_embeddings(10)\n"
    )
    write(tmp_path, "train.py", train.replace("FLAG", "False"))
    assert codes(dplint("--no-cache", "--select", "DPL302", "train.py", cwd=tmp_path)) == []
    write(tmp_path, "train.py", train.replace("FLAG", "True"))
    assert codes(dplint("--no-cache", "--select", "DPL302", "train.py", cwd=tmp_path)) == ["train.py:12:9 DPL302", "train.py:16:1 DPL302"]


ENGINE = (
    "import torch\n\n\ndef train(model, loader, path='m.pt'):\n    for batch in loader:\n        model(batch)\n"
    "    torch.save(model.state_dict(), path)\n"
)


def wrapper_passed(tmp_path, engine=ENGINE, **files):
    write(tmp_path, "pyproject.toml", "[project]\nname = 'cls'\n")
    write(tmp_path, "engine.py", engine)
    write(tmp_path, "main.py", "import torch.nn as nn\nfrom engine import train\n\nmodel = nn.DataParallel(Net()).cuda()\ntrain(model, loader)\n")
    for name, text in files.items():
        write(tmp_path, f"{name}.py", text)
    return dplint("--no-cache", "--select", "DPL303,DPL312", ".", cwd=tmp_path)


def test_a_wrapper_every_call_passes_to_a_function_of_another_file_is_followed(tmp_path):
    assert codes(wrapper_passed(tmp_path)) == ["engine.py:7:16 DPL312"]
    result = wrapper_passed(
        tmp_path,
        finetune="import torch.nn as nn\nimport engine\n\n\ndef run(args):\n    net = Net()\n    if args.ngpu > 1:\n"
        "        net = nn.DataParallel(net)\n    engine.train(loader=data, model=net)\n",
    )
    assert codes(result) == ["engine.py:7:16 DPL312"], result.stdout
    assert "may save `module.` keys (DataParallel on " in result.stdout


@pytest.mark.parametrize(
    "other",
    [
        "from engine import train\n\ntrain(Net(), loader)\n",  # a plain model, in a file that wraps nothing
        "from engine import train\n",  # imported, its use unread
        "import torch.nn as nn\nfrom engine import train\n\nnn.DataParallel(Net())\ntrain(build(), loader)\n",  # unknown
        "import torch.nn as nn\nimport torch.multiprocessing as mp\nfrom engine import train\n\n"
        "mp.spawn(train, args=(nn.DataParallel(Net()),))\n",  # handed on, called elsewhere
        "import torch.nn as nn\nfrom engine import *\n\nnn.DataParallel(Net())\n",
        "import torch.nn as nn\nfrom engine import train\n\nmodel = Net()\nif multi:\n    model = nn.DataParallel(model)\n"
        "else:\n    train(model, loader)\n",  # the other branch of the wrap's own test
    ],
)
def test_a_function_that_may_receive_a_plain_model_is_not_followed(tmp_path, other):
    assert codes(wrapper_passed(tmp_path, other=other)) == []


def test_a_function_its_own_file_calls_with_a_plain_model_is_not_followed(tmp_path):
    result = wrapper_passed(tmp_path, engine=ENGINE + "\n\nif __name__ == '__main__':\n    train(Net(), [])\n")
    assert codes(result) == [], result.stdout


def test_a_function_a_package_re_exports_is_not_followed(tmp_path):
    # `cls/__init__.py` wraps too (it is read), but hands `train` on to importers of `cls` it cannot see.
    write(tmp_path, "cls/__init__.py", "import torch.nn as nn\nfrom .engine import train\n\nshared = nn.DataParallel(Net())\n")
    write(tmp_path, "cls/engine.py", ENGINE)
    write(tmp_path, "cls/main.py", "import torch.nn as nn\nfrom .engine import train\n\ntrain(nn.DataParallel(Net()), loader)\n")
    write(tmp_path, "pyproject.toml", "[project]\nname = 'cls'\n")
    assert codes(dplint("--no-cache", "--select", "DPL303,DPL312", ".", cwd=tmp_path)) == []
    write(tmp_path, "cls/__init__.py", "")
    assert codes(dplint("--no-cache", "--select", "DPL303,DPL312", ".", cwd=tmp_path)) == ["cls/engine.py:7:16 DPL312"]


ACCELERATE_TRAIN = """import torch
from accelerate import Accelerator{plugin_import}


def main():
    accelerator = Accelerator({plugin})
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    if accelerator.is_main_process:
        accelerator.save({saved}, "model.pt")


if __name__ == "__main__":
    main()
"""
ACCELERATE_DEMO = """import torch

model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
model.load_state_dict(torch.load("model.pt", map_location="cpu"))
"""


@pytest.mark.parametrize(
    "plugin_import, plugin, saved, expected",
    [
        ("", "", "model.state_dict()", ["train.py:11:26 DPL303"]),  # a DDP wrapper's keys, loaded into a bare model
        ("", "", "accelerator.get_state_dict(model)", []),
        ("", "", "accelerator.unwrap_model(model).state_dict()", []),
        ("\nfrom accelerate.utils import DeepSpeedPlugin", "deepspeed_plugin=DeepSpeedPlugin(zero_stage=2)", "model.state_dict()", []),
    ],
)
def test_a_prepared_model_s_state_dict_breaks_a_bare_model_s_load(tmp_path, plugin_import, plugin, saved, expected):
    write(tmp_path, "pyproject.toml", "[project]\nname = 'acc'\n")
    write(tmp_path, "train.py", ACCELERATE_TRAIN.format(plugin_import=plugin_import, plugin=plugin, saved=saved))
    write(tmp_path, "demo.py", ACCELERATE_DEMO)
    result = dplint("--no-cache", "--preview", "--select", "DPL303,DPL312", ".", cwd=tmp_path)
    assert codes(result) == expected, result.stdout


HELPER = (
    "import torch\n\n\n"
    "def pretty_print(v):\n"
    "    print(v.max().data[0], v.min().data[0])\n\n\n"
    "def average(values):\n"
    "    return sum(values) / len(values)\n"
)


@pytest.mark.parametrize(
    "train, expected",
    [
        # The script imports the module but never the helper: code nothing runs cannot raise.
        ("import torch\nimport utils\n\nprint(utils.average(torch.ones(2)))\n", []),
        # Called by the script, or named where another file may call it: the IndexError is real.
        ("import torch\nimport utils\n\nutils.pretty_print(x)\n", ["utils.py:5:11 DPL401", "utils.py:5:28 DPL401"]),
        ("import torch\nfrom utils import pretty_print\n\nhooks = [pretty_print]\n", ["utils.py:5:11 DPL401", "utils.py:5:28 DPL401"]),
        ("import torch\nfrom utils import *\n\nprint(average(torch.ones(2)))\n", ["utils.py:5:11 DPL401", "utils.py:5:28 DPL401"]),
    ],
)
def test_a_loss_index_in_a_helper_nothing_uses_is_left_alone(tmp_path, train, expected):
    write(tmp_path, "utils.py", HELPER)
    write(tmp_path, "train.py", train)
    assert codes(dplint("--select", "DPL401", ".", cwd=tmp_path)) == expected


def test_a_loss_index_in_a_module_nothing_in_the_project_imports_is_reported(tmp_path):
    # A library's surface: its callers are outside the project.
    write(tmp_path, "utils.py", HELPER)
    assert codes(dplint("--select", "DPL401", ".", cwd=tmp_path)) == ["utils.py:5:11 DPL401", "utils.py:5:28 DPL401"]


SCALAR_LOSS_MODEL = (
    "import torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
    "class Classifier(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.net = nn.Linear(4, 2)\n\n"
    "    def forward(self, x, y):\n"
    "        logits = self.net(x)\n"
    "        loss = F.cross_entropy(logits, y)\n"
    "        return loss, logits\n"
)
RUN = (
    "import torch\nimport torch.nn as nn\nfrom model import Classifier\n\n"
    "model = nn.DataParallel(Classifier().cuda())\n"
    "for x, y in loader:\n"
    "    loss, logits = model(x, y)\n"
    "{reduce}"
    "    loss.backward()\n"
)


@pytest.mark.parametrize(
    "reduce, expected",
    [
        ("", ["model.py:13:9 DPL305"]),
        # The caller averages the per-GPU values: only a short last batch's weighting is left.
        ("    if torch.cuda.device_count() > 1:\n        loss = loss.mean()\n", []),
        # A mean taken of something else does not reduce the gathered loss.
        ("    accuracy = (logits.argmax(1) == y).float().mean()\n", ["model.py:13:9 DPL305"]),
    ],
)
def test_a_scalar_loss_from_forward_is_left_alone_where_the_wrapping_file_reduces_it(tmp_path, reduce, expected):
    write(tmp_path, "model.py", SCALAR_LOSS_MODEL)
    write(tmp_path, "run.py", RUN.format(reduce=reduce))
    assert codes(dplint("--select", "DPL305", ".", cwd=tmp_path)) == expected


@pytest.mark.parametrize(
    "device_setup, expected",
    [
        ("import torch\n\n\ndef setup():\n    import torch_npu  # registers the npu device type\n", []),
        ("import torch\n\n\ndef setup():\n    pass\n", ["train.py:3:23 DPL102"]),
    ],
)
def test_a_device_type_registered_by_a_backend_another_file_imports_is_accepted(tmp_path, device_setup, expected):
    write(tmp_path, "device.py", device_setup)
    write(tmp_path, "train.py", "import torch\nimport device\ndevice = torch.device(f\"npu:{rank}\")\n")
    assert codes(dplint("--select", "DPL102", ".", cwd=tmp_path)) == expected


def test_a_wrapper_moved_to_the_gpu_is_still_the_wrapper_its_checkpoint_loads_into(tmp_path):
    # YOLOv3_PyTorch: `net = nn.DataParallel(net)`, `net = net.cuda()`, then `net.load_state_dict(...)`.
    train = (
        "import torch\nimport torch.nn as nn\nfrom model import Net\n\n\n"
        "def main():\n"
        "    net = nn.DataParallel(Net())\n"
        "    torch.save(net.state_dict(), 'ckpt.pt')\n"
        "    net = {move}\n"
        "    net.load_state_dict(torch.load('ckpt.pt'))\n"
    )
    write(tmp_path, "model.py", "import torch.nn as nn\n\n\nclass Net(nn.Module):\n    pass\n")
    write(tmp_path, "train.py", train.format(move="net.cuda()"))
    assert codes(dplint("--preview", "--select", "DPL303", ".", cwd=tmp_path)) == []
    # Unwrapped on the way to the GPU, the load does break on the wrapper's keys.
    write(tmp_path, "train.py", train.format(move="net.module.cuda()"))
    assert codes(dplint("--preview", "--select", "DPL303", ".", cwd=tmp_path)) == ["train.py:8:16 DPL303"]
