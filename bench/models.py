"""The GPT-2 shapes the benchmarks use, named by their size.

Vocabulary and sequence length match the local cluster's Markov data set, so the same
shapes can be trained on its slices. Parameter counts are what transformers builds
(tied embedding counted once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hypha.standin.data_service.assets import AssetSpec, build_model

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Shape:
    name: str
    n_embd: int
    n_layer: int
    n_head: int

    def asset_spec(self, **overrides: int) -> AssetSpec:
        """The local cluster's assets with this model (and its default Markov data)."""
        return AssetSpec(n_embd=self.n_embd, n_layer=self.n_layer, n_head=self.n_head, **overrides)

    def build(self, seed: int = 0) -> torch.nn.Module:
        model: torch.nn.Module = build_model(self.asset_spec(seed=seed))
        return model


_demo = AssetSpec()
DEMO = Shape("demo", _demo.n_embd, _demo.n_layer, _demo.n_head)
SMALL_1M = Shape("1M", n_embd=128, n_layer=5, n_head=4)
MEDIUM_10M = Shape("10M", n_embd=384, n_layer=6, n_head=6)
LARGE_32M = Shape("32M", n_embd=576, n_layer=8, n_head=9)
HUGE_100M = Shape("100M", n_embd=768, n_layer=14, n_head=12)
# For the smoke test: small enough that a sync round takes milliseconds.
MICRO = Shape("micro", n_embd=32, n_layer=1, n_head=2)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())
