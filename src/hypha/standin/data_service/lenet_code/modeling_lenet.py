"""LeNet-5 for image classification, as remote code (`auto_map` in config.json)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import ImageClassifierOutput

from .configuration_lenet import LeNetConfig


class LeNetForImageClassification(PreTrainedModel):
    config_class = LeNetConfig
    main_input_name = "pixel_values"

    def __init__(self, config: LeNetConfig) -> None:
        super().__init__(config)
        side = (config.image_size // 2 - 4) // 2  # two 2x2 pools around a 5x5 valid conv
        self.features = nn.Sequential(
            nn.Conv2d(config.num_channels, 6, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * side * side, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, config.classes),
        )
        self.post_init()

    def forward(
        self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None, **_: Any
    ) -> ImageClassifierOutput:
        logits = self.classifier(self.features(pixel_values))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return ImageClassifierOutput(loss=loss, logits=logits)
