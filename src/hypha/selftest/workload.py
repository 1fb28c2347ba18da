"""What `selftest` trains: a GPT-2 of a chosen size, built from its config (random weights,
nothing downloaded), on Markov-chain text written by the local stand-in's asset code."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from hypha.standin.data_service.assets import AssetSpec, cache_key

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ModelSize:
    name: str
    n_embd: int
    n_layer: int
    n_head: int
    vocab_size: int
    seq_len: int
    batch_size: int  # samples per optimizer step, over all processes
    steps_per_round: int
    learning_rate: float

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def flops_per_token(self, parameters: int) -> float:
        """Training FLOPs per token: 6 per weight (forward, and backward's two products)
        and attention's score and value products, 12·layers·width·context (the PaLM paper's
        appendix B). `parameters` excludes the position embeddings, which are looked up,
        not multiplied."""
        return 6.0 * parameters + 12.0 * self.n_layer * self.n_embd * self.seq_len


SIZES: dict[str, ModelSize] = {
    size.name: size
    for size in (
        # The local demo's model: seconds on a CPU.
        ModelSize("tiny", 128, 2, 4, 512, 64, 8, 10, 2e-3),
        ModelSize("small", 384, 6, 6, 8192, 256, 16, 20, 1e-3),
        # GPT-2 small's shape, with its vocabulary and context.
        ModelSize("gpt2-124m", 768, 12, 12, 50257, 1024, 16, 30, 6e-4),
    )
}


@dataclass(frozen=True)
class SelftestSpec(AssetSpec):
    """The stand-in's assets for a selftest size, on a Markov chain whose successors are
    drawn with replacement and equally likely: the demo's chain (a permutation drawn per
    token) takes a minute to draw at GPT-2's vocabulary."""

    slices: int = 4

    @classmethod
    def of(cls, size: ModelSize) -> SelftestSpec:
        return cls(
            vocab_size=size.vocab_size,
            seq_len=size.seq_len,
            n_embd=size.n_embd,
            n_layer=size.n_layer,
            n_head=size.n_head,
        )

    @property
    def dataset_name(self) -> str:
        return f"selftest-markov-{self.vocab_size}"

    def cache_key(self) -> str:
        return cache_key("selftest-v1", asdict(self))

    def chain(self) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        generator = torch.Generator().manual_seed(self.seed)
        successors = torch.randint(
            self.vocab_size, (self.vocab_size, self.branching), generator=generator
        )
        return successors, torch.full((self.vocab_size, self.branching), 1 / self.branching)
