"""The LeNet job's assets: the shape of the job a Hypha scheduler sends by default.

A LeNet-5 shipped as remote code (config.json with `auto_map`, configuration_lenet.py,
modeling_lenet.py, model.safetensors; random init, fixed seed), an image processor's
preprocessor_config.json, and MNIST-like slices as upstream's data docs prepare them:
`images` float32 [N, 1, 28, 28] (decoded to [0, 1]) and `labels` int64 [N]. Each class is
a fixed random glyph drawn at a random offset under noise: learnable, so the loss falls
within a few dozen steps.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from hypha.standin.data_service import lenet_code
from hypha.standin.data_service.assets import cache_key

REMOTE_CODE = ("configuration_lenet.py", "modeling_lenet.py")
AUTO_MAP = {
    "AutoConfig": "configuration_lenet.LeNetConfig",
    "AutoModelForImageClassification": "modeling_lenet.LeNetForImageClassification",
}
GLYPH = 20  # a glyph's side in pixels; the rest of the 28 is room to move it around
CLASSES = 10


@dataclass(frozen=True)
class LeNetSpec:
    seed: int = 0
    slices: int = 8
    samples_per_slice: int = 1000
    image_size: int = 28
    noise: float = 0.3

    model_repository: ClassVar[str] = "local/lenet"
    model_filenames: ClassVar[tuple[str, ...]] = ("config.json", "model.safetensors", *REMOTE_CODE)
    preprocessor_filenames: ClassVar[tuple[str, ...]] = ("preprocessor_config.json",)
    dataset_name: ClassVar[str] = "mnist-like"

    def cache_key(self) -> str:
        return cache_key("lenet-v1", asdict(self))

    def write_model(self, folder: Path) -> None:
        import torch
        from transformers.utils import logging as hf_logging

        from hypha.standin.data_service.lenet_code.configuration_lenet import LeNetConfig
        from hypha.standin.data_service.lenet_code.modeling_lenet import (
            LeNetForImageClassification,
        )

        hf_logging.disable_progress_bar()
        torch.manual_seed(self.seed)
        config = LeNetConfig(image_size=self.image_size, num_labels=CLASSES)
        LeNetForImageClassification(config).save_pretrained(folder)
        for name in REMOTE_CODE:
            shutil.copyfile(Path(lenet_code.__file__).with_name(name), folder / name)
        saved = json.loads((folder / "config.json").read_text())
        saved["auto_map"] = AUTO_MAP
        (folder / "config.json").write_text(json.dumps(saved, indent=2) + "\n")
        # Slices hold images in [0, 1]; the processor only normalises them.
        processor = {
            "image_processor_type": "ViTImageProcessor",
            "do_resize": False,
            "do_rescale": False,
            "do_normalize": True,
            "image_mean": [0.5],
            "image_std": [0.5],
        }
        (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")

    def write_dataset(self, folder: Path) -> None:
        import torch
        from safetensors.torch import save_file

        generator = torch.Generator().manual_seed(self.seed + 1)
        coarse = torch.rand(CLASSES, 1, 7, 7, generator=generator)
        glyphs = torch.nn.functional.interpolate(coarse, size=(GLYPH, GLYPH), mode="bilinear")
        glyphs = (glyphs > 0.55).float()
        room = self.image_size - GLYPH + 1
        folder.mkdir(parents=True)
        n = self.samples_per_slice
        for index in range(self.slices):
            labels = torch.randint(CLASSES, (n,), generator=generator)
            shifts = torch.randint(room, (n, 2), generator=generator).tolist()
            images = torch.zeros(n, 1, self.image_size, self.image_size)
            for sample, (dy, dx) in enumerate(shifts):
                images[sample, :, dy : dy + GLYPH, dx : dx + GLYPH] = glyphs[labels[sample]]
            images += self.noise * torch.randn(images.shape, generator=generator)
            save_file(
                {"images": images.clamp_(0, 1), "labels": labels},
                str(folder / f"{index}.safetensors"),
            )
