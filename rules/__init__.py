"""The pitfall catalogue: one module per pitfall, one class per rule code."""

from __future__ import annotations

from typing import Dict, List, Type

from dplint.rule import Rule
from dplint.rules.batch_dim_moved import BatchDimMovedInForward
from dplint.rules.cuda_visible_devices import CudaVisibleDevicesAfterCudaInit, CudaVisibleDevicesAfterTorchImport
from dplint.rules.discarded_tensor_move import DiscardedTensorMove
from dplint.rules.parse_error import ParseError

# Rules that run on a parsed file, in code order. DPL000 is produced by the engine itself.
CHECKS: List[Type[Rule]] = [
    DiscardedTensorMove,
    CudaVisibleDevicesAfterCudaInit,
    CudaVisibleDevicesAfterTorchImport,
    BatchDimMovedInForward,
]
ALL_RULES: List[Type[Rule]] = [ParseError, *CHECKS]
BY_CODE: Dict[str, Type[Rule]] = {rule.code: rule for rule in ALL_RULES}

__all__ = ["ALL_RULES", "BY_CODE", "CHECKS", "ParseError"]
