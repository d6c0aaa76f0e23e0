"""DataParallel's four steps (torch/nn/parallel in torch 2.13), for devices simulated on CPU.

Each function does what its namesake in torch does, with "copy to device d" left out:
- `scatter`: `tensor.chunk(n, dim)` per tensor (comm.scatter), containers recursively, non-tensors
  shared; inputs that split into different numbers of chunks are cut to the shortest (`zip`).
- `replicate`: replica 0 gets the original parameters (as views, so gradients flow to them) and the
  original buffers; the other replicas get copies (`broadcast_coalesced`); tied weights stay tied.
- `parallel_apply`: each replica on its chunk; an exception names the replica, as torch's does, and is
  re-raised as torch's worker threads' are: its traceback as text, nothing chained.
- `gather`: concatenation along `dim` in the first output's dtype (comm.gather), containers
  recursively with `zip(..., strict=True)`.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any, Dict, List, Sequence, Tuple

import torch
from torch import nn
from torch._utils import ExceptionWrapper

from dplint.runtime.dataparallel import frames


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def scatter(obj: Any, devices: int, dim: int) -> List[Any]:
    """`torch.nn.parallel.scatter_gather.scatter` onto `devices` simulated devices."""
    if isinstance(obj, torch.Tensor):
        return list(obj.chunk(devices, dim))
    if _is_namedtuple(obj):
        return [type(obj)(*args) for args in zip(*(scatter(o, devices, dim) for o in obj))]
    if isinstance(obj, tuple) and len(obj) > 0:
        return list(zip(*(scatter(o, devices, dim) for o in obj)))
    if isinstance(obj, list) and len(obj) > 0:
        return [list(i) for i in zip(*(scatter(o, devices, dim) for o in obj))]
    if isinstance(obj, dict) and len(obj) > 0:
        return [type(obj)(i) for i in zip(*(scatter(o, devices, dim) for o in obj.items()))]
    return [obj for _ in range(devices)]


def scatter_kwargs(inputs: Tuple[Any, ...], kwargs: Dict[str, Any], devices: int, dim: int):
    """`torch.nn.parallel.scatter_kwargs`, including its padding (and its quirk of comparing to `inputs`)."""
    scattered_inputs = scatter(inputs, devices, dim) if inputs else []
    scattered_kwargs = scatter(kwargs, devices, dim) if kwargs else []
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs.extend(() for _ in range(len(scattered_kwargs) - len(scattered_inputs)))
    elif len(scattered_kwargs) < len(inputs):
        scattered_kwargs.extend({} for _ in range(len(scattered_inputs) - len(scattered_kwargs)))
    return tuple(scattered_inputs), tuple(scattered_kwargs)


def _broadcast(tensors: Sequence[torch.Tensor], copies: int, detach: bool) -> List[List[torch.Tensor]]:
    """`_broadcast_coalesced_reshape`: replica 0 gets the tensors themselves (views when autograd
    records the broadcast), the others copies whose gradients flow back to the originals."""
    if detach:
        first = list(tensors)
        return [first] + [[t.detach().clone() for t in tensors] for _ in range(copies - 1)]
    first = [t.view_as(t) for t in tensors]
    return [first] + [[t.clone() for t in tensors] for _ in range(copies - 1)]


def replicate(network: nn.Module, copies: int, detach: bool = False) -> List[nn.Module]:
    """`torch.nn.parallel.replicate` onto `copies` simulated devices."""
    if copies < 1:
        return []
    params = list(network.parameters())
    param_indices = {param: index for index, param in enumerate(params)}
    param_copies = _broadcast(params, copies, detach)
    buffers = list(network.buffers())
    with_grad = [b for b in buffers if b.requires_grad and not detach]
    without_grad = [b for b in buffers if not (b.requires_grad and not detach)]
    buffer_copies = {id(b): copy for b, copy in zip(with_grad, zip(*_broadcast(with_grad, copies, False)))} if with_grad else {}
    buffer_copies.update(
        {id(b): copy for b, copy in zip(without_grad, zip(*_broadcast(without_grad, copies, True)))} if without_grad else {}
    )

    modules = list(network.modules())
    module_indices = {module: index for index, module in enumerate(modules)}
    module_copies: List[List[nn.Module]] = [[] for _ in range(copies)]
    for module in modules:
        for j in range(copies):
            replica = module._replicate_for_data_parallel()
            replica._former_parameters = OrderedDict()
            module_copies[j].append(replica)

    for i, module in enumerate(modules):
        for key, child in module._modules.items():
            for j in range(copies):
                if child is None:
                    module_copies[j][i]._modules[key] = None
                else:
                    setattr(module_copies[j][i], key, module_copies[j][module_indices[child]])
        for key, param in module._parameters.items():
            for j in range(copies):
                replica = module_copies[j][i]
                if param is None:
                    replica._parameters[key] = None
                else:
                    param_copy = param_copies[j][param_indices[param]]
                    setattr(replica, key, param_copy)
                    replica._former_parameters[key] = param_copy
        for key, buffer in module._buffers.items():
            for j in range(copies):
                replica = module_copies[j][i]
                if buffer is None:
                    replica._buffers[key] = None
                else:
                    setattr(replica, key, buffer_copies[id(buffer)][j])
    return [module_copies[j][0] for j in range(copies)]


def parallel_apply(
    replicas: Sequence[nn.Module], inputs: Sequence[Any], kwargs: Sequence[Dict[str, Any]], devices: Sequence[Any]
) -> List[Any]:
    """`torch.nn.parallel.parallel_apply`, one replica after the other."""
    if len(replicas) != len(inputs):
        raise AssertionError(f"The number of modules {len(replicas)} is not equal to the number of inputs {len(inputs)}")
    if len(replicas) != len(kwargs):
        raise AssertionError(f"The number of modules {len(replicas)} is not equal to the number of kwargs_tup {len(kwargs)}")
    outputs = []
    for i, (replica, positional, keywords, device) in enumerate(zip(replicas, inputs, kwargs, devices)):
        if not isinstance(positional, (list, tuple)):
            positional = (positional,)
        failure = None
        try:
            outputs.append(replica(*positional, **keywords))
        except Exception as error:
            # The replica's traceback as torch's worker thread formats it: from the replica's call on,
            # without this function's frame.
            exc_info = (type(error), error, frames.without_own_frames(error.__traceback__))
            failure = ExceptionWrapper(exc_info, where=f"in replica {i} on device {device}")
        if failure is not None:
            failure.reraise()  # as torch does, in the caller and outside any handler: nothing chained
    return outputs


def _gather_tensors(tensors: List[torch.Tensor], dim: int) -> torch.Tensor:
    """`Gather.forward` + `comm.gather`: same number of dims, result in the first tensor's dtype."""
    if all(t.dim() == 0 for t in tensors) and dim == 0:
        tensors = [t.view(1) for t in tensors]
        warnings.warn(
            "Was asked to gather along dimension 0, but all input tensors were scalars; "
            "will instead unsqueeze and return a vector.",
            stacklevel=2,
        )
    first = tensors[0]
    for index, tensor in enumerate(tensors):
        if tensor.dim() != first.dim():
            raise RuntimeError(
                "Expected all input tensors to have the same number of dimensions, but tensor at index "
                f"{index} has {tensor.dim()} dimensions, (expected {first.dim()})"
            )
    return torch.cat([t if t.dtype == first.dtype else t.to(first.dtype) for t in tensors], dim)


def gather(outputs: Sequence[Any], dim: int) -> Any:
    """`torch.nn.parallel.scatter_gather.gather`: tensors concatenated along `dim`, containers recursively."""
    out = outputs[0]
    if isinstance(out, torch.Tensor):
        return _gather_tensors(list(outputs), dim)
    if out is None:
        return None
    if isinstance(out, dict):
        if not all(len(out) == len(d) for d in outputs):
            raise ValueError("All dicts must have the same number of keys")
        return type(out)((k, gather([d[k] for d in outputs], dim)) for k in out)
    if _is_namedtuple(out):
        return type(out)._make(gather(parts, dim) for parts in zip(*outputs, strict=True))
    return type(out)(map(lambda parts: gather(parts, dim), zip(*outputs, strict=True)))
