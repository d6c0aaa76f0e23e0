from __future__ import annotations

from dplint.rule import Rule


class BatchRowsNotIndependent(Rule):
    """
    ## What it does
    At runtime, with `check_rows=True` (on by default under the pytest plugin), runs the wrapped
    module once more on the whole batch, without gradients, from the same random state and on a
    copy of its parameters and buffers, and compares that output with what the simulated
    `nn.DataParallel` forward gathered. Reports when they differ beyond float rounding, naming the
    split dim and the likely cause.

    ## Why is this bad?
    DataParallel assumes that the rows along `dim` are independent samples: the output for a chunk
    equals those rows of the full-batch output. A time-major input breaks this without changing any
    shape: an `nn.TransformerEncoder(batch_first=False)` fed `[S, B, E]` and wrapped with the default
    `dim=0` is split along the *sequence*, each replica attends over part of every sequence, and the
    gathered output has exactly the input's shape, so no shape check can see it. BatchNorm in training
    mode normalises each replica's chunk with its own statistics: a real multi-GPU difference (the
    same happens on real GPUs), reported as advice.

    ## Example
    ```python
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(512, 8), num_layers=6)  # [S, B, E]
    model = nn.DataParallel(encoder)  # dim=0 splits the sequence
    ```

    ## Use instead
    ```python
    model = nn.DataParallel(encoder, dim=1)  # split along the batch
    ```

    ## Known problems
    Costs one more forward of the whole batch (without gradients) and a copy of the module's
    parameters and buffers per checked call: off by default in `dplint.runtime.checking()`, on under
    the pytest plugin (tests use small models); `ignore=["DPL309"]` / `--dplint-ignore DPL309` turns it
    off. A forward that draws random numbers (dropout in training mode) is not compared: chunked and
    whole-batch draws differ anyway. With BatchNorm in training mode anywhere in the module, a
    difference is reported as advice (a warning), even when another layer also mixes samples.
    Tolerance: 1e-5 + 1e-3 × the largest value (3e-2 for half precision).
    """

    code = "DPL309"
    name = "batch-rows-not-independent"
    summary = "The rows DataParallel splits are not independent samples: chunked and whole-batch outputs differ."
    runtime_only = True
    checked_on = (
        'nothing measured on scripts: `dplint run` leaves it off, and no script has been run under the pytest '
        "plugin. Only the test suite's own modules (`tests/test_runtime.py`, `tests/test_pytest_plugin.py`: a "
        'time-major TransformerEncoder, BatchNorm in training, independent rows, dropout).'
    )
