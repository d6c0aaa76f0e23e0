from __future__ import annotations

from typing import Sequence

from dplint.rule import Rule


class ScalarOutputFromForward(Rule):
    """
    ## What it does
    At runtime, reports an `nn.DataParallel` forward whose replicas return a 0-dim tensor, typically a
    loss computed inside `forward` with the default `reduction="mean"`.

    ## Why is this bad?
    DataParallel gathers outputs by concatenation. 0-dim tensors cannot be concatenated, so it warns
    ("Was asked to gather along dimension 0, but all input tensors were scalars") and returns a vector
    with one value per replica. `loss.backward()` then fails on a non-scalar, and `loss.mean()` weights
    every replica equally: with chunks of [4, 4, 2] the last two samples count twice as much as the
    others.

    ## Example
    ```python
    class WithLoss(nn.Module):
        def forward(self, x, y):
            return F.cross_entropy(self.net(x), y)
    ```

    ## Use instead
    ```python
    class WithLoss(nn.Module):
        def forward(self, x, y):
            return F.cross_entropy(self.net(x), y, reduction="none")  # one loss per sample

    loss = model(x, y).mean()
    ```

    ## Known problems
    Reported only when every replica returns a 0-dim tensor at the same place in the output.
    """

    code = "DPL305"
    name = "scalar-output-from-forward"
    summary = "`forward` of a DataParallel-wrapped module returns a 0-dim tensor, gathered into one value per replica."
    runtime_only = True


def message(where: str, replicas: int, chunk_sizes: Sequence[int]) -> str:
    uneven = len(set(chunk_sizes)) > 1
    weighting = (
        f"and the chunks are uneven ({list(chunk_sizes)}), so averaging it weights samples unequally"
        if uneven
        else "so `backward()` needs a reduction and any average over it ignores how the batch was split"
    )
    return (
        f"forward returned a 0-dim tensor ({where}) on each replica; DataParallel gathered it into a vector of "
        f"{replicas} values, one per replica, {weighting}; return per-sample values (`reduction=\"none\"`) and "
        "reduce after the call."
    )
