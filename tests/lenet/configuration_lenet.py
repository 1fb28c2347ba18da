"""A LeNet-5 configuration, shipped as remote code as the Hypha scheduler's default model is."""

from transformers import PretrainedConfig


class LeNetConfig(PretrainedConfig):
    model_type = "lenet-test"

    def __init__(self, num_channels: int = 1, num_labels: int = 10, **kwargs: object) -> None:
        self.num_channels = num_channels
        super().__init__(num_labels=num_labels, **kwargs)
