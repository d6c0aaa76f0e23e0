from __future__ import annotations

from dplint.rule import Rule


class SingleDeviceDataParallel(Rule):
    """
    ## What it does
    At runtime, warns when `nn.DataParallel` runs over a single device.

    ## Why is this bad?
    There is nothing to parallelise: the wrapper only adds overhead and the `module.` prefix to
    `state_dict` keys. Worse, on one device DataParallel calls the module directly, without replicas
    or gathering, so the code never exercises what happens on two GPUs (attribute updates persist,
    0-dim outputs stay 0-dim) and breaks the first time it runs on more.

    ## Example
    ```python
    model = nn.DataParallel(model, device_ids=[0])
    ```

    ## Use instead
    ```python
    model = model.to(device)
    ```

    ## Known problems
    Advice only: it is a warning, never an error, also in raise mode.
    """

    code = "DPL307"
    name = "single-device-data-parallel"
    summary = "DataParallel over a single device adds overhead and no parallelism."
    severity = "warning"
    runtime_only = True
    checked_on = (
        '`dplint run --devices 1` on the 19 DataParallel scripts of `fixtures/` (the PyTorch "Optional: Data '
        'Parallelism" tutorial as published and its fixed twin; the others written for dplint\'s static rules, '
        'after research code): 9 findings in the 5 scripts that wrap in DataParallel whatever the GPU count, '
        "all true, none false; the others wrap only on several GPUs and were silent. No repository's own "
        'script has been run.'
    )
