"""Which parameters ``DistributedOptimizer`` reduces, under which names, in which groups.

Checks what the caller passed (``named_parameters``, ``groups=``) with Horovod's error texts, and names
unnamed parameters the way Horovod does (``allreduce.noname.<group>.<index>``), so names match across
ranks and across the two projects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["default_names", "split_groups", "validate_named_parameters"]


def default_names(param_groups: Sequence[dict[str, Any]]) -> dict[torch.Tensor, str]:
    """Horovod's names for parameters given without ``named_parameters``."""
    return {param: f"allreduce.noname.{i}.{j}"
            for i, group in enumerate(param_groups) for j, param in enumerate(group["params"])}


def validate_named_parameters(named_parameters: Sequence[Any], params: list[torch.Tensor]) -> dict[Any, str]:
    """Each parameter's name from ``named_parameters``; raise ``ValueError`` on duplicates or missing names."""
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    names = [name for name, _ in named_parameters]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError("Parameter names in named_parameters must be unique. "
                         f"Found duplicates: {', '.join(map(str, duplicates))}")
    named_ids = {id(param) for _, param in named_parameters}
    unnamed = [id(param) for param in params if id(param) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         f"Python object ids: {', '.join(map(str, unnamed))}")
    by_id = {id(param): name for name, param in named_parameters}
    return {param: str(by_id[id(param)]) for param in params}


def split_groups(groups: int | Sequence[Sequence[torch.Tensor]] | None,
                 params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``groups=``: a number of equal groups of ``params``, or the caller's lists (tensors that are not
    trainable parameters here are ignored, as in Horovod); ``[]`` for none."""
    if groups is None or groups == 0:
        return []
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError("groups must be a positive number of groups or a list of parameter lists")
        per_group = -(-len(params) // groups)
        return [params[i:i + per_group] for i in range(0, len(params), per_group)]
    known = {id(p) for p in params}
    seen: set[int] = set()
    result = []
    for group in groups:
        members = []
        for param in group:
            if not isinstance(param, torch.Tensor):
                raise ValueError("groups must be a number of groups or a list of lists of parameters (tensors), "
                                 f"got a {type(param).__name__}")
            if id(param) in seen:
                raise ValueError("A parameter can only appear once in groups.")
            seen.add(id(param))
            if id(param) in known:
                members.append(param)
        if members:
            result.append(members)
    return result
