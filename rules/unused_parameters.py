from __future__ import annotations

from dplint.rule import Rule


class UnusedParameters(Rule):
    """
    ## What it does
    At runtime (`dplint run`, `dplint.runtime.distributed.launch`, `@pytest.mark.dplint(ranks=N)`), turns
    DDP's "Expected to have finished reduction in the prior iteration" error into the names of the
    parameters that got no gradient on a rank, and says when they were frozen after wrapping.

    ## Why is this bad?
    With `find_unused_parameters=False` (the default) DDP waits for a gradient of every parameter;
    one that takes no part in the loss stops the second iteration with an error that lists parameter
    indices only (names need `TORCH_DISTRIBUTED_DEBUG`). On GPUs it is found only on the multi-GPU job.

    ## Example
    ```python
    class TwoHeads(nn.Module):
        def forward(self, x):
            return self.used(x)  # self.unused never takes part

    model = DDP(TwoHeads())
    ```

    ## Use instead
    ```python
    model = DDP(TwoHeads(), find_unused_parameters=True)  # or drop the unused head
    ```

    ## Known problems
    Only the parameters DDP itself names are reported: on a rank that fails for another reason first,
    nothing is.
    """

    code = "DPL521"
    name = "unused-parameters"
    summary = "Parameters of a DDP model got no gradient, which stops DDP at the next iteration."
    runtime_only = True
    checked_on = (
        '`dplint run` on the 17 DDP programs of `tests/distributed_programs/` and `fixtures/` (29 runs with '
        'their options; all written for dplint, after the torchrun tutorial, pytorch/examples, nanoGPT and '
        "the ImageNet example): no finding. The rule's example is found (`tests/test_distributed.py`). No "
        "repository's own script has been run."
    )
