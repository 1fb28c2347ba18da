"""LeNet-5 for 28x28 images; forward returns the bare loss when given labels, as upstream's
executor accepts (`outputs if isinstance(outputs, torch.Tensor) else outputs["loss"]`)."""

import torch
from transformers import PreTrainedModel

from .configuration_lenet import LeNetConfig


class LeNetForImageClassification(PreTrainedModel):
    config_class = LeNetConfig
    main_input_name = "pixel_values"

    def __init__(self, config: LeNetConfig) -> None:
        super().__init__(config)
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(config.num_channels, 6, 5, padding=2),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(6, 16, 5),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
        )
        self.classifier = torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(16 * 5 * 5, 120),
            torch.nn.ReLU(),
            torch.nn.Linear(120, 84),
            torch.nn.ReLU(),
            torch.nn.Linear(84, config.num_labels),
        )
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        pass  # torch's own initialisation: transformers' std 0.02 would start LeNet too slowly

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None):
        logits = self.classifier(self.features(pixel_values))
        if labels is None:
            return logits
        return torch.nn.functional.cross_entropy(logits, labels)
