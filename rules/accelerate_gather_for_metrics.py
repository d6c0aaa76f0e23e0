from __future__ import annotations

from typing import Iterator, Sequence, Set, Tuple

import libcst as cst

from dplint.analysis.context import FileContext
from dplint.analysis.ddp import iter_scopes, iterated_loader, loops_and_after, trains
from dplint.analysis.execution import ACCELERATOR_CLASS
from dplint.analysis.facts import ProjectFacts
from dplint.analysis.names import block_body, descendants, iter_calls, iter_small_statements
from dplint.analysis.patterns import GuardedPattern
from dplint.rule import Invalid, Report, Rule, Valid

# Methods that turn the gathered values into one number straight away (`accelerator.gather(loss).mean()`):
# a logged mean that a few repeated samples barely move, not the rows a metric is computed over.
_REDUCTIONS = frozenset({"mean", "sum", "item", "max", "min", "nanmean"})


class GatherForMetrics(Rule):
    """
    ## What it does
    In an evaluation loop (one that neither calls `backward` nor steps an optimizer) over a `DataLoader`
    that `accelerator.prepare` handed back, finds `accelerator.gather(...)` of the batch's values, where
    `accelerator.gather_for_metrics(...)` is meant.

    ## Why is this bad?
    With Accelerate's default `even_batches=True`, a prepared loader gives every process the same number
    of full batches: when the dataset does not divide evenly, the last batches are filled up with
    samples from the start of the dataset. `gather` returns those repeated samples with the rest, so an
    accuracy, F1 or perplexity computed over the gathered rows counts them twice. `gather_for_metrics`
    drops them at the end of the loader (it knows the remainder). Nothing warns: the metric is just a
    little off, and differs with the number of processes.

    ## Example
    ```python
    for batch in eval_dataloader:  # from accelerator.prepare
        predictions = model(**batch).logits.argmax(dim=-1)
        predictions, references = accelerator.gather((predictions, batch["labels"]))
        metric.add_batch(predictions=predictions, references=references)
    ```

    ## Use instead
    ```python
    for batch in eval_dataloader:
        predictions = model(**batch).logits.argmax(dim=-1)
        predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
        metric.add_batch(predictions=predictions, references=references)
    ```

    ## Known problems
    Only a loader built by a `DataLoader(...)` call that the program hands to `accelerator.prepare` is
    known to be prepared. A file that mentions `even_batches`, a loader with `drop_last=True`, and a
    function that truncates the gathered rows itself (a slice to the dataset length or to
    `gradient_state.remainder`, the older examples' pattern) are left alone, and so are gathered values
    reduced to a number at once (`accelerator.gather(loss).mean()`) and a repeated scalar loss
    (`accelerator.gather(loss.repeat(batch_size))`): a mean loss over a few repeated samples barely moves.
    """

    code = "DPL522"
    preview = True
    preview_reason = "Too few findings to judge: 7 on the 904 repositories of bench/wild (7 true, labelled blind), under the 30 the stable tier needs."
    name = "gather-for-metrics"
    summary = "`accelerator.gather` in an evaluation loop keeps the samples Accelerate repeats to even out the last batch."
    severity = "warning"
    triggers = GuardedPattern(r"\.gather\s*\(", ["gather"])
    distributed_programs_only = True

    def outside_distributed_programs(self, project: ProjectFacts) -> bool:
        # An `Accelerator` starts no group in the distributed programs' facts: the execution model says
        # where one runs (as for DPL503).
        return project.uses_accelerate

    def applies_to(self, text: str, module_classes: Sequence[str], project: ProjectFacts) -> bool:
        # `even_batches=False` (or a configuration that may set it) leaves no repeated samples to drop.
        return project.uses_accelerate and "even_batches" not in text and super().applies_to(text, module_classes, project)

    VALID = [
        Valid(
            """
            from accelerate import Accelerator
            from torch.utils.data import DataLoader

            accelerator = Accelerator()
            eval_dataloader = DataLoader(eval_set, batch_size=32)
            model, eval_dataloader = accelerator.prepare(model, eval_dataloader)
            for batch in eval_dataloader:
                predictions = model(**batch).logits.argmax(dim=-1)
                predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
                metric.add_batch(predictions=predictions, references=references)
            """
        ),
        Valid(
            """
            from accelerate import Accelerator
            from torch.utils.data import DataLoader

            accelerator = Accelerator()
            eval_dataloader = DataLoader(eval_set, batch_size=32)
            model, eval_dataloader = accelerator.prepare(model, eval_dataloader)
            samples_seen = 0
            for step, batch in enumerate(eval_dataloader):
                predictions = model(**batch).logits.argmax(dim=-1)
                predictions, references = accelerator.gather((predictions, batch["labels"]))
                if step == len(eval_dataloader) - 1:
                    predictions = predictions[: len(eval_dataloader.dataset) - samples_seen]
                    references = references[: len(eval_dataloader.dataset) - samples_seen]
                else:
                    samples_seen += references.shape[0]
                metric.add_batch(predictions=predictions, references=references)
            """
        ),
        Valid(
            """
            from accelerate import Accelerator
            from torch.utils.data import DataLoader

            accelerator = Accelerator()
            eval_dataloader = DataLoader(eval_set, batch_size=32)
            model, eval_dataloader = accelerator.prepare(model, eval_dataloader)
            losses = []
            for batch in eval_dataloader:
                loss = model(**batch).loss
                losses.append(accelerator.gather(loss.repeat(32)))
                accelerator.print(accelerator.gather(loss).mean().item())
            """
        ),
        Valid(
            """
            from accelerate import Accelerator
            from torch.utils.data import DataLoader

            accelerator = Accelerator()
            train_dataloader = DataLoader(train_set, batch_size=32, shuffle=True)
            model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
            for batch in train_dataloader:
                outputs = model(**batch)
                accelerator.backward(outputs.loss)
                optimizer.step()
                accuracy = (accelerator.gather(outputs.logits.argmax(-1)) == accelerator.gather(batch["labels"])).float()
            """
        ),
        Valid(
            """
            from accelerate import Accelerator
            from torch.utils.data import DataLoader

            accelerator = Accelerator()
            eval_dataloader = DataLoader(eval_set, batch_size=32)  # never prepared: no padding, no sharding
            model = accelerator.prepare(model)
            for batch in eval_dataloader:
                predictions = accelerator.gather(model(**batch).logits.argmax(dim=-1))
                metric.add_batch(predictions=predictions, references=batch["labels"])
            """
        ),
        Valid(
            """
            from accelerate import Accelerator
            from accelerate.utils import DataLoaderConfiguration
            from torch.utils.data import DataLoader

            accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))
            eval_dataloader = accelerator.prepare(DataLoader(eval_set, batch_size=32))
            for batch in eval_dataloader:
                predictions = accelerator.gather(model(**batch).logits.argmax(dim=-1))
                metric.add_batch(predictions=predictions, references=accelerator.gather(batch["labels"]))
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            from accelerate import Accelerator
            from torch.utils.data import DataLoader

            accelerator = Accelerator()
            eval_dataloader = DataLoader(eval_set, batch_size=32)
            model, eval_dataloader = accelerator.prepare(model, eval_dataloader)
            for batch in eval_dataloader:
                predictions = model(**batch).logits.argmax(dim=-1)
                predictions, references = accelerator.gather((predictions, batch["labels"]))
                metric.add_batch(predictions=predictions, references=references)
            """,
            line=9,
        ),
        Invalid(
            """
            import torch
            from accelerate import Accelerator
            from torch.utils.data import DataLoader

            def evaluate(accelerator, model, loader):
                model.eval()
                all_preds, all_labels = [], []
                for images, labels in loader:
                    with torch.no_grad():
                        preds = model(images).argmax(1)
                    preds, labels = accelerator.gather((preds, labels))
                    all_preds.append(preds)
                    all_labels.append(labels)
                return (torch.cat(all_preds) == torch.cat(all_labels)).float().mean()

            def main():
                accelerator = Accelerator()
                val_loader = DataLoader(val_set, batch_size=64)
                model, val_loader = accelerator.prepare(build_model(), val_loader)
                print(evaluate(accelerator, model, val_loader))

            main()
            """,
            line=11,
        ),
        Invalid(
            """
            import evaluate
            from accelerate import Accelerator
            from torch.utils.data import DataLoader
            from tqdm.auto import tqdm

            accelerator = Accelerator()
            metric = evaluate.load("accuracy")
            eval_loader = DataLoader(eval_set, batch_size=16, collate_fn=collate)
            model = accelerator.prepare(model)
            eval_loader = accelerator.prepare(eval_loader)
            for step, batch in enumerate(tqdm(eval_loader)):
                logits = model(batch["pixel_values"]).logits
                metric.add_batch(predictions=accelerator.gather(logits.argmax(-1)), references=accelerator.gather(batch["labels"]))
            accelerator.print(metric.compute())
            """,
            line=13,
        ),
    ]

    def check(self, ctx: FileContext) -> Iterator[Report]:
        reported: Set[cst.BaseSmallStatement] = set()  # one finding for the gathers of a statement
        for scope in iter_scopes(ctx.module):
            for loop, after in loops_and_after(scope):
                if trains(ctx, loop) or _truncates_rows([loop, *after]):
                    continue
                loader = ctx.prepared_loader(iterated_loader(ctx, loop.iter))
                if loader is None or _drops_last(loader[1]):
                    continue
                where = ctx.where(loop)
                if where is None or not where.in_group or not where.on_every_rank:
                    continue
                for statement, call in _row_gathers(ctx, loop):
                    if statement not in reported:
                        reported.add(statement)
                        yield Report(
                            node=call,
                            statement=statement,
                            message="`gather` keeps the samples the prepared loader repeats to even out its last batch: the metric counts them twice.",
                            help="Use `accelerator.gather_for_metrics(...)`: at the end of the loader it drops the repeated samples (it takes the same tensors, or a tuple of them).",
                        )


def _row_gathers(ctx: FileContext, loop: cst.For) -> Iterator[Tuple[cst.BaseSmallStatement, cst.Call]]:
    """Each statement of the loop body with its first `accelerator.gather(x)` of per-sample values: not
    a repeated scalar (`loss.repeat(n)`) and not reduced to a number at once (`.mean()`)."""
    for statement in iter_small_statements(block_body(loop.body), into_functions=False):
        calls = list(iter_calls(statement, into_lambdas=False))
        reduced = {id(call.func.value) for call in calls if isinstance(call.func, cst.Attribute) and call.func.attr.value in _REDUCTIONS}
        for call in calls:
            if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "gather" and len(call.args) == 1 and call.args[0].keyword is None):
                continue
            if id(call) in reduced or ctx.object_class(call.func.value) != ACCELERATOR_CLASS:
                continue
            argument = call.args[0].value
            if isinstance(argument, cst.Call) and isinstance(argument.func, cst.Attribute) and argument.func.attr.value in ("repeat", "expand"):
                continue
            yield statement, call
            break


def _truncates_rows(statements: Sequence[cst.CSTNode]) -> bool:
    """Whether the loop, or the code after it, cuts rows off by hand: a slice `[:n]` of the first
    dimension to a computed length (`predictions[: len(eval_dataloader.dataset) - samples_seen]`), or
    reading Accelerate's `gradient_state.remainder`."""
    for statement in statements:
        for node in descendants(statement):
            if isinstance(node, cst.Attribute) and node.attr.value == "remainder":
                return True
            if isinstance(node, cst.Subscript) and node.slice:
                first = node.slice[0].slice
                if isinstance(first, cst.Index) or first.upper is None or first.lower is not None:
                    continue
                if not isinstance(first.upper, (cst.Integer, cst.UnaryOperation)):
                    return True
    return False


def _drops_last(call: tuple) -> bool:
    """Whether a `DataLoader(...)` call (symbolic) passes `drop_last=True`: no short last batch to fill up."""
    _, _, arguments, keywords = call
    named = dict(keywords)
    drop_last = named.get("drop_last", arguments[8] if len(arguments) > 8 else None)
    return drop_last is not None and drop_last != ("c", False)
