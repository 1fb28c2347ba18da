"""A bundled accelerate config made to run on the CPU in fp32, as the sharded tests run it."""

from pathlib import Path

from repo_paths import REPO


def cpu_config(name: str, folder: Path) -> Path:
    """accelerate-configs/NAME.yaml in `folder`, on the CPU and in fp32: what only a GPU would
    change left as shipped."""
    text = (REPO / "accelerate-configs" / f"{name}.yaml").read_text()
    path = folder / f"{name}.yaml"
    path.write_text(
        text.replace("use_cpu: false", "use_cpu: true").replace(
            "mixed_precision: bf16", "mixed_precision: 'no'"
        )
    )
    return path
