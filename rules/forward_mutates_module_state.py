from __future__ import annotations

from typing import Sequence

from dplint.rule import Rule


class ForwardMutatesModuleState(Rule):
    """
    ## What it does
    At runtime, compares the attributes (other than parameters, buffers and submodules) of the
    wrapped module and its submodules before and after each `nn.DataParallel` forward, and reports
    `forward` rebinding one (`self.steps += 1`, `self.cache = x`) or changing a list, dict or set
    attribute in place (`self.history.append(loss)`).

    ## Why is this bad?
    DataParallel runs `forward` on replicas: shallow copies of the module made for every call. A
    rebinding happens on a replica and is thrown away with it, so the counter never advances and the
    cache stays empty, while on one GPU (no replicas) it works. An in-place change of a shared list or
    dict runs concurrently from every replica's thread, in no fixed order.

    ## Example
    ```python
    class Net(nn.Module):
        def forward(self, x):
            self.steps += 1
            return self.fc(x)
    ```

    ## Use instead
    Keep such state outside the module (in the training loop), or in a registered buffer updated in
    place (`self.steps.add_(1)`), which is how BatchNorm keeps its statistics; note that buffer
    updates are kept only from the replica on `device_ids[0]`.

    ## Known problems
    Only attributes are compared, one level deep: a change inside an object held by an attribute is
    not seen. Private torch bookkeeping (`_parameters`, hooks, …) is ignored.
    """

    code = "DPL304"
    name = "forward-mutates-module-state"
    summary = "`forward` of a DataParallel-wrapped module changes module attributes, which replicas lose."
    runtime_only = True


def message(class_name: str, changes: Sequence[str]) -> str:
    return (
        f"`{class_name}.forward` {', '.join(changes)}: under DataParallel, forward runs on per-call replicas, so "
        "rebindings are lost when the call returns and in-place changes race between replicas' threads; keep "
        "the state outside the module, or in a registered buffer updated in place."
    )
