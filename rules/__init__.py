"""The pitfall catalogue: one module per pitfall, one class per rule code."""

from __future__ import annotations

from typing import Dict, List, Type

from dplint.rules.accelerate_gather_for_metrics import GatherForMetrics
from dplint.rules.accumulated_loss_tensor import AccumulatedLossTensor
from dplint.rules.batch_dim_moved import BatchDimMovedInForward
from dplint.rules.ddp_checkpoint_ranks import CheckpointOnEveryRank, CheckpointPerNode, LoadWithoutMapLocation
from dplint.rules.ddp_collective_result import CollectiveResultAssigned
from dplint.rules.ddp_unreduced_metric import UnreducedMetric
from dplint.rules.ddp_rank_conditional_collective import RankConditionalCollective
from dplint.rules.ddp_model_changed_after_wrap import ModelChangedAfterDdpWrap
from dplint.rules.ddp_missing_set_device import MissingSetDevice
from dplint.rules.ddp_data_parallel_inside_ddp import DataParallelInsideDdp
from dplint.rules.ddp_optimizer_before_fsdp import OptimizerBeforeFsdpWrap
from dplint.rules.ddp_forward_through_module import ForwardThroughDdpModule
from dplint.rules.ddp_global_rank_as_device import GlobalRankAsDevice
from dplint.rules.ddp_loader_not_sharded import TrainingLoaderNotSharded
from dplint.rules.ddp_local_rank_argument import LocalRankArgument
from dplint.rules.ddp_local_rank_as_global_rank import LocalRankAsGlobalRank
from dplint.rules.ddp_sampler_set_epoch import DistributedSamplerSeedPerRank, DistributedSamplerWithoutSetEpoch
from dplint.rules.ddp_shuffle_with_sampler import ShuffleWithDistributedSampler
from dplint.rules.ddp_step_inside_no_sync import OptimizerStepInsideNoSync
from dplint.rules.ddp_accumulation_without_no_sync import AccumulationWithoutNoSync
from dplint.rules.backward_bypasses_engine import BackwardBypassesEngine
from dplint.rules.cuda_visible_devices import (
    CudaVisibleDevicesAfterCudaInit,
    CudaVisibleDevicesAfterTorchImport,
)
from dplint.rules.device_index_beyond_visible import DeviceIndexBeyondVisible
from dplint.rules.discarded_tensor_move import DiscardedTensorMove
from dplint.rules.forward_mutates_module_state import ForwardMutatesModuleState
from dplint.rules.fsdp_full_state_dict_on_device import FullStateDictOnDevice
from dplint.rules.hard_coded_device_in_forward import HardCodedDeviceInForward
from dplint.rules.invalid_device_string import InvalidDeviceString
from dplint.rules.lightning_log_without_sync_dist import LogWithoutSyncDist
from dplint.rules.loss_data_index import LossDataIndex
from dplint.rules.model_outside_strategy_scope import ModelOutsideStrategyScope
from dplint.rules.module_off_primary_device import ModuleOffPrimaryDevice
from dplint.rules.parameters_in_replica_forward import ParametersInReplicaForward
from dplint.rules.parse_error import ParseError
from dplint.rules.replica_divergence import ReplicaDivergence
from dplint.rules.rnn_without_flatten_parameters import RnnWithoutFlattenParameters
from dplint.rules.rows_not_independent import BatchRowsNotIndependent
from dplint.rules.scalar_output_from_forward import ScalarOutputFromForward
from dplint.rules.scatter_drops_samples import ScatterDropsSamples
from dplint.rules.single_device_data_parallel import SingleDeviceDataParallel
from dplint.rules.uneven_batch import UnevenBatch
from dplint.rules.unknown_noqa_code import UnknownNoqaCode
from dplint.rules.unused_noqa import UnusedNoqa
from dplint.rules.unused_parameters import UnusedParameters
from dplint.rules.wrapper_attribute_access import WrapperAttributeAccess
from dplint.rules.wrapper_state_dict_prefix import WrapperStateDictPrefix, WrapperStateDictSaved

from dplint.rule import Rule

# Rules that run on a parsed file, in code order. DPL000 is produced by the engine itself.
CHECKS: List[Type[Rule]] = [
    UnusedNoqa,  # DPL001 and DPL002 judge the noqa directives: the engine runs them after the others
    UnknownNoqaCode,
    DiscardedTensorMove,
    InvalidDeviceString,
    ModuleOffPrimaryDevice,
    HardCodedDeviceInForward,
    CudaVisibleDevicesAfterCudaInit,
    CudaVisibleDevicesAfterTorchImport,
    DeviceIndexBeyondVisible,
    BatchDimMovedInForward,
    WrapperAttributeAccess,
    WrapperStateDictPrefix,
    WrapperStateDictSaved,
    ForwardMutatesModuleState,
    ScalarOutputFromForward,
    RnnWithoutFlattenParameters,
    ParametersInReplicaForward,
    LossDataIndex,
    AccumulatedLossTensor,
    ModelOutsideStrategyScope,
    DistributedSamplerWithoutSetEpoch,
    ShuffleWithDistributedSampler,
    TrainingLoaderNotSharded,
    ForwardThroughDdpModule,
    CheckpointOnEveryRank,
    LoadWithoutMapLocation,
    RankConditionalCollective,
    MissingSetDevice,
    UnreducedMetric,
    LocalRankArgument,
    ModelChangedAfterDdpWrap,
    CollectiveResultAssigned,
    DistributedSamplerSeedPerRank,
    DataParallelInsideDdp,
    OptimizerBeforeFsdpWrap,
    GlobalRankAsDevice,
    OptimizerStepInsideNoSync,
    BackwardBypassesEngine,
    LocalRankAsGlobalRank,
    GatherForMetrics,
    LogWithoutSyncDist,
    FullStateDictOnDevice,
    AccumulationWithoutNoSync,
    CheckpointPerNode,
]
# Checked only by the runtime hook (`dplint.runtime`); documented with the rest.
RUNTIME_ONLY: List[Type[Rule]] = [
    UnevenBatch,
    SingleDeviceDataParallel,
    BatchRowsNotIndependent,
    ScatterDropsSamples,
    ReplicaDivergence,
    UnusedParameters,
]
ALL_RULES: List[Type[Rule]] = sorted([ParseError, *CHECKS, *RUNTIME_ONLY], key=lambda rule: rule.code)
BY_CODE: Dict[str, Type[Rule]] = {rule.code: rule for rule in ALL_RULES}

__all__ = ["ALL_RULES", "BY_CODE", "CHECKS", "RUNTIME_ONLY", "ParseError"]
