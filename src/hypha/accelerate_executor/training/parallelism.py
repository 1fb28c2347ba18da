"""Tensor parallelism through accelerate's ParallelismConfig, and what it asks of the rest.

An accelerate config's `parallelism_config` block (`parallelism_config_tp_size`,
`parallelism_config_dp_shard_size`, `parallelism_config_dp_replicate_size`) reaches every
rank as accelerate's PARALLELISM_CONFIG_* variables, and the Accelerator reads them. With
tensor parallelism, transformers shards the model as it loads (its DistributedConfig of the
same sizes): every layer by the tensor-parallel plan its model class ships, then FSDP2 over
the dp_shard ranks (and HSDP's replicas), each rank reading only its part of the weights. A
model class without a plan is refused before its weights are read. accelerate's own
`prepare` of tensor parallelism under an FSDP config imports a transformers class that
transformers 5 removed, so that combination is refused too, naming tp-fsdp.yaml (a
MULTI_GPU config whose parallelism_config asks for both).

The ranks of one tensor-parallel group compute on the same samples: the worker's batch is
shared among the data-parallel ranks only (distributed.Ranks.data_index and data_count).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypha.accelerate_executor.errors import JobSpecError

if TYPE_CHECKING:
    from accelerate import Accelerator


class TensorParallelRefused(JobSpecError):
    """The accelerate config asks for tensor parallelism that this job cannot have."""


def tensor_parallel_size(accelerator: Accelerator) -> int:
    """How many ranks split each layer: the parallelism config's tp_size, 1 without one."""
    config = accelerator.parallelism_config
    return int(config.tp_size) if config is not None and config.tp_enabled else 1


# The oldest torch whose TP x FSDP2 layout was checked against whole tensors
# (tests/sharding/sharded_outer_state_check.py) and trained as DDP does
# (tests/system/test_tensor_parallel.py): 2.10, the cu128 image's, passed both (2026-12-04,
# `bash tests/run.sh --torch 2.10 tests/system/test_model_weights.py
# tests/system/test_tensor_parallel.py`, with this set to 2.10; CI's matrix runs 2.8 only).
# Under torch 2.8 the blocks of FSDP2's strided shards were not where their placements put
# them; 2.9, the rocm64 image's, failed those files on the same day, cause not found.
TWO_D_TORCH = (2, 10)


def two_dimensional_verified() -> bool:
    import torch

    release = torch.__version__.split("+")[0].split(".")
    return (int(release[0]), int(release[1])) >= TWO_D_TORCH


def sharded_loading(accelerator: Accelerator) -> Any:
    """transformers' DistributedConfig for loading the model split as the parallelism config
    asks (tensor parallel, then FSDP2 over dp_shard and dp_replicate); None when the layers
    are not split and the model loads whole."""
    config = accelerator.parallelism_config
    if tensor_parallel_size(accelerator) == 1 or config is None:
        return None
    from transformers.distributed.configuration_utils import DistributedConfig

    return DistributedConfig(
        tp_size=int(config.tp_size),
        fsdp_size=int(config.dp_shard_size or 1),
        dp_replicate_size=int(config.dp_replicate_size or 1),
    )


def check_parallelism(accelerator: Accelerator, model_folder: Path) -> None:
    """Refuses, in one line, a parallelism config this executor cannot train: context or
    sequence parallelism, tensor parallelism under DeepSpeed, or tensor parallelism for a
    model whose class ships no tensor-parallel plan."""
    config = accelerator.parallelism_config
    if config is None:
        return
    for name in ("cp", "sp"):
        if int(getattr(config, f"{name}_size") or 1) > 1:
            raise TensorParallelRefused(
                f"the accelerate config's parallelism_config_{name}_size is "
                f"{getattr(config, f'{name}_size')}: this executor does not split sequences; "
                "use tp.yaml, tp-fsdp.yaml or fsdp.yaml"
            )
    if not config.tp_enabled:
        return
    if accelerator.distributed_type.value in ("DEEPSPEED", "FSDP"):
        raise TensorParallelRefused(
            f"tensor parallelism (parallelism_config_tp_size {config.tp_size}) does not run "
            f"under a {accelerator.distributed_type.value} accelerate config here; use tp.yaml, "
            "or tp-fsdp.yaml for FSDP2 beside it (distributed_type MULTI_GPU: the model is "
            "sharded both ways as it loads)"
        )
    beside = int(config.dp_shard_size or 1) * int(config.dp_replicate_size or 1)
    if beside > 1 and not two_dimensional_verified():
        import torch

        raise TensorParallelRefused(
            f"tensor parallelism with FSDP2 beside it needs torch {'.'.join(map(str, TWO_D_TORCH))} "
            f"or later here (this is {torch.__version__}, whose strided shards did not hold the "
            "weights where their placements say); use tp.yaml or fsdp.yaml"
        )
    architecture, plan = _model_plan(model_folder)
    if not plan:
        raise TensorParallelRefused(
            f"tensor parallelism (parallelism_config_tp_size {config.tp_size}) needs a model "
            f"class with a tensor-parallel plan, and {architecture} has none; shard it with "
            "fsdp.yaml (FSDP2) or deepspeed-zero3.yaml instead"
        )


def _model_plan(model_folder: Path) -> tuple[str, dict[str, str] | None]:
    """The model's class name (as its config.json names it) and the plan transformers would
    shard it by: its config class's `base_model_tp_plan`. A model that ships its own code has
    no plan transformers knows of."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        data = json.loads((model_folder / "config.json").read_text())
    except (OSError, ValueError):
        return "the model", None
    architecture = ", ".join(data.get("architectures") or []) or str(data.get("model_type"))
    if "auto_map" in data:
        return architecture, None
    model_type = str(data.get("model_type", ""))
    # The lazy mapping has no working .get: it loads a class on indexing only.
    config_class = CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None  # noqa: SIM401
    plan = getattr(config_class, "base_model_tp_plan", None)
    return architecture, plan or None
