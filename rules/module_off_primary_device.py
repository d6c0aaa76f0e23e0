from __future__ import annotations

from typing import Sequence, Tuple

from dplint.rule import Rule

SHOWN = 5


class ModuleOffPrimaryDevice(Rule):
    """
    ## What it does
    At runtime, checks before every `nn.DataParallel` forward that all parameters and buffers of the
    wrapped module are on `device_ids[0]` (under simulation: on the device of the simulated
    replicas), and names every one that is not.

    ## Why is this bad?
    DataParallel broadcasts the module from `device_ids[0]` to the other GPUs. A parameter left on
    another device (or on `meta`, after a lazy initialisation) makes it raise "module must have its
    parameters and buffers on device cuda:0 (device_ids[0]) but found one of them on device: cuda:1"
    without saying which one, typically after a submodule was moved separately or created after the
    model was moved.

    ## Example
    ```python
    model = Net().cuda(1)
    model = nn.DataParallel(model, device_ids=[0, 1])
    ```

    ## Use instead
    ```python
    model = Net().to("cuda:0")  # device_ids[0]
    model = nn.DataParallel(model, device_ids=[0, 1])
    ```

    ## Known problems
    The result is cached per module and re-checked only when parameters or buffers are registered
    or moved (`Module.to/cuda/cpu/_apply`); replacing `param.data` directly is not noticed.
    """

    code = "DPL103"
    name = "module-off-primary-device"
    summary = "A parameter or buffer of a DataParallel-wrapped module is not on `device_ids[0]`."
    runtime_only = True


def message(offenders: Sequence[Tuple[str, str]], expected: str) -> str:
    named = ", ".join(f"{name} on {device}" for name, device in offenders[:SHOWN])
    more = f" and {len(offenders) - SHOWN} more" if len(offenders) > SHOWN else ""
    return (
        f"{named}{more}, expected {expected}: DataParallel broadcasts the module from device_ids[0], so every "
        f"parameter and buffer must be there before the call; call `model.to({expected!r})` after building "
        "or changing the model, before the forward."
    )
