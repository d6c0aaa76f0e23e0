from __future__ import annotations

from dplint.rule import Rule


class ScatterDropsSamples(Rule):
    """
    ## What it does
    At runtime, reports an `nn.DataParallel` forward whose tensor inputs split into different numbers
    of chunks along `dim` (a batch of 8 and one of 2 on 4 devices), with the number of rows dropped.

    ## Why is this bad?
    `scatter` splits each input with `tensor.chunk(n, dim)` and pairs the chunks with `zip`, which
    stops at the shortest: only as many replicas run as the input with the fewest chunks has, and the
    other inputs' remaining rows are silently dropped. The output is shorter than the batch, or (with
    a loss computed inside `forward`) the loss silently covers only part of it. A common cause is a
    tensor that is not per-sample, such as an RNN's initial hidden state `[layers, B, H]`, passed as
    an input.

    ## Example
    ```python
    model(tokens, h0)  # tokens [8, T], h0 [2, 8, H]: on 4 devices, 2 replicas run and 4 samples are lost
    ```

    ## Use instead
    ```python
    model(tokens, h0.transpose(0, 1))  # every input batch-first, with the same batch size
    ```

    ## Known problems
    When the inputs also split the keyword arguments differently, torch itself raises in
    `parallel_apply` and nothing more is reported.
    """

    code = "DPL310"
    name = "scatter-drops-samples"
    summary = "DataParallel inputs split into different numbers of chunks, so scatter silently drops samples."
    runtime_only = True
    checked_on = (
        '`dplint run --devices 1`, `2` and `8` on the 19 DataParallel scripts of `fixtures/` (the PyTorch '
        '"Optional: Data Parallelism" tutorial as published and its fixed twin; the others written for '
        "dplint's static rules, after research code): no finding (none passes inputs of different batch "
        "sizes). Beyond that, only the test suite's own modules (`tests/test_runtime.py`: batches of 8 and 2 "
        "on 4 devices, a hidden state `[2, 10, 5]` beside a batch of 10). No repository's own script has been "
        'run.'
    )
