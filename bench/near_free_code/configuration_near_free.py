"""The near-free model's configuration, as remote code (`auto_map` in config.json)."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


class NearFreeConfig(PretrainedConfig):
    model_type = "near-free"

    def __init__(self, width: int = 4, vocab_size: int = 512, **kwargs: Any) -> None:
        self.width = width
        self.vocab_size = vocab_size
        super().__init__(**kwargs)
