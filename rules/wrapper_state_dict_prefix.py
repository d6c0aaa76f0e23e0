from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import libcst as cst

from dplint.analysis.facts import CheckpointLoad, ProjectFacts
from dplint.analysis.names import Body, block_body, child_blocks, child_nodes, dotted, iter_calls, names_in, run_visitor, signed_integer_value
from dplint.analysis.wrapping import Point, WrapFlow, WrapSite, describe, handled_names, holder, may_prepare_models, scopes, unwrapped
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.finding import FileReference
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid

PREFIX = "module."
# A string naming the prefix to strip, spelt right or not (`"modules."` never matches a key).
_PREFIX_LIKE = frozenset({"module.", "modules.", "module"})
# Prefix strings common enough elsewhere that only a state dict's context makes them the prefix.
_WEAK_PREFIXES = frozenset({"module"})
# The prefix stripped by hand: its string, or a slice of its length (`k[7:]`, a literal opens the regex: fast).
_PREFIX_STRING = GuardedPattern(
    r"""["']modules?\.["']|(?:replace|startswith|split|removeprefix|lstrip|len)\([ \t]*["']modules?["']""",
    [f"{prefix}{quote}" for prefix in ("module.", "modules.", "module", "modules") for quote in "\"'"],
    one_line=True,
)
_SLICE_OF_SEVEN = re.compile(r"\[\s*7\s*:\s*\]")
# `".".join(k.split(".")[1:])`: the first part of a dotted key dropped, whatever it is.
_FIRST_PART_DROPPED = GuardedPattern(r"""split\(\s*["']\.["']\s*\)\s*\[\s*1\s*:\s*\]""", ["split("])
# Only a loaded checkpoint's keys make that the prefix: dotted module paths are cut the same way, and so
# are a model's own keys when they are matched to a converted checkpoint's (pytorch-openpose's `transfer`).
_STATE_DICT_KEYS = re.compile(r"ckpt|checkpoint|torch\.load")


def _strips_by_hand(text: str) -> bool:
    return any(pattern.search(text) is not None for pattern in (_PREFIX_STRING, _SLICE_OF_SEVEN, _FIRST_PART_DROPPED))


# A wrap written in the file: `nn.DataParallel(`, `DistributedDataParallel(`, `DDP(`.
_WRAP_CALL = GuardedPattern(r"DataParallel\s*\(|\bDDP\s*\(", ["DataParallel", "DDP"])
# The context of a bare `k[7:]` that makes it the prefix's length: the keys of a state dict.
_STATE_DICT_CONTEXT = re.compile(r"state|ckpt|checkpoint|weights|params|\.items\(\)|\.keys\(\)")


class WrapperStateDictPrefix(Rule):
    """
    ## What it does
    Checks for `state_dict()` of a `DataParallel` or `DistributedDataParallel` wrapper passed to
    `torch.save` or a save helper (`save_checkpoint(...)`), directly, inside a dict, or through a
    variable. A wrap on some path counts (`if torch.cuda.device_count() > 1:`, `if args.multi_gpu:`),
    as do wraps with `.cuda()`/`.to(device)` chained on them and `self.model = DataParallel(...)`
    made in another method or a base trainer, a project function that returns a wrapper
    (`model = build_model(args)`, also from another file), an object whose class wraps `self.model` in
    `__init__` (`trainer.model.state_dict()`), an element of a list of wrappers, and a parameter of a
    top-level function to which every call in the project passes a wrapper (`train(model, loader)` in
    `engine.py`, called as `train(nn.DataParallel(net), loader)` from `main.py`), and a module-level
    wrapper that a top-level function reads, where the module's own statements are its only callers, and a
    module that `accelerator.prepare` hands back, a DDP wrapper in a run of several processes (as DPL302
    follows it: `accelerator.save(model.state_dict(), path)`). Also checks for
    the `module.` prefix stripped by hand: `k[7:]`, `k[len("module."):]`, `k.replace("module.", "")`
    (or `str.replace(k, "module.", "")`), `k.split("module.", 1)[-1]`, `k.lstrip("module.")`,
    `".".join(k.split(".")[1:])` over a checkpoint's keys, in loops or dict comprehensions, and
    misspelt prefixes (`"modules."`), also in the guard of a slice (`if k.startswith("modules."):`).
    A slice under a `k.startswith("module.")` guard (or `"module.student." in k`) strips correctly and
    is not reported, nor is one under a test of another prefix (`if k.startswith("visual."): k[7:]`).
    At runtime (`pytest --dplint`), `load_state_dict` whose keys differ from the model's only by the
    `module.` prefix is reported, also under `strict=False`, and so is a checkpoint whose keys all
    carry the prefix loaded into a model whose keys do not, even when they differ in more (a
    different head).

    ## Why is this bad?
    A wrapper's `state_dict()` keys all start with `module.`: the checkpoint does not load into the
    plain model (`strict=True` raises "Missing key(s)"; `strict=False` silently loads nothing). When
    the wrap happens only on multi-GPU machines, the checkpoints of the two setups differ. Stripping
    by hand goes wrong in quiet ways: `replace` also rewrites keys that merely contain `module.`
    (`backbone.submodule.weight` → `backbone.subweight`), `split` cuts at a `module.` further in,
    `lstrip` strips characters rather than a prefix (`module.mlp.w` → `p.w`), `k[7:]` cuts every key
    whether it has the prefix or not, and a misspelt prefix never matches. FSDP's `state_dict()`
    keys carry no prefix (checked on torch 2.13), so FSDP is not reported.

    ## Example
    ```python
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    torch.save(model.state_dict(), "ckpt.pt")
    state = {k[7:]: v for k, v in torch.load("ckpt.pt").items()}
    ```

    ## Use instead
    ```python
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    torch.save(getattr(model, "module", model).state_dict(), "ckpt.pt")
    state = torch.load("ckpt.pt")
    consume_prefix_in_state_dict_if_present(state, "module.")
    ```

    ## Fix safety
    The fix saves `getattr(model, "module", model).state_dict()`, the plain model's keys whether the
    model is wrapped or not; it is offered where the model is a name (`model`, `self.net`). It is unsafe:
    code that loads these checkpoints into the wrapper (`model.load_state_dict(...)` after the wrap)
    must then load them into `getattr(model, "module", model)` too, and checkpoints saved before the fix
    keep their prefix.

    ## Known problems
    A wrapper passed in as an argument is followed only when every use of the function in the project
    is a call that passes one, and no file that wraps nothing imports the function's module (its calls
    are not read); an import made inside a function is not seen. A wrapper returned by a method or
    inside a tuple is not followed. A save whose branch tells the cases apart (`hasattr(m, "module")`,
    `isinstance(m, ...)`, a branch reaching `m.module`, the other branch of the wrap's own condition)
    is taken as handled. A function that returns a wrapper only under a test of its own parameters
    (`create_model(opt)` wrapping `if opt.isTrain:`) leaves the wrap to each caller's argument, which
    is not evaluated: its calls are not taken to hold a wrapper.
    """

    code = "DPL303"
    preview = True
    preview_reason = (
        "Measured 0.62 on the 904 repositories of bench/wild (99 true, 60 false, 119 moot): a save is linked to a loader by the model's class, not by the "
        "checkpoint's path, so a loader of another program's checkpoint is taken for this one's."
    )
    name = "wrapper-state-dict-prefix"
    summary = "A state_dict saved from a DataParallel/DDP wrapper carries `module.` prefixes plain models cannot load."
    fix_applicability = ("unsafe",)

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        """The prefix stripped by hand, a `state_dict` saved in a file that wraps a model, or a class
        inheriting a base trainer's `self.<attr>` wrap."""
        if _strips_by_hand(text):
            return True
        if "state_dict" not in text or "save" not in text:
            return False
        return (
            _WRAP_CALL.search(text) is not None
            or may_prepare_models(text)
            or any(project.attribute_wraps.get(name) for name in module_classes)
            or any(f"{name}(" in text for name in project.wrap_makers)
            or any(f"def {name}(" in text for name in project.wrapper_receivers)
        )

    VALID = [
        Valid(
            """
            import torch
            import torch.nn as nn
            model = nn.DataParallel(Net())
            torch.save(model.module.state_dict(), "ckpt.pt")
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn
            model = Net()
            torch.save(model.state_dict(), "before.pt")  # before the wrap
            if args.ngpu > 1:
                model = nn.DataParallel(model)
            state = model.module.state_dict() if hasattr(model, "module") else model.state_dict()
            torch.save(state, "after.pt")
            torch.save(model.state_dict() if args.ngpu == 1 else model.module.state_dict(), "ckpt.pt")
            """
        ),
        Valid(
            """
            import torch
            from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
            state = torch.load("ckpt.pt")
            consume_prefix_in_state_dict_if_present(state, "module.")
            name = title.replace("Module.", "")  # not the prefix
            tail = line[7:]  # not a state dict's key
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn
            if args.distributed:
                model = nn.parallel.DistributedDataParallel(model)
            if args.distributed:
                torch.save(model.module.state_dict(), "ckpt.pt")
            else:
                torch.save(model.state_dict(), "ckpt.pt")
            best = copy.deepcopy(model.state_dict())  # kept in memory, loaded back into the wrapper
            model.load_state_dict(best)
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn

            def build(args):
                model = nn.DataParallel(Net())
                return model.module if args.export else model

            model = build(args)  # the function tells the cases apart: unknown, so silent
            torch.save(model.state_dict(), "m.pt")
            package = ".".join(name.split(".")[1:])  # a dotted module path, no checkpoint
            """
        ),
        Valid(
            """
            import torch
            state = torch.load("ckpt.pt")["state_dict"]
            clean = {(k[7:] if k.startswith("module.") else k): v for k, v in state.items()}
            """
        ),
        Valid(
            """
            import torch

            def visual_weights(path):
                state = torch.load(path, map_location="cpu")
                for k in list(state.keys()):
                    if k.startswith("visual."):
                        state[k[7:]] = state.pop(k)  # drops `visual.`, a prefix of the checkpoint's own
                return state

            def student_backbone(path):
                weight = {}
                for key, value in torch.load(path)["state_dict"].items():
                    if "module.student.backbone." in key:
                        key = key.replace("module.student.backbone.", "module.")
                        weight[key[7:]] = value
                return weight
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn

            def train(net):
                model = nn.DataParallel(net).cuda()
                torch.save(model.state_dict(), "ckpt.pt")  # every loader of the project wraps first

            def test():
                model = nn.DataParallel(Net()).cuda()
                model.load_state_dict(torch.load("ckpt.pt"))

            def demo():
                model = Net()
                state = torch.load("ckpt.pt")
                model.load_state_dict({k.replace("module.", ""): v for k, v in state.items()})
            """
        ),
        Valid(
            """
            import torch
            state = torch.load(args.weights)
            new_state = {}
            for k, v in state.items():
                head = k[:7]
                if head == "module.":
                    k = k[7:]  # a guard held in a variable
                new_state[k] = v

            def load_backbone(net):
                state = torch.load("mobilenetV1X0.25_pretrain.tar")["state_dict"]
                net.load_state_dict({k[7:]: v for k, v in state.items()})  # a released checkpoint, saved from a wrapper
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn
            model = Net()
            model_1gpu = model
            if multi_gpu:
                model = nn.DataParallel(model)
            torch.save(model_1gpu.state_dict() if multi_gpu else model.state_dict(), "ckpt.pt")
            torch.save(getattr(model, "module", model).state_dict(), "last.pt")
            crnn = nn.DataParallel(Net(), output_dim=1)  # raises TypeError: no wrapper is ever made
            torch.save(crnn.state_dict(), "crnn.pt")
            demo = Net()
            demo.load_state_dict(torch.load("ckpt.pt"))
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn

            def train(model):
                if torch.cuda.device_count() > 1:
                    model = nn.DataParallel(model).cuda()
                torch.save({"model": model.state_dict(), "epoch": 3}, "ckpt.pt")

            def demo(path):
                model = Net()
                model.load_state_dict(torch.load(path)["model"])  # fails on a multi-GPU checkpoint
            """,
            line=7,
            expected_fix="""
            import torch
            import torch.nn as nn

            def train(model):
                if torch.cuda.device_count() > 1:
                    model = nn.DataParallel(model).cuda()
                torch.save({"model": getattr(model, "module", model).state_dict(), "epoch": 3}, "ckpt.pt")

            def demo(path):
                model = Net()
                model.load_state_dict(torch.load(path)["model"])  # fails on a multi-GPU checkpoint
            """,
        ),
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(Net().cuda(rank), device_ids=[rank])
            checkpoint = {"epoch": epoch}
            checkpoint["model"] = model.state_dict()
            torch.save(checkpoint, f"rank{rank}.pt")
            export = Net()
            export.load_state_dict(torch.load("rank0.pt")["model"])
            """,
            line=5,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Head(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.submodule = nn.Linear(8, 8)  # its keys are `submodule.weight`, `submodule.bias`

            state = torch.load(args.weights, map_location="cpu")
            state = {k.replace("module.", ""): v for k, v in state.items()}
            """,
            line=10,
        ),
        Invalid(
            """
            import torch
            from collections import OrderedDict
            state = torch.load(args.pretrained)["state_dict"]
            clean = OrderedDict((k[7:], v) for k, v in state.items())
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Trainer:
                def __init__(self, args):
                    self.net = Net().cuda()
                    if args.multi_gpu:
                        self.net = nn.DataParallel(self.net)

                def save(self, path):
                    save_checkpoint({"state_dict": self.net.state_dict()}, path)

                def load(self, path):
                    self.net.load_state_dict(torch.load(path)["state_dict"])  # the flag of this run, not of the save
            """,
            line=11,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            net = Net().to(device)
            if device == "cuda":
                net = nn.DataParallel(net)

            def test(epoch):
                torch.save({"net": net.state_dict(), "epoch": epoch}, "ckpt.pth")

            for epoch in range(200):
                test(epoch)

            cpu_net = Net()
            cpu_net.load_state_dict(torch.load("ckpt.pth", map_location="cpu")["net"])
            """,
            line=9,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            def train(model, loader, path):
                torch.save(model.state_dict(), path)

            def evaluate(path):
                model = Net()
                model.load_state_dict(torch.load(path))
                return model

            train(nn.DataParallel(Net()).cuda(), loader, "ckpt.pt")
            """,
            line=5,
        ),
        Invalid(
            """
            import torch
            checkpoint = torch.load(args.resume, map_location="cpu")
            state = {".".join(k.split(".")[1:]): v for k, v in checkpoint["state_dict"].items()}
            """,
            line=3,
        ),
        Invalid(
            """
            import torch
            state = torch.load("ckpt.pt")["state_dict"]
            for k in list(state):
                if k.startswith("modules."):
                    state[k[7:]] = state.pop(k)
            """,
            line=5,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for save in wrapper_saves(ctx):
            if save.breaking is not None:
                yield save.report(ctx, breaking=True)
        if _strips_by_hand(ctx.source):
            yield from _hand_stripping(ctx, ctx.module.body, "")


@dataclass(frozen=True)
class _Save:
    """`x.state_dict()` of a wrapper, saved; `breaking`: a load of the project that reads such a
    checkpoint into the bare model and copes with no `module.` prefix (None: none in view)."""

    call: cst.Call
    owner: str
    sites: FrozenSet[WrapSite]
    statement: cst.CSTNode
    breaking: Optional[Tuple[str, CheckpointLoad]]

    def report(self, ctx: FileContext, breaking: bool) -> Report:
        wrapper, where, unconditional = describe(self.sites, ctx)
        saves = "saves" if unconditional else "may save"
        shown = ctx.short_code(self.call.func.value, 30) if self.owner.endswith("[]") else self.owner
        plain = unwrapped(self.sites, shown)
        help = (
            f"Save `{plain}.state_dict()`, the plain model's keys, and load such checkpoints into `{plain}`: "
            "without the prefix they no longer load into the wrapper."
        )
        fix = None
        receiver = dotted(self.call.func.value)  # a name, which the fix reads twice: no call, no subscript
        if receiver is not None:
            bare = f'getattr({receiver}, "module", {receiver})'
            fix = FixSpec(f"Save `{bare}.state_dict()`", (NodeEdit(self.call.func.value, bare),), "unsafe")
        if self.breaking is None:
            message = f"`{shown}.state_dict()` {saves} `module.` keys ({wrapper} on {where})."
            return Report(node=self.call, message=message, help=help, statement=self.statement, fix=fix)
        filename, load = self.breaking
        reference = FileReference.to(filename, load.path, load.line)
        model = f"a bare `{load.model}`" if load.model[:1].isupper() else f"the bare model of `{load.model}()`" if load.model else "the bare model"
        first = min(self.sites, key=lambda site: (site.path, site.line_in(ctx)))
        place = f"{first.path}:{first.line}" if first.path else f"line {first.line_in(ctx)}"
        return Report(
            node=self.call,
            message=f"`{shown}.state_dict()` {saves} `{PREFIX}` keys ({wrapper}, {place}), which {reference.text} loads into {model}.",
            help=help,
            statement=self.statement,
            fix=fix,
            references=(reference,),
        )


def wrapper_saves(ctx: FileContext) -> List[_Save]:
    """The file's saves of a wrapper's state dict (DPL303 reports those a load of the project breaks on,
    DPL312 the others)."""
    return ctx.memo("wrapper-saves", lambda: list(_wrapper_saves(ctx)))


def _wrapper_saves(ctx: FileContext) -> Iterator[_Save]:
    makers = (f"{name}(" for name in ctx.project.wrap_makers | ctx.project.wrapper_receivers)
    wraps_here = any(wrap_text in ctx.source for wrap_text in ("DataParallel", "DDP", "self.")) or may_prepare_models(ctx.source)
    if not (wraps_here or any(m in ctx.source for m in makers)):
        return
    for points in scopes(ctx):
        for call, owner, sites, statement in _saves(ctx, points):
            yield _Save(call, owner, sites, statement, _breaking_load(ctx, sites))


def _saves(ctx: FileContext, points: Iterable[Point]) -> Iterator[Tuple[cst.Call, str, FrozenSet[WrapSite], cst.CSTNode]]:
    # Variables holding a wrapper's state_dict (`state = {"model": model.state_dict()}`), until saved.
    held: Dict[str, List[Tuple[cst.Call, str, FrozenSet[WrapSite], cst.CSTNode]]] = {}
    for point in points:
        small = point.statement
        wrapped = {name: sites for name, sites in point.wrapped.items() if name not in point.handled}
        if not wrapped and not held:
            continue  # nothing here can save a wrapper's keys
        for save in _save_calls(ctx, small):
            for arg in save.args:
                for call, owner in _state_dict_calls(ctx, arg.value, wrapped):
                    yield call, owner, wrapped[owner], small
                for name in names_in(arg.value):
                    yield from held.pop(name, ())
        target = _assigned_name(small)
        if target is not None and not _save_calls(ctx, small):
            found = [(call, owner, wrapped[owner], small) for call, owner in _state_dict_calls(ctx, small.value, wrapped)]
            if found:
                held.setdefault(target, []).extend(found)
            elif isinstance(small, cst.Assign) and all(isinstance(t.target, cst.Name) for t in small.targets):
                held.pop(target, None)  # rebound to something else


def _breaking_load(ctx: FileContext, sites: FrozenSet[WrapSite]) -> Optional[Tuple[str, CheckpointLoad]]:
    """A load of the project that would read this save's keys into the bare model, strictly, with
    nothing that copes with the prefix: one into the same class, or, where the class is unknown on
    either side, one in the same folder; those of the same file first."""
    built = {_wrapped_class(ctx, site) for site in sites}
    execution = ctx.project.execution
    models = frozenset().union(*(execution.models_built_by(name) for name in built if name))
    folder = os.path.dirname(ctx.filename)
    helpers = ctx.project.prefix_helpers
    candidates = []
    for filename, load in ctx.project.checkpoint_loads:
        if load.into_wrapper or load.handles_prefix or not helpers.isdisjoint(load.through):
            continue
        if load.model and "" not in built:
            related = not models.isdisjoint(execution.models_built_by(load.model))
        else:
            related = os.path.dirname(filename) == folder
        if related:
            candidates.append((filename, load))
    return min(candidates, key=lambda found: (found[0] != ctx.filename, found[0], found[1].line), default=None)


def _wrapped_class(ctx: FileContext, site: WrapSite) -> str:
    """The class of the model a wrap of this file wraps, as the project facts read it ("" unknown)."""
    facts = ctx.project.files.get(ctx.filename)
    if site.path or facts is None:
        return ""
    line = site.line_in(ctx)
    return next((wrap.class_name for wrap in facts.wraps if wrap.line == line), "")


class WrapperStateDictSaved(Rule):
    """
    ## What it does
    Advice, off by default: a `DataParallel` or `DistributedDataParallel` wrapper's `state_dict()`
    saved (as DPL303 finds it), where no load of the project reads such a checkpoint into the bare
    model. DPL303 reports the saves that a load in view breaks on; this one, the rest.

    ## Why is this bad?
    The checkpoint's keys all start with `module.`. Every loader of this project copes (it wraps the
    model first, or strips the prefix), but a plain model elsewhere (a demo, an export, another
    project) cannot load the file as it is.

    ## Example
    ```python
    model = nn.DataParallel(Net())
    torch.save(model.state_dict(), "ckpt.pt")
    ```

    ## Use instead
    ```python
    model = nn.DataParallel(Net())
    torch.save(model.module.state_dict(), "ckpt.pt")
    ```

    ## Known problems
    As DPL303's: which loads read which checkpoint is judged by the model's class, or by the folder.
    """

    code = "DPL312"
    name = "wrapper-state-dict-saved"
    fix_applicability = ("unsafe",)
    summary = "A wrapper's state_dict saved with `module.` keys (advice: every loader in view copes)."
    severity = "warning"
    enabled_by_default = False

    VALID = [
        Valid(
            """
            import torch
            import torch.nn as nn
            model = nn.DataParallel(Net())
            torch.save(model.module.state_dict(), "ckpt.pt")
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn
            if torch.cuda.device_count() > 1:
                model = nn.DataParallel(model)
            torch.save(getattr(model, "module", model).state_dict(), "ckpt.pt")
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn
            model = nn.DataParallel(Net())
            torch.save(model.state_dict(), "ckpt.pt")
            demo = Net()
            demo.load_state_dict(torch.load("ckpt.pt"))  # a load that breaks: DPL303 reports the save
            """
        ),
        Valid(
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, optimizer = accelerator.prepare(torch.nn.Linear(8, 1), optimizer)
            accelerator.save(accelerator.get_state_dict(model), "model.pt")
            accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
            accelerator.save(optimizer.state_dict(), "optimizer.pt")  # no module
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            import torch.nn as nn
            model = nn.DataParallel(Net())
            torch.save(model.state_dict(), "ckpt.pt")
            """,
            line=4,
            expected_fix="""
            import torch
            import torch.nn as nn
            model = nn.DataParallel(Net())
            torch.save(getattr(model, "module", model).state_dict(), "ckpt.pt")
            """,
        ),
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(Net().cuda(rank), device_ids=[rank])
            torch.save({"model": model.state_dict()}, "last.pt")
            model.load_state_dict(torch.load("last.pt")["model"])  # resumed into the same wrapper
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            def train(model, args):
                if args.multi_gpu:
                    model = nn.DataParallel(model)
                torch.save(model.state_dict(), args.out)
            """,
            line=7,
        ),
        Invalid(
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, optimizer = accelerator.prepare(torch.nn.Linear(8, 1), optimizer)
            accelerator.save(model.state_dict(), "model.pt")  # `module.` keys under `accelerate launch`
            """,
            line=5,
        ),
    ]

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        return "state_dict" in text and "save" in text and WrapperStateDictPrefix().applies_to(text, module_classes, project)

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for save in wrapper_saves(ctx):
            if save.breaking is None:
                yield save.report(ctx, breaking=False)


def _save_calls(ctx: FileContext, small: cst.CSTNode) -> List[cst.Call]:
    """`torch.save(...)` and calls of save helpers (`save_checkpoint(...)`, `utils.save_model(...)`)."""
    calls = []
    for call in iter_calls(small):
        name = dotted(call.func)
        if name is None:
            continue
        last = name.rpartition(".")[2]
        if ctx.qualify(call.func) == "torch.save" or ("save" in last.lower() and last != "save_pretrained"):
            calls.append(call)
    return calls


class _StateDictCollector(cst.CSTVisitor):
    """`x.state_dict()` where `x` may be a wrapper, not inside `m.module if ... else m`, nor in the
    branch of a conditional expression whose condition excludes every wrap of `x`
    (`model.module.state_dict() if multi_gpu else model.state_dict()`)."""

    def __init__(self, ctx: FileContext, wrapped: Mapping[str, FrozenSet[WrapSite]]) -> None:
        self.ctx = ctx
        self.wrapped = wrapped
        self.skipped: List[Set[str]] = []
        self.found: List[Tuple[cst.Call, str]] = []
        self.branches: Dict[int, Tuple[Tuple[str, bool], ...]] = {}  # id of a branch's node → the conditions there

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self.skipped.append(handled_names(node))
        outer = self.branches.get(id(node), ())
        test, holds = WrapFlow(self.ctx)._condition(node.test)
        self.branches[id(node.body)] = (*outer, (test, holds))
        self.branches[id(node.orelse)] = (*outer, (test, not holds))

    def leave_IfExp(self, original_node: cst.IfExp) -> None:
        self.skipped.pop()

    def on_visit(self, node: cst.CSTNode) -> bool:
        conditions = self.branches.get(id(node))
        if conditions is not None:
            for child in child_nodes(node):
                self.branches.setdefault(id(child), conditions)
        return super().on_visit(node)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "state_dict":
            owner = holder(func.value)
            if owner is None or owner not in self.wrapped or any(owner in names for names in self.skipped):
                return
            conditions = self.branches.get(id(node), ())
            if any(site.possible_under(conditions) for site in self.wrapped[owner]):
                self.found.append((node, owner))


def _state_dict_calls(ctx: FileContext, node: Optional[cst.CSTNode], wrapped: Mapping[str, FrozenSet[WrapSite]]) -> List[Tuple[cst.Call, str]]:
    if node is None or not wrapped:
        return []
    collector = _StateDictCollector(ctx, wrapped)
    run_visitor(node, collector)
    return collector.found


def _assigned_name(small: cst.BaseSmallStatement) -> Optional[str]:
    """The variable an assignment stores into: `state = ...`, `ckpt["model"] = ...`, `ckpt.update(...)` no."""
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target = small.targets[0].target
    elif isinstance(small, (cst.AnnAssign, cst.AugAssign)) and small.value is not None:
        target = small.target
    else:
        return None
    while isinstance(target, cst.Subscript):
        target = target.value
    return target.value if isinstance(target, cst.Name) else None


def _hand_stripping(
    ctx: FileContext, body: Body, context: str, function: Optional[str] = None, top: Optional[cst.CSTNode] = None
) -> Iterator[Report]:
    """Stripping expressions in the statements of a body; `context` is the text of the enclosing
    `if` tests and loop headers (a `k.startswith("module.")` guard, a `for k, v in state.items()`),
    `function` the text of the function they are in (None: the module's top level, where `top` is the
    top-level statement they are in)."""
    for statement in body:
        if function is None and body is ctx.module.body:
            top = statement
        if isinstance(statement, (cst.SimpleStatementLine, cst.BaseSmallStatement)):
            for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else (statement,):
                if not _strips_by_hand(ctx.code(small)):
                    continue
                # A function's own text tells whether it tests the prefix, and what it loads; at the top
                # level, the statement around it does the first, the whole file the second.
                scope = function if function is not None else ctx.code(top) if top is not None else ctx.code(small)
                for node, problem in _strippings(ctx, small, context, scope, function if function is not None else ctx.source):
                    yield Report(node=node, message=problem, help=_STRIP_HELP, statement=small)
        elif isinstance(statement, cst.If):
            # Each branch of an `if`/`elif` chain is guarded by its own test (an `else` by none of them).
            branch: Optional[cst.CSTNode] = statement
            while isinstance(branch, cst.If):
                yield from _hand_stripping(ctx, block_body(branch.body), f"{context} {ctx.code(branch.test)}", function, top)
                branch = branch.orelse
            if isinstance(branch, cst.Else):
                yield from _hand_stripping(ctx, block_body(branch.body), context, function, top)
        elif isinstance(statement, cst.BaseCompoundStatement):
            header = ""
            if isinstance(statement, cst.While):
                header = ctx.code(statement.test)
            elif isinstance(statement, cst.For):
                header = ctx.code(statement.iter)
            inner = "" if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) else f"{context} {header}"
            within = function
            if isinstance(statement, cst.FunctionDef):
                if not _strips_by_hand(ctx.code(statement)):
                    continue
                within = ctx.code(statement)
            for block in child_blocks(statement):
                yield from _hand_stripping(ctx, block, inner, within, top)


_STRIP_HELP = 'Use `consume_prefix_in_state_dict_if_present(state_dict, "module.")` from `torch.nn.modules.utils`.'


# A test that the key carries the prefix: `k.startswith("module.")`, `k[:7] == "module."`.
_GUARD = re.compile(r"""(?:startswith\(\s*|\[\s*:\s*(?:7|len\([^)]*\))\s*\]\s*==\s*)["'](?P<prefix>module[^"']*)["']""")
# A test of the prefix anywhere in the function: `head = k[:7]; if head == "module.":`, `if "module" in k:`,
# `if "module.student." in k:`,
# an early return when the first key lacks it (`if not next(iter(sd)).startswith("module."): return sd`).
_TESTS_PREFIX = re.compile(r"""startswith\(\s*["']module|==\s*["']module\.?["']|["']module\.?["']\s*==|["']module(?:\.[^"']*)?["']\s+(?:not\s+)?in\b""")
# A test for a first part other than the wrapper's (`k.startswith("encoder")`).
_OTHER_PREFIX_GUARD = re.compile(r"""startswith\(\s*["'](?!module)""")
# Every checkpoint the function reads is a file named in the code (a released checkpoint, whose keys are known).
_LOADS = re.compile(r"""torch\.load\(\s*(?P<literal>[rbu]?["'])?""")
# The stripped key kept only where the model has it: `{k[7:]: v for k, v in sd.items() if k[7:] in own}`.
_CHECKED_AGAINST_KEYS = re.compile(r"""\[\s*(?:7|len\(\s*["']module\.["']\s*\))\s*:\s*\]\s+in\s""")


def _strippings(ctx: FileContext, small: cst.CSTNode, context: str, guard_text: str, loads_text: str) -> Iterator[Tuple[cst.CSTNode, str]]:
    """The problems of the strips in one statement: `guard_text` is where a prefix test covers it (its
    function), `loads_text` where the checkpoints it strips are read."""
    collector = _StrippingCollector()
    run_visitor(small, collector)
    text = f"{context} {ctx.code(small)}"
    guard = _GUARD.search(text)
    in_state_dict = guard is not None or _STATE_DICT_CONTEXT.search(text) is not None
    said: Set[Tuple[str, Optional[str]]] = set()  # one finding per statement for each problem (`{k[7:]: v ... if k[7:] in own}`)
    for node, kind, prefix in collector.found:
        if (kind, prefix) in said:
            continue
        said.add((kind, prefix))
        code = ctx.short_code(node, 40)
        if (prefix is None or prefix in _WEAK_PREFIXES) and not in_state_dict:
            continue  # `line[7:]`, `name.replace("module", "")` outside a state dict's keys
        if prefix not in ("module.", None):
            yield node, f'`{code}` does not strip the wrapper\'s prefix, which is `"module."`, not `"{prefix}"`.'
        elif kind in ("slice", "first part"):
            if _OTHER_PREFIX_GUARD.search(text) or (kind == "first part" and _STATE_DICT_KEYS.search(text) is None):
                continue  # another prefix dropped (`if k.startswith("visual."): k[7:]`), or not a state dict's keys
            if guard is not None and guard["prefix"] not in ("module.", "module"):
                yield node, f'`{code}` never runs on a wrapper\'s keys: the guard tests `"{guard["prefix"]}"`, not `"module."`.'
            elif guard is None and _CHECKED_AGAINST_KEYS.search(text) is None and not _TESTS_PREFIX.search(f"{text} {guard_text}"):
                if not _reads_only_named_files(loads_text):
                    cut = "cuts 7 characters off" if kind == "slice" else "drops the first part of"
                    yield node, f"`{code}` {cut} every key, with or without the `module.` prefix."
        elif kind in ("replace", "split"):
            inner = sorted(ctx.project.module_attributes)
            if inner:  # a key with `module.` further in exists in this project
                verb = "rewrites" if kind == "replace" else "cuts"
                yield node, f"`{code}` also {verb} keys that contain `module.` further in (this project's `{inner[0]}.`)."
        elif kind == "lstrip":
            yield node, f"`{code}` strips the characters of `module.`, not the prefix (`module.mlp.w` → `p.w`)."


def _reads_only_named_files(function_text: str) -> bool:
    """Whether every `torch.load` of the function reads a file named by a literal (a released checkpoint)."""
    loads = list(_LOADS.finditer(function_text))
    return bool(loads) and all(load["literal"] for load in loads)


def _prefix_string(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        if isinstance(value, str) and value in _PREFIX_LIKE:
            return value
    return None


class _StrippingCollector(cst.CSTVisitor):
    """(node, kind, prefix string or None for a bare `[7:]`) for each way of stripping the prefix."""

    def __init__(self) -> None:
        self.found: List[Tuple[cst.CSTNode, str, Optional[str]]] = []

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and node.args):
            return
        if dotted(func) == "str.replace" and len(node.args) >= 3:
            # `str.replace(k, "module.", "")`: the method called through the class.
            prefix, new = _prefix_string(node.args[1].value), node.args[2].value
            if prefix is not None and isinstance(new, cst.SimpleString) and new.evaluated_value == "":
                self.found.append((node, "replace", prefix))
            return
        if func.attr.value == "join" and isinstance(func.value, cst.SimpleString) and func.value.evaluated_value == ".":
            if len(node.args) == 1 and _drops_first_part(node.args[0].value):
                self.found.append((node, "first part", None))
            return
        prefix = _prefix_string(node.args[0].value)
        if prefix is None:
            return
        method = func.attr.value
        if method == "replace" and len(node.args) >= 2:
            new = node.args[1].value
            if isinstance(new, cst.SimpleString) and new.evaluated_value == "":
                self.found.append((node, "replace", prefix))
        elif method in ("lstrip", "removeprefix") and len(node.args) == 1:
            if method == "lstrip" or prefix != "module.":
                self.found.append((node, method if method == "lstrip" else "replace", prefix))

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if len(node.slice) != 1:
            return
        element = node.slice[0].slice
        value = node.value
        if isinstance(element, cst.Index) and isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            if value.func.attr.value == "split" and value.args:
                prefix = _prefix_string(value.args[0].value)
                if prefix is not None and signed_integer_value(element.value) in (-1, 1):
                    self.found.append((node, "split", prefix))
            return
        if not isinstance(element, cst.Slice) or element.upper is not None or element.step is not None:
            return
        lower = element.lower
        if signed_integer_value(lower) == 7:
            self.found.append((node, "slice", None))
        elif isinstance(lower, cst.Call) and dotted(lower.func) == "len" and lower.args:
            prefix = _prefix_string(lower.args[0].value)
            if prefix is not None:
                self.found.append((node, "slice", prefix))


def _drops_first_part(node: cst.BaseExpression) -> bool:
    """`k.split(".")[1:]`."""
    if not (isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Slice)):
        return False
    element, split = node.slice[0].slice, node.value
    if element.upper is not None or element.step is not None or signed_integer_value(element.lower) != 1:
        return False
    return (
        isinstance(split, cst.Call)
        and isinstance(split.func, cst.Attribute)
        and split.func.attr.value == "split"
        and len(split.args) == 1
        and isinstance(split.args[0].value, cst.SimpleString)
        and split.args[0].value.evaluated_value == "."
    )
