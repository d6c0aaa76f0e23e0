from __future__ import annotations

from typing import Iterable, Iterator, List, Tuple

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.ddp import ScopeInfo, calls_in, is_backward_call, is_no_sync_call, iter_scopes, scope_calls, steps_an_optimizer
from dplint.analysis.execution import ACCELERATOR_CLASS
from dplint.analysis.names import Body, block_body, child_blocks, descendants, dotted, header_expressions
from dplint.analysis.patterns import GuardedPattern
from dplint.analysis.wrapping import wrapped_names
from dplint.rule import Invalid, Report, Rule, Valid

# A call in a loop's body and the `if` statements between the loop and it (either branch).
GuardedCall = Tuple[cst.Call, Tuple[cst.If, ...]]


class AccumulationWithoutNoSync(Rule):
    """
    ## What it does
    Finds gradient accumulation on a DistributedDataParallel model without `no_sync()`: a loop that
    runs the DDP model forward and calls `backward()` on every iteration, but steps a torch optimizer
    only under a test the backward does not run under, a modulo such as
    `if (step + 1) % accumulation == 0:`, while the function never enters the model's `no_sync()`.

    ## Why is this bad?
    DDP all-reduces every gradient during each `backward()` of a forward it ran outside `no_sync()`.
    Accumulating over N micro-batches that way costs N all-reduces per optimizer step where one, on
    the micro-batch that steps, gives the same gradients. The result is correct; the communication
    is N times what it needs to be. torch's `DistributedDataParallel.no_sync` docstring shows the
    idiom; Accelerate's `accelerator.accumulate(model)`, DeepSpeed's engine and Lightning's
    `accumulate_grad_batches` skip the extra all-reduces themselves.

    ## Example
    ```python
    model = DistributedDataParallel(model, device_ids=[local_rank])
    for step, (x, y) in enumerate(loader):
        loss_fn(model(x), y).backward()
        if (step + 1) % accumulation == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    model = DistributedDataParallel(model, device_ids=[local_rank])
    for step, (x, y) in enumerate(loader):
        stepping = (step + 1) % accumulation == 0
        with contextlib.nullcontext() if stepping else model.no_sync():
            loss_fn(model(x), y).backward()  # the forward too: DDP decides at the forward whether to sync
        if stepping:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Known problems
    Advice, not a bug: the gradients are the same either way, and the cost shows only where the
    all-reduce is slow next to the compute (a large model, several nodes, a slow interconnect). Only
    the loop's own code is read: a forward or a step in a function the loop calls, a `no_sync()`
    entered through a helper of the project, an accumulation that steps after an inner loop of
    micro-batches, or a test other than a modulo are not seen, and nothing is reported. A model is
    DDP only where the program wraps it in `DistributedDataParallel` (not through `accelerator.prepare`).
    """

    code = "DPL525"
    preview = True
    preview_reason = (
        "Too few findings, and too many moot: 13 on the 904 repositories of bench/wild, labelled blind: 3 true, 10 true but "
        "moot (the accumulation defaults to 1 and nothing the repository ships raises it)."
    )
    name = "accumulation-without-no-sync"
    summary = "Gradient accumulation on a DDP model without `no_sync()`: every micro-step all-reduces the gradients."
    severity = "warning"
    triggers = GuardedPattern(r"\.backward\s*\(", [".backward"])
    requires = GuardedPattern(r"%", ["%"])

    VALID = [
        Valid(
            """
            import contextlib
            import torch
            from torch.nn.parallel import DistributedDataParallel

            def train(model, loader, accumulation, local_rank):
                model = DistributedDataParallel(model, device_ids=[local_rank])
                optimizer = torch.optim.AdamW(model.parameters())
                for step, x in enumerate(loader):
                    stepping = (step + 1) % accumulation == 0
                    with contextlib.nullcontext() if stepping else model.no_sync():
                        model(x).sum().backward()
                    if stepping:
                        optimizer.step()
                        optimizer.zero_grad()
            """
        ),
        Valid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel

            def train(model, loader, local_rank):
                model = DistributedDataParallel(model, device_ids=[local_rank])
                optimizer = torch.optim.AdamW(model.parameters())
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()  # a step on every micro-batch: no accumulation
                    optimizer.zero_grad()
            """
        ),
        Valid(
            """
            import torch

            def train(model, loader, accumulation):
                model = torch.nn.DataParallel(model)  # one process: no all-reduce in backward
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for step, x in enumerate(loader):
                    model(x).sum().backward()
                    if (step + 1) % accumulation == 0:
                        optimizer.step()
                        optimizer.zero_grad()
            """
        ),
        Valid(
            """
            import torch
            from accelerate import Accelerator

            def train(model, loader):
                accelerator = Accelerator(gradient_accumulation_steps=4)
                optimizer = torch.optim.AdamW(model.parameters())
                model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
                for step, x in enumerate(loader):
                    with accelerator.accumulate(model):  # syncs only on the micro-batch that steps
                        accelerator.backward(model(x).sum())
                        if (step + 1) % 4 == 0:
                            optimizer.step()
                            optimizer.zero_grad()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def train(model, loader, accumulation, local_rank):
                model = DDP(model, device_ids=[local_rank])
                optimizer = torch.optim.AdamW(model.parameters())
                for step, (x, y) in enumerate(loader):
                    loss = torch.nn.functional.cross_entropy(model(x), y) / accumulation
                    loss.backward()
                    if (step + 1) % accumulation == 0:
                        optimizer.step()
                        optimizer.zero_grad()
            """,
            line=9,
        ),
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel

            class Trainer:
                def __init__(self, model, args):
                    self.model = DistributedDataParallel(model, device_ids=[args.local_rank])
                    self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr)
                    self.scaler = torch.cuda.amp.GradScaler()
                    self.accumulation = args.accumulation

                def epoch(self, loader):
                    for step, x in enumerate(loader):
                        with torch.autocast("cuda"):
                            loss = self.model(x).mean()
                        self.scaler.scale(loss).backward()
                        if step % self.accumulation == self.accumulation - 1:
                            self.scaler.step(self.optimizer)
                            self.scaler.update()
                            self.optimizer.zero_grad()
            """,
            line=15,
        ),
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel

            def train_epoch(model, optimizer, loader, accumulation):
                for i, (x, y) in enumerate(loader):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    (loss / accumulation).backward()
                    if (i + 1) % accumulation == 0 or i + 1 == len(loader):
                        optimizer.step()
                        optimizer.zero_grad()

            def main(args, model, loader):
                if args.distributed:
                    model = DistributedDataParallel(model, device_ids=[args.gpu])
                optimizer = torch.optim.Adam(model.parameters())
                for epoch in range(args.epochs):
                    train_epoch(model, optimizer, loader, args.accumulation)
            """,
            line=7,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for scope in iter_scopes(ctx.module):
            if scope.node is None:
                continue
            ddp = wrapped_names(ctx, scope, prepared=False)
            if not ddp or _skips_synchronization(ctx, scope):
                continue
            for loop in _loops(scope.body):
                calls = list(_guarded_calls(block_body(loop.body)))
                if not any(dotted(call.func) in ddp for call, _ in calls):
                    continue  # the loop runs no forward of a DDP model
                steps = [index for index, (call, _) in enumerate(calls) if steps_an_optimizer(ctx, call)]
                for index, (call, tests) in enumerate(calls):
                    if is_backward_call(call) and steps and _accumulates(calls[_next_step(steps, index)][1], tests):
                        yield Report(
                            node=call,
                            message="Every accumulation micro-step's `backward()` all-reduces the DDP gradients; only the one "
                            "that steps needs to.",
                            help="Run the other micro-steps' forward and backward in `with model.no_sync():`, e.g. `with "
                            "contextlib.nullcontext() if stepping else model.no_sync(): loss_fn(model(x), y).backward()` "
                            "(or use `accelerator.accumulate(model)`); the gradients are the same, with one all-reduce per step.",
                        )


def _next_step(steps: List[int], index: int) -> int:
    """The first optimizer step the loop runs after the call at `index`: later in the body, else on the
    next iteration. A GAN's loop steps each model's optimizer after its own backward: the step that
    follows a backward is the one its gradients are for."""
    return next((step for step in steps if step > index), steps[0])


def _accumulates(step_tests: Tuple[cst.If, ...], backward_tests: Tuple[cst.If, ...]) -> bool:
    """Whether the step runs under a modulo test the backward does not run under."""
    return any(_counts_micro_steps(test) and all(test is not other for other in backward_tests) for test in step_tests)


def _skips_synchronization(ctx: FileContext, scope: ScopeInfo) -> bool:
    """Whether the function enters a `no_sync()`, an Accelerator's `accumulate()`, or sets DDP's
    `require_backward_grad_sync` (what `no_sync()` itself toggles) anywhere."""
    for call in scope_calls(scope):
        if is_no_sync_call(call):
            return True
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "accumulate" and ctx.object_class(call.func.value) == ACCELERATOR_CLASS:
            return True
    return any(isinstance(node, cst.Attribute) and node.attr.value == "require_backward_grad_sync" for node in descendants(scope.node))


def _loops(body: Body) -> Iterator[cst.BaseCompoundStatement]:
    """Every `for` and `while` of the statements, nested ones too, outside nested functions."""
    for statement in body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, (cst.For, cst.While)):
            yield statement
        if isinstance(statement, cst.BaseCompoundStatement):
            for block in child_blocks(statement):
                yield from _loops(block)


def _guarded_calls(body: Body, tests: Tuple[cst.If, ...] = ()) -> Iterator[GuardedCall]:
    """The calls of a loop's body with the `if` statements they run under; a nested loop is a loop of
    its own (its iterations are not this loop's), so its body is left out."""
    for statement in body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, cst.BaseCompoundStatement):
            for header in header_expressions(statement):
                yield from ((call, tests) for call in calls_in(header))
            if isinstance(statement, (cst.For, cst.While)):
                continue
            inner = tests + (statement,) if isinstance(statement, cst.If) else tests
            for block in _blocks(statement):
                yield from _guarded_calls(block, inner)
        else:
            yield from ((call, tests) for call in calls_in(statement))


def _blocks(statement: cst.BaseCompoundStatement) -> Iterable[Body]:
    """The blocks of a compound statement; an `elif` is a statement of the `if`'s else block, so its
    own test is seen too."""
    if isinstance(statement, cst.If) and isinstance(statement.orelse, cst.If):
        return [block_body(statement.body), [statement.orelse]]
    return child_blocks(statement)


def _counts_micro_steps(test: cst.If) -> bool:
    """An `if` whose test takes a modulo by something other than 1 (`(step + 1) % accumulation == 0`)."""
    return any(
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Modulo)
        and not (isinstance(node.right, cst.Integer) and node.right.value == "1")
        and not isinstance(node.left, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))  # `"%d" % n` formats
        for node in descendants(test.test)
    )
