from __future__ import annotations

import re
from typing import FrozenSet, Iterator, List, Tuple

import libcst as cst

from dplint.context import FileContext
from dplint.analysis.inference import WRAPPERS
from dplint.analysis.names import (
    Body,
    child_blocks,
    dotted,
    iter_scope_bodies,
    iter_small_statements,
)
from dplint.rule import Invalid, Report, Rule, Valid

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
# `x = nn.DataParallel(...)`, `self.model = DDP(...)`: a file without such a line has nothing to check.
_WRAP_ASSIGNMENT = re.compile(r"^[ \t]*[\w.]+[ \t]*=[ \t]*[\w.]*(?:DataParallel|DDP)\(", re.M)


class WrapperAttributeAccess(Rule):
    """
    ## What it does
    After `model = nn.DataParallel(model)` (or `DistributedDataParallel`), checks the same function
    for reads of attributes the wrapper does not have (`model.fc`, `model.encode(x)`) and for
    attribute assignments on it (`model.flag = True`). `nn.Module` methods and the wrappers' own
    attributes (`train`, `parameters`, `state_dict`, `to`, `device_ids`, `module`, `no_sync`, …) are
    fine; code before the wrap, and code after a wrap that happens only in a branch, are not checked.

    ## Why is this bad?
    The wrapper holds the model as `model.module`; it does not forward attribute lookups. Reading
    `model.fc` raises `AttributeError` — often only on the multi-GPU machine, where the wrap happens.
    Setting `model.flag = True` silently sets it on the wrapper: the wrapped model never sees it.

    ## Example
    ```python
    model = nn.DataParallel(model)
    features = model.encode(images)
    model.use_dropout = False
    ```

    ## Use instead
    ```python
    model = nn.DataParallel(model)
    features = model.module.encode(images)  # note: bypasses DataParallel, runs on one GPU
    model.module.use_dropout = False
    ```

    ## Known problems
    The wrap and the use must be in the same function. Names rebound after the wrap are forgotten.
    """

    code = "DPL302"
    name = "wrapper-attribute-access"
    summary = "An attribute read or set on a DataParallel/DDP wrapper instead of the wrapped `.module`."
    triggers = _WRAP_ASSIGNMENT

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
            features = model.encode(x)  # wrapped on some machines only: not reported
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            logits = model.classifier(features)
            """,
            line=3,
        ),
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP

            def setup(model, rank):
                model = DDP(model, device_ids=[rank])
                model.use_checkpointing = True
                return model
            """,
            line=5,
        ),
        Invalid(
            """
            import torch.nn as nn

            class Trainer:
                def __init__(self, net):
                    self.net = nn.DataParallel(net)
                    self.optimizer = make_optimizer(self.net.backbone.parameters())
            """,
            line=6,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for body in iter_scope_bodies(ctx.module):
            yield from self._block(ctx, body, frozenset())

    def _block(self, ctx: FileContext, body: Body, wrapped: FrozenSet[str]) -> Iterator[Report]:
        for statement in body:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if wrapped:
                        yield from self._accesses(ctx, small, wrapped)
                    wrapped = _after(ctx, small, wrapped)
                continue
            if isinstance(statement, cst.BaseCompoundStatement):
                # Wraps seen so far hold inside the block. After it, a wrap made inside may not have
                # happened, and a name rebound inside may no longer be the wrapper: neither is known.
                for block in child_blocks(statement):
                    yield from self._block(ctx, block, wrapped)
                wrapped = wrapped - _assigned_inside(statement)

    def _accesses(self, ctx: FileContext, small: cst.BaseSmallStatement, wrapped: FrozenSet[str]) -> Iterator[Report]:
        targets = set()
        if isinstance(small, cst.Assign):
            targets = {id(t.target) for t in small.targets}
        elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            targets = {id(small.target)}
        collector = _AttributeCollector(wrapped)
        small.visit(collector)
        for attribute, owner in collector.found:
            name = attribute.attr.value
            if name in WRAPPER_ATTRIBUTES or name.startswith("_"):
                continue
            setting = id(attribute) in targets
            yield Report(
                node=attribute,
                message=(
                    f"`{owner}` is a DataParallel/DDP wrapper here, which does not have `{name}`: "
                    + (
                        f"setting `{owner}.{name}` never reaches the wrapped model; set `{owner}.module.{name}`."
                        if setting
                        else f"`{owner}.{name}` raises AttributeError (typically only on the multi-GPU machine); use "
                        f"`{owner}.module.{name}`."
                    )
                ),
                help=f"Use `{owner}.module.{name}`.",
                statement=small,
            )


class _AttributeCollector(cst.CSTVisitor):
    """`x.attr` where `x` (a name or `self.name`) is a wrapper, outermost attribute of each chain."""

    def __init__(self, wrapped: FrozenSet[str]) -> None:
        self.wrapped = wrapped
        self.found: List[Tuple[cst.Attribute, str]] = []

    def visit_Attribute(self, node: cst.Attribute) -> None:
        owner = dotted(node.value)
        if owner is not None and owner in self.wrapped:
            self.found.append((node, owner))


def _after(ctx: FileContext, small: cst.BaseSmallStatement, wrapped: FrozenSet[str]) -> FrozenSet[str]:
    """The wrapped names after an assignment statement."""
    if not isinstance(small, cst.Assign):
        return wrapped
    names = {dotted(t.target) for t in small.targets} - {None}
    is_wrap = isinstance(small.value, cst.Call) and ctx.qualify(small.value.func) in WRAPPERS
    return frozenset(wrapped | names) if is_wrap else frozenset(wrapped - names)


def _assigned_inside(statement: cst.BaseCompoundStatement) -> FrozenSet[str]:
    names = set()
    for small in iter_small_statements([statement], into_functions=False):
        if isinstance(small, cst.Assign):
            names.update(dotted(t.target) for t in small.targets)
    names.discard(None)
    return frozenset(names)
