"""The accelerate config for `--accelerate-config`: the bundled ones, `auto`'s choice, a
file read and checked."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypha.accelerate_executor.errors import LaunchError
from hypha.accelerate_executor.platform.launcher.discovery import gpu_image_without_gpus
from hypha.accelerate_executor.platform.variants import BY_NAME


def configs_dir(env: Mapping[str, str]) -> Path:
    """The bundled accelerate configs: the image sets HYPHA_ACCELERATE_CONFIGS; a source
    checkout has them at its root."""
    given = env.get("HYPHA_ACCELERATE_CONFIGS")
    return Path(given) if given else Path(__file__).resolve().parents[5] / "accelerate-configs"


def resolve_config(
    requested: str, variant: str, gpus: int, num_processes: int | None, directory: Path
) -> tuple[Path, str]:
    """The config file for `--accelerate-config` (bundled ones in `directory`) and a note on
    how it was chosen."""
    if requested != "auto":
        path = Path(requested)
        if "/" not in requested and not requested.endswith((".yaml", ".yml")):
            path = directory / f"{requested}.yaml"
            if not path.is_file():
                names = sorted(p.stem for p in directory.glob("*.yaml"))
                raise LaunchError(
                    f"no accelerate config named {requested!r}; bundled: {', '.join(names) or 'none'} "
                    "(or pass a path to a YAML file)"
                )
        elif not path.is_file():
            raise LaunchError(f"accelerate config {requested} does not exist")
        return path, "given"
    if BY_NAME[variant].accelerator == "mps":
        name = "mps"
    elif variant == "cpu" or gpus == 0:
        name = "multi-cpu" if (num_processes or 1) > 1 else "cpu"
        if gpu_image_without_gpus(variant, gpus):
            # main says this on stdout: a GPU image without GPUs usually lacks a runtime flag.
            runtime = (
                "--gpus all"
                if BY_NAME[variant].accelerator == "nvidia"
                else "--device /dev/kfd --device /dev/dri"
            )
            return directory / f"{name}.yaml", (
                f"auto: the {variant} image sees no GPU, so it trains on the CPU "
                f"(run the container with {runtime} for the GPU)"
            )
    else:
        name = "gpu" if (num_processes or gpus) == 1 else "multi-gpu"
    return directory / f"{name}.yaml", f"auto: variant {variant}, {gpus} GPU(s) visible"


def read_config(path: Path) -> dict[str, Any]:
    import yaml  # type: ignore[import-untyped]  # no stubs in the dev env

    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise LaunchError(f"cannot read accelerate config {path}: {reason}") from None
    if not isinstance(loaded, dict) or "distributed_type" not in loaded:
        raise LaunchError(f"accelerate config {path} is not a mapping with a distributed_type")
    return loaded
