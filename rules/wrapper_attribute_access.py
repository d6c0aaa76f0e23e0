from __future__ import annotations

import re
from typing import Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import libcst as cst

from dplint.analysis.facts import ProjectFacts
from dplint.analysis.inference import Inference
from dplint.analysis.names import block_body, child_blocks, descendants, iter_calls, run_visitor
from dplint.analysis.wrapping import WrapSite, describe, handled_names, holder, if_tests, may_prepare_models, preparer, scopes, unwrapped
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.context import FileContext
from dplint.rule import FixSpec, Invalid, NodeEdit, Report, Rule, Valid

# What DataParallel and DistributedDataParallel have themselves: nn.Module's API and the wrappers' own
# (DistributedDataParallel's public attributes and methods as of torch 2.13, read from its source).
WRAPPER_ATTRIBUTES = frozenset(
    """add_module apply bfloat16 buffers children compile cpu cuda double eval extra_repr float forward get_buffer
    get_extra_state get_parameter get_submodule half ipu load_state_dict modules mtia named_buffers named_children
    named_modules named_parameters parameters register_backward_hook register_buffer register_forward_hook
    register_forward_pre_hook register_full_backward_hook register_full_backward_pre_hook
    register_load_state_dict_post_hook register_load_state_dict_pre_hook register_module register_parameter
    register_state_dict_post_hook register_state_dict_pre_hook requires_grad_ set_extra_state set_submodule
    share_memory state_dict to to_empty train training type xpu zero_grad dump_patches call_super_init
    module device_ids output_device dim src_device_obj scatter replicate parallel_apply gather
    batched_grad_copy broadcast_bucket_size broadcast_buffers bucket_bytes_cap bucket_bytes_cap_default
    bucket_bytes_cap_list buffer_hook device device_mesh device_type find_unused_parameters forward_sync_buffers
    gradient_as_bucket_view is_multi_device_module join join_device join_hook join_process_group logger
    mixed_precision modules_buffers named_module_buffers no_sync parameters_to_ignore process_group reducer
    register_comm_hook require_backward_grad_sync require_forward_param_sync skip_all_reduce_unused_params
    static_graph to_kwargs use_side_stream_for_tensor_copies will_sync_module_buffers""".split()
)
# `x = nn.DataParallel(...)`, `self.model = DDP(...)`, `heads = [DataParallel(h) ...` (also in a one-line
# suite): a file without one has nothing to check.
_WRAP_ASSIGNMENT = GuardedPattern(
    r"(?:^|[:;])[ \t]*[\w.]+[ \t]*=[ \t]*[\[(]?[ \t]*[\w.]*(?:DataParallel|DDP)\(", ["DataParallel(", "DDP("], re.M
)


class WrapperAttributeAccess(Rule):
    """
    ## What it does
    Checks for attributes read or set on a name that may hold a `DataParallel` or
    `DistributedDataParallel` wrapper: `model.fc`, `model.encode(x)`, `model.flag = True` after
    `model = nn.DataParallel(model)`; a set only where the wrapped model is a class of the file whose
    methods read that attribute (yolov5's `model.nc = nc`, which the code reads back from the same
    wrapper, is left alone). A wrap on some path counts (`if torch.cuda.device_count() > 1:`,
    `if args.multi_gpu:`), as do wraps with `.cuda()`/`.to(device)` chained on them, and
    `self.model = DataParallel(self.model)` in one method (or in a base trainer, also in another file
    of the project) seen from the class's other methods. A wrap is followed into the calls that return
    it (`model = build_model(args)` where `build_model` returns a wrapper, also from another file),
    into objects (`trainer.model.fc` after `trainer = Trainer(net)` whose `__init__` wraps
    `self.model`), out of lists of wrappers (`self.heads[i].fc`, `for head in self.heads:`), and into
    a parameter of a top-level function to which every call in the project passes a wrapper
    (`def evaluate(model)` called as `evaluate(nn.DataParallel(net))`). A module that Accelerate's
    `accelerator.prepare` (or `prepare_model`) hands back counts as a DDP wrapper, which it is when the
    script runs in several processes (`model, opt = accelerator.prepare(model, opt)`), where the file
    builds that Accelerator with neither DeepSpeed nor FSDP (whose engines forward attribute reads to
    the model) and does not freeze the model (Accelerate leaves a model with nothing to train, or one
    prepared with `evaluation_mode=True`, unwrapped). `nn.Module` methods and the wrappers' own
    attributes (`train`, `parameters`, `state_dict`, `to`, `device_ids`, `module`, `no_sync`, …) are
    fine, and so is code that tells the cases apart: `hasattr(m, "module")`, `isinstance(m, ...)`,
    `getattr(m, "module", m)`, `m.module if ... else m`, or the other branch of the wrap's condition.
    A wrap that cannot succeed makes no wrapper: a keyword the wrapper does not take, or an object of a
    project class that is no `nn.Module` (`DDP(FixMatch(net))`, whose network is `.model`). Accelerate's
    `accelerator.unwrap_model(model)` gives the plain model back, prepared or not.

    The same wrapper, tested with `hasattr(model, "encoder")` where the rule would report
    `model.encoder` (in a statement, or as the test of an `if`), is reported too: the wrapper keeps the
    model's attributes on `model.module`, so the test is False there and the fallback runs. Not where
    the statement tells the cases apart by other means (`model.module` in the `else` branch), nor for
    `hasattr(model, "module")`.

    ## Why is this bad?
    The wrapper holds the model as `model.module`; it does not forward attribute lookups. Reading
    `model.fc` raises `AttributeError`, typically only on the multi-GPU machine where the wrap
    happens. Setting `model.flag = True` silently sets it on the wrapper: the wrapped model never
    sees it. `hasattr(model, "encoder")` is False on the wrapper: the branch meant for a model
    without one runs, silently. (FSDP forwards attribute reads to the wrapped module and is not checked.)

    ## Example
    ```python
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    features = model.encode(images)
    model.use_dropout = False
    if hasattr(model, "encoder"):  # False on the wrapper: the encoder is never frozen
        model.encoder.requires_grad_(False)
    ```

    ## Use instead
    ```python
    inner = getattr(model, "module", model)  # the plain model, wrapped or not
    features = inner.encode(images)  # note: bypasses DataParallel, runs on one GPU
    inner.use_dropout = False
    if hasattr(inner, "encoder"):
        inner.encoder.requires_grad_(False)
    ```

    ## Fix safety
    Where the name holds the wrapper on every path (an unconditional wrap), the fix reads or sets the
    attribute on `.module`. It is unsafe: a method called through `.module` runs on the wrapped model
    alone, outside the wrapper's forward (on one GPU for DataParallel; without DDP's gradient sync).
    A conditional wrap gets no fix: `getattr(m, "module", m)` is the user's choice of where to put it.

    ## Known problems
    A wrapper passed in as an argument is followed only when every use of the function in the project
    is a call that passes one, and no file that wraps nothing imports the function's module (its calls
    are not read); an import made inside a function is not seen. A wrapper returned by a method,
    inside a tuple, or stored in a dict is not followed. Base trainers are matched by class name.
    Not reported: a read of an attribute the same function set on the name earlier (the wrapper has it then), code after `assert not distributed`
    when the wrap needed `distributed`, the branch where `isinstance(m, DataParallel)` is false, and a
    method that only `__init__` calls before it wraps (when the file calls it nowhere else).
    A function that returns a wrapper only under a test of its own parameters (`create_model(opt)`
    wrapping `if opt.isTrain:`) leaves the wrap to each caller's argument, which is not evaluated:
    its calls are not taken to hold a wrapper. A prepared object counts only where the file shows it
    is a module (a `torch.nn` or torchvision constructor, an `nn.Module` class of the file): a model
    loaded by a library (`AutoModel.from_pretrained(...)`) or built by a class of another file is not
    followed, nor is an Accelerator built in another file (its plugins are not read there).
    A `hasattr` test is not reported inside another `if` (or `elif` chain) that tests the same name:
    that statement counts as telling the cases apart.
    """

    code = "DPL302"
    name = "wrapper-attribute-access"
    summary = "An attribute read or set on a DataParallel/DDP wrapper instead of the wrapped `.module`."
    triggers = _WRAP_ASSIGNMENT
    fix_applicability = ("unsafe",)

    VALID = [
        Valid(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            model.train()
            params = model.parameters()
            head = model.module.fc
            print(model.device_ids)
            """
        ),
        Valid(
            """
            import torch.nn as nn
            features = model.encode(x)  # before the wrap
            model = nn.DataParallel(model)
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn
            if torch.cuda.device_count() > 1:
                model = nn.DataParallel(model)
            if isinstance(model, nn.DataParallel):
                model = model.module
            features = model.encode(x)  # unwrapped on the path where it was wrapped
            """
        ),
        Valid(
            """
            import torch.nn as nn
            if args.ngpu > 1:
                model = nn.DataParallel(model)
            encoder = model.module.encoder if hasattr(model, "module") else model.encoder
            if args.ngpu == 1:
                model.encoder.requires_grad_(False)  # the branch where it is not wrapped
            getattr(model, "module", model).decoder.reset()
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Trainer:
                def __init__(self, net):
                    self.net = nn.DataParallel(net)
                    self.net = self.net.module  # unwrapped again

                def evaluate(self, x):
                    inner = self.net.module if hasattr(self.net, "module") else self.net
                    return inner.embed(x)
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Trainer:
                def __init__(self, model, path, ngpu):
                    self.model = model
                    self.load_model(path)  # runs before the wrap below: self.model is the plain model
                    if ngpu > 1:
                        self.model = nn.DataParallel(self.model)

                def load_model(self, path):
                    self.model.encoder.load_state_dict(torch.load(path)["encoder"])
            """
        ),
        Valid(
            """
            import torch

            class Encoder(torch.nn.Module):
                def __init__(self, name, is_inference=True):
                    super().__init__()
                    self.model = load(name)
                    if is_inference:
                        self.model = torch.nn.DataParallel(self.model)

            class TrainEncoder(Encoder):
                def __init__(self, **kwargs):
                    super().__init__(**kwargs, is_inference=False)  # the wrap above never runs for it

                def setup(self):
                    self.model.gradient_checkpointing_enable()
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Evaluator:
                def __init__(self, args):
                    self.args = args
                    self.model = build_model()
                    if args.distributed:
                        self.model = nn.parallel.DistributedDataParallel(self.model)

                def eval(self):
                    if self.args.distributed:  # the test the wrap made, through the attribute that keeps it
                        model = self.model.module
                    else:
                        model = self.model
                    return model.evaluate(batch)
            """
        ),
        Valid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            if is_distributed:
                model = DDP(model, device_ids=[rank])
            if args.trt:
                assert not args.fuse and not is_distributed, "TensorRT does not run distributed"
                model.head.decode_in_inference = False
            """
        ),
        Valid(
            """
            import torch
            import torch.nn as nn

            class Manager:
                def __init__(self, net):
                    self.net = nn.DataParallel(net)

                def flops(self, x):
                    if isinstance(self.net, nn.DataParallel):
                        net = self.net.module
                    else:
                        net = self.net
                    return net.get_flops(x)
            """
        ),
        Valid(
            """
            import torch
            # yolov5: the model never reads `class_weights`; the code reads it back from the same object.
            if cuda and RANK == -1 and torch.cuda.device_count() > 1:
                model = torch.nn.DataParallel(model)
            model.class_weights = labels_to_class_weights(dataset.labels, nc)
            weights = model.class_weights.cpu().numpy()
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Learner:
                def incremental_train(self, loader):
                    if len(self.gpus) > 1:
                        self.network = nn.DataParallel(self.network, self.gpus)
                    self.fit(loader)
                    if len(self.gpus) > 1:
                        self.network = self.network.module  # unwrapped before it returns

                def after_task(self):
                    self.network.fc.freeze()  # runs after incremental_train: the plain model
            """
        ),
        Valid(
            """
            import torch.nn as nn

            class Distiller:
                def compress(self):
                    self.student = Student()
                    if len(self.gpus) > 1:
                        self.student = nn.DataParallel(self.student, self.gpus)
                    if hasattr(self.student, "module"):
                        self.student_ptr = self.student.module
                    else:
                        self.student_ptr = self.student  # the plain model: it has no `module`
                    self.student_ptr.copy_fc(self.teacher.fc)
            """
        ),
        Valid(
            """
            import torch.nn as nn
            net = Encoder()
            crnn = nn.DataParallel(net, output_dim=1)  # raises TypeError: no wrapper is ever made
            crnn.encode(x)
            """
        ),
        Valid(
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator()
            model = torch.nn.Transformer()
            optimizer = torch.optim.AdamW(model.parameters())
            model, optimizer = accelerator.prepare(model, optimizer)
            model.train()
            optimizer.zero_grad()  # the prepared optimizer: no module
            memory = accelerator.unwrap_model(model).encoder(src)
            """
        ),
        Valid(
            """
            import torch
            from accelerate import Accelerator
            from accelerate.utils import DeepSpeedPlugin
            accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
            model = accelerator.prepare(torch.nn.Transformer())
            memory = model.encoder(src)  # DeepSpeed's engine forwards it to the model
            """
        ),
        Valid(
            """
            import torch.nn as nn
            if args.ngpu > 1:
                model = nn.DataParallel(model)
            if hasattr(model, "encoder"):
                encoder = model.encoder
            else:
                encoder = model.module.encoder  # the wrapped case, told apart
            core = model.module if hasattr(model, "module") else model
            if hasattr(core, "decoder") and hasattr(model, "train"):  # the plain model; nn.Module's own
                core.decoder.reset()
            """
        ),
        Valid(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            model.use_amp = True  # set on the wrapper itself: hasattr finds it there
            if hasattr(model, "use_amp"):
                scaler = make_scaler()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch

            class Encoder(torch.nn.Module):
                def __init__(self, name, is_inference=True):
                    super().__init__()
                    self.model = load(name)
                    if is_inference:
                        self.model = torch.nn.DataParallel(self.model)

            class ServeEncoder(Encoder):
                def __init__(self, **kwargs):
                    super().__init__(**kwargs, is_inference=True)

                def warm_up(self):
                    self.model.generate(prompt)
            """,
            line=15,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            def finetune(model, args):
                if torch.cuda.device_count() > 1:
                    model = nn.DataParallel(model)
                if hasattr(model, "encoder"):  # False on the wrapper: the encoder is never frozen
                    model.encoder.requires_grad_(False)
                return model
            """,
            line=7,
        ),
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP

            class Trainer:
                def __init__(self, net, rank):
                    self.net = DDP(net, device_ids=[rank])

                def embed(self, x):
                    return self.net.embed(x) if hasattr(self.net, "embed") else self.net(x)
            """,
            line=8,
        ),
        Invalid(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            logits = model.fc(features)
            """,
            line=3,
            expected_fix="""
            import torch.nn as nn
            model = nn.DataParallel(model)
            logits = model.module.fc(features)
            """,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Encoder(nn.Module):
                def forward(self, x):
                    return checkpoint(self.layers, x) if self.use_checkpointing else self.layers(x)

            model = nn.DataParallel(Encoder())
            model.use_checkpointing = True
            """,
            line=8,
            expected_fix="""
            import torch.nn as nn

            class Encoder(nn.Module):
                def forward(self, x):
                    return checkpoint(self.layers, x) if self.use_checkpointing else self.layers(x)

            model = nn.DataParallel(Encoder())
            model.module.use_checkpointing = True
            """,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            if torch.cuda.device_count() > 1:
                model = nn.DataParallel(model).cuda()
            features = model.encode(x)  # the multi-GPU run raises AttributeError
            """,
            line=5,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Trainer:
                def __init__(self, net, args):
                    self.net = net
                    if args.multi_gpu:
                        self.net = nn.DataParallel(self.net)

                def evaluate(self, x):
                    return self.net.embed(x)
            """,
            line=10,
        ),
        Invalid(
            """
            import torch.nn as nn

            class BaseTrainer:
                def __init__(self, model):
                    self.model = nn.DataParallel(model).to("cuda")

            class GANTrainer(BaseTrainer):
                def sample(self, z):
                    return self.model.generator(z)
            """,
            line=9,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            def build(model):
                if torch.cuda.device_count() > 1:
                    model = nn.DataParallel(model)
                return model.cuda()

            model = build(Net())
            logits = model.fc(features)
            """,
            line=10,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Learner:
                def incremental_train(self, loader):
                    if len(self.gpus) > 1:
                        self.network = nn.DataParallel(self.network, self.gpus)
                    self._train(loader)  # runs while the network is the wrapper
                    if len(self.gpus) > 1:
                        self.network = self.network.module

                def _train(self, loader):
                    optimizer = build_optimizer(self.network.backbone)
            """,
            line=12,
        ),
        Invalid(
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator()
            model = torch.nn.Transformer()
            optimizer = torch.optim.AdamW(model.parameters())
            model, optimizer = accelerator.prepare(model, optimizer)
            memory = model.encoder(src)  # a DDP wrapper under `accelerate launch` on several GPUs
            """,
            line=7,
        ),
    ]

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        """A wrap assigned in this file, a call of something that makes one, or a class of it inheriting a
        base trainer's `self.<attr>` wrap."""
        return (
            _WRAP_ASSIGNMENT.search(text) is not None
            or may_prepare_models(text)
            or any(project.attribute_wraps.get(name) for name in module_classes)
            or any(f"{name}(" in text for name in project.wrap_makers)
            or any(f"def {name}(" in text for name in project.wrapper_receivers)
        )

    def check(self, ctx: FileContext) -> Iterator[Report]:
        tests = if_tests(ctx)
        entered = _hasattr_ifs(ctx)
        for points in scopes(ctx):
            # Attributes the scope has set on a name while it may hold a wrapper: the wrapper has them then
            # (yolov5 sets `model.class_weights` on whatever `model` is, and reads it back).
            set_on_wrapper: Set[Tuple[str, str]] = set()
            for point in points:
                # An `if hasattr(...)` test runs before its body's first statement, with the state it was reached in.
                for statement in entered.get(id(point.statement), ()):
                    if id(statement) in tests:
                        wrapped, handled = tests[id(statement)]
                        yield from _hasattr_tests(ctx, statement.test, statement, wrapped, handled, set_on_wrapper)
                wrapped = {name: sites for name, sites in point.wrapped.items() if name not in point.handled}
                if wrapped:
                    yield from _hasattr_tests(ctx, point.statement, point.statement, wrapped, point.handled, set_on_wrapper)
                    yield from self._accesses(ctx, point.statement, wrapped, set_on_wrapper)

    def _accesses(
        self, ctx: FileContext, small: cst.BaseSmallStatement, wrapped: Dict[str, FrozenSet[WrapSite]], set_on_wrapper: Set[Tuple[str, str]]
    ) -> Iterator[Report]:
        targets = set()
        if isinstance(small, cst.Assign):
            targets = {id(t.target) for t in small.targets}
        elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            targets = {id(small.target)}
        collector = _AttributeCollector(wrapped)
        run_visitor(small, collector)
        for attribute, owner in collector.found:
            name = attribute.attr.value
            if name in WRAPPER_ATTRIBUTES or name.startswith("_"):
                continue
            sets = id(attribute) in targets
            if not sets and (owner, name) in set_on_wrapper:
                continue
            if sets and isinstance(small, (cst.Assign, cst.AnnAssign)):
                set_on_wrapper.add((owner, name))
            if sets and not _model_reads(ctx, wrapped[owner], name):
                continue  # the model never looks for it (yolov5's `model.nc = nc`, read back from the wrapper)
            wrapper, where, unconditional = describe(wrapped[owner], ctx)
            shown = ctx.short_code(attribute.value, 30) if owner.endswith("[]") else owner
            if sets:
                message = f"`{shown}.{name} = …` sets it on the {wrapper} wrapper ({where}), not on the model."
            else:
                holds = "is" if unconditional else "may be"
                message = f"`{shown}` {holds} the {wrapper} wrapper ({where}), which has no `{name}`."
            fix = None
            if unconditional:
                inner = f"{ctx.code(attribute.value)}.module"
                fix = FixSpec(f"Use `{shown}.module.{name}`", (NodeEdit(attribute.value, inner),), applicability="unsafe")
            plain = unwrapped(wrapped[owner], shown)
            if preparer(wrapped[owner]) is not None:
                help = f"Use `{plain}.{name}`."  # the model itself, in a run where `prepare` wrapped nothing
            else:
                help = f"Use `{shown}.module.{name}`, or `{plain}.{name}` where the wrap is conditional."
            yield Report(
                node=attribute,
                message=message,
                help=help,
                statement=small,
                fix=fix,
            )


def _hasattr_tests(
    ctx: FileContext,
    node: cst.CSTNode,
    statement: cst.CSTNode,
    wrapped: Mapping[str, FrozenSet[WrapSite]],
    handled: FrozenSet[str],
    set_on_wrapper: Set[Tuple[str, str]],
) -> Iterator[Report]:
    """`hasattr(model, "encoder")` in `node` (a small statement, or the test of the `if` statement) where
    `model` may hold a wrapper, which lacks the attribute: False there, whatever the model has. Not
    where the wrapper has it (its own attributes, nn.Module's, one the scope set on it) or where the
    statement tells the cases apart by other means (`model.module` in the fallback branch)."""
    found = []
    for call in iter_calls(node):
        if not (isinstance(call.func, cst.Name) and call.func.value == "hasattr" and len(call.args) == 2):
            continue
        owner = holder(call.args[0].value)
        attribute = call.args[1].value
        if owner is None or owner not in wrapped or owner in handled or not isinstance(attribute, cst.SimpleString):
            continue
        name = attribute.evaluated_value
        if not isinstance(name, str) or name in WRAPPER_ATTRIBUTES or name.startswith("_") or (owner, name) in set_on_wrapper:
            continue
        found.append((call, owner, name))
    if not found:
        return
    told_apart = handled_names(statement, frozenset(id(call) for call, _, _ in found))
    for call, owner, name in found:
        if owner in told_apart:
            continue
        wrapper, where, _ = describe(wrapped[owner], ctx)
        shown = ctx.short_code(call.args[0].value, 30) if owner.endswith("[]") else owner
        yield Report(
            node=call,
            message=f"`hasattr({shown}, '{name}')` is always False on the {wrapper} wrapper ({where}).",
            help=f"The wrapper keeps the model's attributes on `{shown}.module`: test `hasattr({unwrapped(wrapped[owner], shown)}, '{name}')`.",
            statement=statement,
        )


def _hasattr_ifs(ctx: FileContext) -> Dict[int, List[cst.If]]:
    """The `if`/`elif` statements whose test calls `hasattr`, by the `id` of the first small statement
    their body runs (the flow's first point after the test)."""
    entered: Dict[int, List[cst.If]] = {}
    if "hasattr(" not in ctx.source:
        return entered
    for node in descendants(ctx.module):
        if isinstance(node, cst.If) and any(isinstance(call.func, cst.Name) and call.func.value == "hasattr" for call in iter_calls(node.test)):
            first = _first_statement(block_body(node.body))
            if first is not None:
                entered.setdefault(id(first), []).append(node)
    return entered


def _first_statement(body: Sequence[cst.BaseStatement]) -> Optional[cst.BaseSmallStatement]:
    """The first small statement that running `body` reaches (nested blocks entered, definitions skipped)."""
    for statement in body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, cst.SimpleStatementLine):
            return statement.body[0]
        if isinstance(statement, cst.BaseCompoundStatement):
            return _first_statement(next(iter(child_blocks(statement)), ()))
        return None
    return None


def _model_reads(ctx: FileContext, sites: FrozenSet[WrapSite], name: str) -> bool:
    """Whether a model these wraps hold reads `self.<name>`: a class of this file, wrapped here, whose
    methods read it; an attribute set on its wrapper is then one the model never sees."""
    inference = Inference.of(ctx)
    lines = {site.line_in(ctx) for site in sites if not site.path}
    return any(
        wrap.filename == ctx.filename and wrap.line in lines and name in inference.self_reads(class_name)
        for class_name, wraps in ctx.project.wrapped.items()
        for wrap in wraps
    )


class _AttributeCollector(cst.CSTVisitor):
    """`x.attr` where `x` (a name or `self.name`) may be a wrapper, outermost attribute of each chain;
    not inside a conditional expression that tells the cases apart (`m.module if ... else m`)."""

    def __init__(self, wrapped: Mapping[str, object]) -> None:
        self.wrapped = wrapped
        self.skipped: List[Set[str]] = []
        self.found: List[Tuple[cst.Attribute, str]] = []

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self.skipped.append(handled_names(node))

    def leave_IfExp(self, original_node: cst.IfExp) -> None:
        self.skipped.pop()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        owner = holder(node.value)
        if owner is not None and owner in self.wrapped and not any(owner in names for names in self.skipped):
            self.found.append((node, owner))
