"""`dplint server` whose DPL101 crashes on text that holds CRASH_DPLINT: how the server reports an internal error."""

from dplint.rules.discarded_tensor_move import DiscardedTensorMove
from dplint.server.server import main

original_check = DiscardedTensorMove.check


def crashing_check(self, ctx):
    if "CRASH_DPLINT" in ctx.source:
        raise RuntimeError("a rule that crashes")
    return original_check(self, ctx)


DiscardedTensorMove.check = crashing_check
raise SystemExit(main())
