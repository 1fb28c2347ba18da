"""A causal-LM job's model whose step costs almost nothing: `width` weights fitted to
predict each sequence's first label from its first `width` tokens. What an executor does
around a step shows in full when the step itself is free."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_near_free import NearFreeConfig


class NearFreeForCausalLM(PreTrainedModel):
    config_class = NearFreeConfig
    main_input_name = "input_ids"

    def __init__(self, config: NearFreeConfig) -> None:
        super().__init__(config)
        self.weight = nn.Parameter(torch.zeros(config.width))
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        pass  # zeros, as built

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **_: Any
    ) -> CausalLMOutput:
        scale = 1.0 / self.config.vocab_size
        prediction = (input_ids[:, : self.config.width] * scale) @ self.weight
        loss = None
        if labels is not None:
            loss = nn.functional.mse_loss(prediction, labels[:, 0] * scale)
        return CausalLMOutput(loss=loss, logits=prediction)
