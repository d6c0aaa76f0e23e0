from __future__ import annotations

from typing import Iterator, Optional, Sequence

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.ddp import argument, is_literal, iter_scopes, iter_statements
from dplint.analysis.execution import builders_of
from dplint.analysis.facts import ProjectFacts
from dplint.analysis.inference import Inference, Kind
from dplint.analysis.names import iter_calls
from dplint.analysis.patterns import GuardedPattern
from dplint.rule import Invalid, Report, Rule, Valid

LIGHTNING_MODULES = frozenset(
    {
        "lightning.LightningModule", "lightning.pytorch.LightningModule", "lightning.pytorch.core.LightningModule",
        "lightning.pytorch.core.module.LightningModule", "pytorch_lightning.LightningModule",
        "pytorch_lightning.core.LightningModule", "pytorch_lightning.core.module.LightningModule",
        "pytorch_lightning.core.lightning.LightningModule",
    }
)  # fmt: skip
# The hooks whose `self.log` logs on epoch level by default (`on_epoch=True`, `on_step=False`); the
# `*_epoch_end` hooks of Lightning 1.x among them.
_EPOCH_LEVEL_HOOKS = frozenset(
    """validation_step test_step on_validation_epoch_end on_test_epoch_end validation_epoch_end
    test_epoch_end""".split()
)
# `Trainer(...)` arguments that run one process per device, when their literal value says so.
_DISTRIBUTED_STRATEGIES = ("ddp", "fsdp", "deepspeed")
_STRATEGY_KEYWORDS = ("strategy", "accelerator", "distributed_backend")  # Lightning 1.x took "ddp" as `accelerator`
_DEVICE_KEYWORDS = ("devices", "gpus", "num_nodes")


class LogWithoutSyncDist(Rule):
    """
    ## What it does
    In a `LightningModule`, finds `self.log(name, tensor)` and `self.log_dict({...: tensor})` in
    `validation_step`, `test_step`, `on_validation_epoch_end` and `on_test_epoch_end` without
    `sync_dist=True`, in a project whose `Trainer(...)` runs several processes: a literal
    `strategy="ddp..."`/`"fsdp"`/`"deepspeed..."`, or `devices`/`gpus`/`num_nodes` greater than 1.

    ## Why is this bad?
    There `self.log` logs on epoch level: each process averages the values of its own shard of the
    validation set, and without `sync_dist=True` nothing averages them across the processes. The
    logged number describes rank 0's shard, and the value `ModelCheckpoint(monitor=...)` and
    `EarlyStopping` read is each rank's own: Lightning combines their decisions (`EarlyStopping` stops
    when any rank's shard says so), but each rests on one shard. Lightning only warns at runtime (a
    `PossibleUserWarning`, once).

    ## Example
    ```python
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))
    ```

    ## Use instead
    ```python
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), sync_dist=True)
    ```

    ## Known problems
    Only values known to be tensors are reported: a `torchmetrics.Metric` object syncs itself, and a
    python number (which Lightning turns into a tensor, with the same result) is not recognised. A
    `Trainer` configured from a file or the command line (`LightningCLI`, `devices=args.gpus`) is not
    known to run several processes, and its project is not checked. `rank_zero_only=True` and a
    `sync_dist=` expression are left alone.
    """

    code = "DPL523"
    preview = True
    preview_reason = "Too few findings to judge: 3 on the 904 repositories of bench/wild (2 true, 1 moot, labelled blind), under the 30 the stable tier needs."
    name = "log-without-sync-dist"
    summary = "An epoch-level `self.log` of a tensor without `sync_dist=True` under a multi-process `Trainer`: each rank logs its own shard."
    severity = "warning"
    triggers = GuardedPattern(r"self\.log(_dict)?\s*\(", ["self.log"])

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        return "LightningModule" in text and super().applies_to(text, module_classes, project)

    VALID = [
        Valid(
            """
            import lightning as L
            import torch.nn.functional as F

            class Classifier(L.LightningModule):
                def validation_step(self, batch, batch_idx):
                    x, y = batch
                    self.log("val_loss", F.cross_entropy(self.net(x), y), sync_dist=True)

            L.Trainer(strategy="ddp", devices=4).fit(Classifier())
            """
        ),
        Valid(
            """
            import lightning as L
            import torch.nn.functional as F
            import torchmetrics

            class Classifier(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=10)

                def validation_step(self, batch, batch_idx):
                    x, y = batch
                    self.accuracy(self.net(x), y)
                    self.log("val_acc", self.accuracy)  # a Metric object: it syncs its own state

                def training_step(self, batch, batch_idx):
                    x, y = batch
                    loss = F.cross_entropy(self.net(x), y)
                    self.log("train_loss", loss)  # on step: this rank's batch
                    return loss

            L.Trainer(devices=2).fit(Classifier())
            """
        ),
        Valid(
            """
            import pytorch_lightning as pl
            import torch.nn.functional as F

            class Classifier(pl.LightningModule):
                def validation_step(self, batch, batch_idx):
                    x, y = batch
                    self.log("val_loss", F.cross_entropy(self.net(x), y))

            pl.Trainer(devices=1).fit(Classifier())  # one process
            """
        ),
        Valid(
            """
            import lightning as L
            import torch.nn.functional as F

            class Classifier(L.LightningModule):
                def validation_step(self, batch, batch_idx):
                    x, y = batch
                    self.log("val_loss", F.cross_entropy(self.net(x), y), sync_dist=self.trainer.world_size > 1)
                    self.log("rank0_loss", F.cross_entropy(self.net(x), y), rank_zero_only=True)

            def main(args):
                L.Trainer(strategy=args.strategy, devices=args.devices).fit(Classifier())
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import lightning as L
            import torch.nn.functional as F

            class Classifier(L.LightningModule):
                def validation_step(self, batch, batch_idx):
                    x, y = batch
                    self.log("val_loss", F.cross_entropy(self.net(x), y))

            L.Trainer(strategy="ddp", devices=4).fit(Classifier())
            """,
            line=7,
        ),
        Invalid(
            """
            import torch
            from pytorch_lightning import LightningModule, Trainer

            class Regressor(LightningModule):
                def test_step(self, batch, batch_idx):
                    x, y = batch
                    error = torch.abs(self.net(x) - y).mean()
                    self.log_dict({"test_mae": error, "test_mse": torch.square(self.net(x) - y).mean()}, prog_bar=True)

            def main():
                trainer = Trainer(gpus=2, max_epochs=10)
                trainer.test(Regressor())

            if __name__ == "__main__":
                main()
            """,
            line=8,
        ),
        Invalid(
            """
            import lightning.pytorch as pl
            import torch
            import torch.nn.functional as F

            class Segmenter(pl.LightningModule):
                def validation_step(self, batch, batch_idx):
                    images, masks = batch
                    loss = F.binary_cross_entropy_with_logits(self.net(images), masks)
                    self.log("val_loss", loss, prog_bar=True, sync_dist=False)
                    return loss

            trainer = pl.Trainer(accelerator="gpu", devices=8, strategy="fsdp")
            trainer.fit(Segmenter())
            """,
            line=9,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        inference = Inference.of(ctx)
        multi_process: Optional[bool] = None  # read at the first candidate: most files log nothing on epoch level
        # Every class and method, also those defined under a module-level `if` or `try`.
        for method_scope in iter_scopes(ctx.module):
            method, owner = method_scope.node, method_scope.owner
            if method is None or owner is None or method.name.value not in _EPOCH_LEVEL_HOOKS:
                continue
            if not any(ctx.qualify(base.value) in LIGHTNING_MODULES for base in owner.bases):
                continue
            for small in iter_statements(method_scope):
                scope = inference.scope_of(small)
                if scope is None:
                    continue
                for call in iter_calls(small, into_lambdas=False):
                    value = _logged_tensor_values(call)
                    if value is None or not all(inference.kind(item, scope) is Kind.TENSOR for item in value):
                        continue
                    if multi_process is None:
                        # Lightning calls the hook: no program of the project reaches it, so the
                        # calls searched are the whole project's.
                        multi_process = _multi_process_trainer(ctx, ctx.line(call))
                    if not multi_process:
                        return
                    yield Report(
                        node=call,
                        statement=small,
                        message=f"`{ctx.short_code(call.func)}` in `{method.name.value}` logs this rank's own epoch value: without `sync_dist=True` no rank averages the others'.",
                        help="Pass `sync_dist=True` (it averages the epoch value across the processes), or log a `torchmetrics.Metric` object, which syncs its own state.",
                    )


def _logged_tensor_values(call: cst.Call) -> Optional[Sequence[cst.BaseExpression]]:
    """The values a `self.log(name, value)` / `self.log_dict({...})` call logs on epoch level without
    syncing them: None where it syncs, may sync (`sync_dist=<expression>`), logs from rank 0 only,
    does not log on epoch level, or passes what is not read (`**kwargs`, more positional arguments)."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"):
        return None
    method = func.attr.value
    positional = [arg for arg in call.args if arg.keyword is None]
    if any(arg.star for arg in call.args) or len(positional) > (2 if method == "log" else 1):
        return None
    sync = argument(call, "sync_dist")
    if sync is not None and not is_literal(sync, False):
        return None
    zero_only, on_epoch = argument(call, "rank_zero_only"), argument(call, "on_epoch")
    if (zero_only is not None and not is_literal(zero_only, False)) or (on_epoch is not None and not is_literal(on_epoch, True)):
        return None
    if method == "log":
        value = argument(call, "value", 1)
        return None if value is None else [value]
    if method == "log_dict":
        dictionary = argument(call, "dictionary", 0)
        if isinstance(dictionary, cst.Dict) and dictionary.elements and all(isinstance(e, cst.DictElement) for e in dictionary.elements):
            return [element.value for element in dictionary.elements]
    return None


def _multi_process_trainer(ctx: FileContext, line: int) -> bool:
    """Whether a `Trainer(...)` of the programs reaching the line (of the project, where none does) runs
    one process per device: a literal distributed strategy, or a literal number of devices (or nodes)
    above 1."""
    for builder in builders_of("lightning.Trainer"):
        for _, site, _ in ctx.execution.library_calls(line, builder):
            for keyword, value in site.keywords:
                if value[0] != "c":
                    continue
                if keyword in _STRATEGY_KEYWORDS and isinstance(value[1], str) and value[1].startswith(_DISTRIBUTED_STRATEGIES):
                    return True
                if keyword in _DEVICE_KEYWORDS and isinstance(value[1], int) and not isinstance(value[1], bool) and value[1] > 1:
                    return True
    return False
