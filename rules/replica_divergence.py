from __future__ import annotations

from dplint.rule import Rule


class ReplicaDivergence(Rule):
    """
    ## What it does
    At runtime (`dplint run`, `dplint.runtime.distributed.launch`, `@pytest.mark.dplint(ranks=N)`), compares a
    checksum of every parameter of each `DistributedDataParallel` model across the ranks after each
    optimizer step, and reports the first step at which the replicas differ, naming the parameters.
    When the run shows why, the finding takes the code of the cause instead: DPL504 for a forward
    through `.module`, DPL511 for a change to the model after wrapping; DPL520 is the rest.

    ## Why is this bad?
    DDP broadcasts the parameters once, at construction, and from then on only averages gradients.
    Replicas that differ stay different: each rank trains its own model on 1/N of the data, and the
    checkpoint saved from rank 0 is not the model the run reports on. Nothing fails.

    ## Example
    ```python
    torch.manual_seed(rank)  # a seed per rank (for augmentation, say)
    model = DDP(net)
    for p in net.parameters():  # a per-rank update outside DDP's gradient sync
        p.data.add_(torch.randn_like(p) * 1e-3)
    ```

    ## Use instead
    ```python
    torch.manual_seed(0)  # the same noise on every rank, or no update outside the optimizer
    model = DDP(net)
    ```

    ## Known problems
    Checksums are per-parameter norms with a relative tolerance of 1e-5: a divergence smaller than
    that, or one that keeps every norm equal, is not seen.
    """

    code = "DPL520"
    name = "replica-divergence"
    summary = "DDP replicas hold different parameters after an optimizer step."
    runtime_only = True
    checked_on = (
        '`dplint run` on the 17 DDP programs of `tests/distributed_programs/` and `fixtures/` (29 runs with '
        'their options; all written for dplint, after the torchrun tutorial, pytorch/examples, nanoGPT and '
        'the ImageNet example): no finding; where replicas diverged (2 programs), a forward through `.module` '
        "caused it, reported as DPL504, rightly. The rule's example is found (`tests/test_distributed.py`). "
        "No repository's own script has been run."
    )
