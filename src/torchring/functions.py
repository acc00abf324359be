"""Helpers built on the collectives: broadcasting parameters, optimizer state and Python objects."""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .collectives import allgather, broadcast_, broadcast_async_, synchronize
from .process_sets import ProcessSet, global_process_set, resolve
from .runtime import context
from .runtime.names import auto_name


def _named_tensors(params: Any) -> list[tuple[str | None, torch.Tensor]]:
    if isinstance(params, Mapping):
        return sorted(params.items(), key=lambda item: item[0])
    items = list(params)
    if all(isinstance(item, tuple) and len(item) == 2 for item in items):
        return [(name, tensor) for name, tensor in items]
    if all(isinstance(item, torch.Tensor) for item in items):
        return [(None, tensor) for tensor in items]
    raise ValueError("params must be a state_dict, or a list of tensors or of (name, tensor) pairs")


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable[Any], root_rank: int) -> None:
    """Overwrite the given parameters on every rank with ``root_rank``'s values.

    ``params`` is a ``model.state_dict()`` or ``model.named_parameters()`` (sorted by name, so every
    rank sends the same order), or a list of tensors.
    """
    handles = []
    for name, tensor in _named_tensors(params):
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"parameter {name!r} is a {type(tensor).__name__}, not a tensor")
        handles.append(broadcast_async_(tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor,
                                        root_rank, name=name))
    for handle in handles:
        synchronize(handle)


def broadcast_object(obj: Any = None, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """``root_rank``'s ``obj`` on every rank of ``process_set`` (pickled; the others may pass anything,
    e.g. None). ``root_rank`` is a global rank."""
    name = name or auto_name("broadcast_object", resolve(process_set))
    is_root = context.current().topology.rank == root_rank
    payload = torch.frombuffer(bytearray(_dumps(obj)), dtype=torch.uint8) if is_root else None
    length = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64)
    broadcast_(length, root_rank, name=f"{name}.sz", process_set=process_set)
    if payload is None:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name=f"{name}.t", process_set=process_set)
    return obj if is_root else _loads(payload)


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every member's ``obj``, as a list in the order of the ranks of ``process_set``."""
    name = name or auto_name("allgather_object", resolve(process_set))
    payload = torch.frombuffer(bytearray(_dumps(obj)), dtype=torch.uint8)
    lengths = allgather(torch.tensor([payload.numel()], dtype=torch.int64), name=f"{name}.sz",
                        process_set=process_set)
    gathered = allgather(payload, name=f"{name}.t", process_set=process_set)
    objects, offset = [], 0
    for length in lengths.tolist():
        objects.append(_loads(gathered[offset:offset + length]))
        offset += length
    return objects


def _dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    return buffer.getvalue()


def _loads(payload: torch.Tensor) -> Any:
    data = bytearray(payload.numel())
    torch.frombuffer(data, dtype=torch.uint8).copy_(payload)
    return torch.load(io.BytesIO(data), weights_only=False)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: torch.nn.Module | None = None) -> None:
    """Make every rank's optimizer state and hyper-parameters equal to ``root_rank``'s.

    Scalar options (lr, momentum, betas, ...) keep their Python types; state tensors are broadcast in
    place. An optimizer without state yet gets it created first (parameters are left untouched).
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        _initialize_state(optimizer)
    state_dict = optimizer.state_dict()
    is_root = context.current().topology.rank == root_rank
    layout = broadcast_object(_state_layout(state_dict) if is_root else None, root_rank,
                              name="optimizer_state_layout")
    if len(layout["groups"]) != len(optimizer.param_groups):
        raise ValueError(f"rank {root_rank}'s optimizer has {len(layout['groups'])} parameter groups, this rank's "
                         f"has {len(optimizer.param_groups)}; build the same optimizer on every rank")
    for group, root_options in zip(optimizer.param_groups, layout["groups"], strict=True):
        for key, value in root_options.items():
            group[key] = value
    params = [p for group in optimizer.param_groups for p in group["params"]]
    handles = []
    for index, entries in sorted(layout["state"].items()):
        state = optimizer.state[params[index]]
        for key, (kind, value) in sorted(entries.items()):
            if kind == "tensor":
                shape, dtype = value
                current = state.get(key)
                if not isinstance(current, torch.Tensor) or tuple(current.shape) != shape or current.dtype != dtype:
                    device = params[index].device if len(shape) else "cpu"
                    state[key] = current = torch.zeros(shape, dtype=dtype, device=device)
                handles.append(broadcast_async_(current, root_rank, name=f"optimizer_state.{index}.{key}"))
            else:
                state[key] = value
    for handle in handles:
        synchronize(handle)


def _state_layout(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Root's hyper-parameters and the shape of its state, without tensor data."""
    groups = [{k: v for k, v in group.items() if k != "params"} for group in state_dict["param_groups"]]
    state = {}
    for index, entries in state_dict["state"].items():
        state[index] = {
            key: ("tensor", (tuple(value.shape), value.dtype)) if isinstance(value, torch.Tensor)
            else ("value", value)
            for key, value in entries.items()
        }
    return {"groups": groups, "state": state}


def _initialize_state(optimizer: torch.optim.Optimizer) -> None:
    """Run one zero-gradient step so the optimizer creates its state, leaving parameters as they were.

    Parameters without a gradient keep the zero gradient afterwards, as in Horovod."""
    saved = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.requires_grad:
                saved.append((param, param.data.clone(), param.grad))
                param.grad = torch.zeros_like(param)
    step = getattr(optimizer, "_local_step", optimizer.step)
    step()
    with torch.no_grad():
        for param, data, grad in saved:
            param.data.copy_(data)
            if grad is not None:
                param.grad = grad
            else:
                param.grad.zero_()
