"""LeNet-5's configuration, as remote code (`auto_map` in config.json names this class)."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


class LeNetConfig(PretrainedConfig):
    model_type = "lenet"

    def __init__(
        self, num_channels: int = 1, image_size: int = 28, num_labels: int = 10, **kwargs: Any
    ) -> None:
        self.num_channels = num_channels
        self.image_size = image_size
        self.classes = num_labels
        super().__init__(**{"num_labels": num_labels, **kwargs})
