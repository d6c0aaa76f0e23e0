from __future__ import annotations

from typing import Iterator

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.ddp import ScopeInfo, is_no_sync_call, iter_scopes, scope_calls, steps_an_optimizer
from dplint.analysis.names import Body, child_blocks
from dplint.analysis.patterns import GuardedPattern
from dplint.rule import Invalid, Report, Rule, Valid


class OptimizerStepInsideNoSync(Rule):
    """
    ## What it does
    Finds an optimizer step inside a `with model.no_sync():` block (DDP or FSDP; Accelerate's
    `with accelerator.no_sync(model):`): `optimizer.step()` on a torch optimizer the program built
    (directly, through a function of the project, or handed back by `accelerator.prepare`), or
    `scaler.step(optimizer)`.

    ## Why is this bad?
    Inside `no_sync()` a backward pass leaves the gradients local: DDP all-reduces them at the first
    backward outside the block. Gradient accumulation runs the micro-batches before the last one in
    `no_sync()` and the last one, the one that steps, outside it. A step taken inside the block applies
    gradients that no rank shared: each replica trains on its own shard, the replicas drift apart, and
    nothing fails.

    ## Example
    ```python
    for step, (x, y) in enumerate(loader):
        with model.no_sync():
            loss_fn(model(x), y).backward()
            if (step + 1) % accumulation == 0:
                optimizer.step()
                optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for step, (x, y) in enumerate(loader):
        stepping = (step + 1) % accumulation == 0
        with contextlib.nullcontext() if stepping else model.no_sync():
            loss_fn(model(x), y).backward()  # the stepping micro-batch syncs
        if stepping:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Known problems
    Only a step written in the block itself is seen, not one in a function the block calls. An
    optimizer the program receives from elsewhere (a framework's trainer, a factory outside the
    project) is not known to be one, and its step is not reported.
    """

    code = "DPL517"
    preview = True
    preview_reason = "Not measured yet: it made no finding on the 904 repositories of bench/wild."
    name = "optimizer-step-inside-no-sync"
    summary = "An optimizer step inside `no_sync()`: its gradients were never all-reduced, so the replicas drift apart."
    triggers = GuardedPattern(r"\.no_sync\s*\(", ["no_sync"])

    VALID = [
        Valid(
            """
            import torch

            def train(model, loader, accumulation):
                optimizer = torch.optim.AdamW(model.parameters())
                for step, (x, y) in enumerate(loader):
                    if (step + 1) % accumulation:
                        with model.no_sync():
                            model(x).sum().backward()
                    else:
                        model(x).sum().backward()
                        optimizer.step()
                        optimizer.zero_grad()
            """
        ),
        Valid(
            """
            import torch

            def train(model, loader, scheduler):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for x in loader:
                    with model.no_sync():
                        model(x).sum().backward()
                        scheduler.step()  # a scheduler's step: no gradients applied
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
                for x in loader:
                    with accelerator.accumulate(model):  # syncs on the micro-batch that steps
                        accelerator.backward(model(x).sum())
                        optimizer.step()
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch

            def train(model, loader, accumulation):
                optimizer = torch.optim.AdamW(model.parameters())
                for step, x in enumerate(loader):
                    with model.no_sync():
                        model(x).sum().backward()
                        if (step + 1) % accumulation == 0:
                            optimizer.step()
            """,
            line=9,
        ),
        Invalid(
            """
            import torch
            from accelerate import Accelerator

            def train(model, loader):
                accelerator = Accelerator()
                optimizer = torch.optim.AdamW(model.parameters())
                model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
                scaler = torch.cuda.amp.GradScaler()
                for x in loader:
                    with accelerator.no_sync(model):
                        scaler.scale(model(x).sum()).backward()
                        scaler.step(optimizer)
            """,
            line=12,
        ),
        Invalid(
            """
            import torch

            class Trainer:
                def __init__(self, model):
                    self.model = model
                    self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

                def accumulate(self, batches):
                    with self.model.no_sync():
                        for x in batches:
                            self.model(x).sum().backward()
                        self.optimizer.step()
            """,
            line=12,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        for scope in iter_scopes(ctx.module):
            for block in _no_sync_blocks(scope.body):
                for call in scope_calls(ScopeInfo(None, block, None)):
                    if steps_an_optimizer(ctx, call):
                        yield Report(
                            node=call,
                            message="This optimizer step runs inside `no_sync()`: its gradients were never all-reduced, so the "
                            "replicas drift apart.",
                            help="Step after a backward outside `no_sync()`: run the stepping micro-batch's backward outside "
                            "the block (or use `accelerator.accumulate(model)`).",
                        )


def _no_sync_blocks(body: Body) -> Iterator[Body]:
    """The body of each `with ....no_sync(...):` in the statements, outside nested functions."""
    for statement in body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, cst.With):
            if any(is_no_sync_call(item.item) for item in statement.items):
                yield from child_blocks(statement)
                continue
        if isinstance(statement, cst.BaseCompoundStatement):
            for block in child_blocks(statement):
                yield from _no_sync_blocks(block)

