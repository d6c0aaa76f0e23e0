from __future__ import annotations

from dplint.rule import Rule


class UnevenBatch(Rule):
    """
    ## What it does
    At runtime, warns when an `nn.DataParallel` batch splits into fewer chunks than there are devices,
    so some devices sit idle: a batch smaller than the device count, or one whose size makes
    `tensor.chunk` stop early (a batch of 10 on 8 devices is 5 chunks of 2).

    ## Why is this bad?
    Idle devices are wasted, and fewer replicas change behaviour: with keyword arguments the missing
    replicas get no positional input and `forward` raises `TypeError` (pytorch#52260), and a chunk of
    one sample breaks BatchNorm in training mode.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=10)  # on 8 GPUs: 5 chunks of 2
    ```

    ## Use instead
    ```python
    loader = DataLoader(dataset, batch_size=64, drop_last=True)  # a multiple of the GPU count
    ```

    ## Known problems
    Advice only: it is a warning, never an error, also in raise mode.
    """

    code = "DPL306"
    name = "uneven-batch"
    summary = "A DataParallel batch splits into fewer chunks than devices, leaving devices idle."
    severity = "warning"
    runtime_only = True
    checked_on = (
        '`dplint run --devices 2` and `--devices 8` on the 19 DataParallel scripts of `fixtures/` (the '
        'PyTorch "Optional: Data Parallelism" tutorial as published and its fixed twin; the others written '
        "for dplint's static rules, after research code): with 8 devices, 6 findings in 5 scripts (the "
        "tutorial's last batch of 10; batches of 4 and 6 in the others), all true, none false; with 2 "
        "devices, none. No repository's own script has been run."
    )
