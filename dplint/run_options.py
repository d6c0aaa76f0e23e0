"""What `dplint run`, its launcher and the pytest `ranks` marker share: the checks and the default timeout.

Outside `dplint.runtime`, whose import loads torch: `dplint run --help` and the pytest plugin list the checks without it.
"""

DEFAULT_TIMEOUT = 30.0
CHECKS_HELP = {
    "collectives": "DPL507: each collective's op, shapes and call site, compared across the ranks",
    "samplers": "DPL501, DPL503, DPL513: DistributedSampler epochs and settings",
    "sharding": "DPL503: the ranks' first training batches",
    "divergence": "DPL504, DPL511, DPL520: the replicas' parameters after each optimizer step",
    "checkpoints": "DPL505: the same path saved from several ranks",
    "unused-parameters": "DPL521: the parameters without a gradient",
}
ALL_CHECKS = tuple(CHECKS_HELP)
