"""Tensor parallelism through accelerate's ParallelismConfig, and what it asks of the rest.

An accelerate config's `parallelism_config` block (`parallelism_config_tp_size`,
`parallelism_config_dp_shard_size`, `parallelism_config_dp_replicate_size`) reaches every
rank as accelerate's PARALLELISM_CONFIG_* variables, and the Accelerator builds its device
mesh from them: ("dp_replicate", "dp_shard", "tp"), tensor parallel innermost. A model trains
tensor parallel only when transformers shards it at load, by the plan its model class ships
(`tp_plan="auto"` over the mesh's "tp" dimension): a model class without one is refused
before its weights are read. FSDP2 then shards over "dp_shard" what tensor parallelism left
whole (accelerate's `prepare`).

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


def tensor_parallel_mesh(accelerator: Accelerator) -> Any:
    """The device mesh's "tp" dimension, None when the layers are not split."""
    if tensor_parallel_size(accelerator) == 1:
        return None
    return accelerator.torch_device_mesh["tp"]


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
    if accelerator.distributed_type.value == "DEEPSPEED":
        raise TensorParallelRefused(
            "tensor parallelism (parallelism_config_tp_size "
            f"{config.tp_size}) does not run under DeepSpeed here; use tp.yaml or tp-fsdp.yaml"
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
