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
