"""What the analyses know of torch's API by qualified name, in one place for the project facts, the
in-file inference and the rules: which calls and annotations are a tensor (the tables generated from
torch's stubs, `tensor_api`, and the classes the stubs do not list as functions), and which classes
wrap a model for data parallelism."""

from __future__ import annotations

from dplint.analysis import tensor_api

# `torch.FloatTensor(3)`: the legacy tensor classes, callable like factories (classes, so not in the stubs' functions).
LEGACY_TENSOR_CLASSES = frozenset(
    """Tensor FloatTensor DoubleTensor HalfTensor BFloat16Tensor LongTensor IntTensor ShortTensor ByteTensor
    CharTensor BoolTensor""".split()
)
# `Variable(x)` has returned a plain tensor since torch 0.4.
TENSOR_TYPES = frozenset(
    {"torch.Tensor", "torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.autograd.Variable", "torch.autograd.variable.Variable"}
)


DATA_PARALLEL = frozenset(
    {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel"}
)
DISTRIBUTED_DATA_PARALLEL = frozenset(
    {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
)
FULLY_SHARDED_DATA_PARALLEL = frozenset(
    {"torch.distributed.fsdp.FullyShardedDataParallel", "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel"}
)
INIT_PROCESS_GROUP = frozenset({"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group"})
# `dist.get_rank()` without a group: the process's rank in the group `init_process_group` started.
GROUP_RANK_GETTERS = frozenset({"torch.distributed.get_rank", "torch.distributed.distributed_c10d.get_rank"})
DISTRIBUTED_SAMPLERS = frozenset({"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"})
FULLY_SHARD = frozenset({"torch.distributed.fsdp.fully_shard", "torch.distributed._composable.fsdp.fully_shard"})
# The wrappers whose attributes are their own, not the model's (the model is `wrapper.module`), by class.
ATTRIBUTE_WRAPPERS = {
    **{name: "DataParallel" for name in sorted(DATA_PARALLEL)},
    **{name: "DistributedDataParallel" for name in sorted(DISTRIBUTED_DATA_PARALLEL)},
}


# `torch.<name>`: the dtypes (a `Tensor.to` given only these casts, it does not move).
DTYPES = frozenset(
    """float32 float float64 double float16 half bfloat16 complex32 chalf complex64 cfloat complex128 cdouble uint8 uint16
    uint32 uint64 int8 int16 short int32 int int64 long bool float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz""".split()
)


def call_returns_tensor(qualified: str) -> bool:
    """Whether calling the torch name `qualified` returns one tensor (every overload)."""
    module, _, last = qualified.rpartition(".")
    if module == "torch":
        return last in tensor_api.TORCH_FUNCTIONS or last in LEGACY_TENSOR_CLASSES
    if module == "torch.nn.functional":
        return last in tensor_api.FUNCTIONAL_FUNCTIONS
    return qualified in TENSOR_TYPES
