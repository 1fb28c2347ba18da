"""HYPHA_GRADIENT_CHECKPOINTING: transformers' gradient checkpointing trains a causal LM to the
same losses as keeping the activations does, and a model without it is refused in one line."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from accelerate import Accelerator

from hypha.accelerate_executor.errors import EXIT_USAGE, NoGradientCheckpointing
from hypha.accelerate_executor.training.distributed import Ranks
from hypha.accelerate_executor.training.modeling import (
    checkpoint_activations,
    checkpointed_blocks,
)
from hypha.accelerate_executor.training.settings import from_environment
from hypha.accelerate_executor.training.steps import MicroBatchedStep
from tiny_models import LeNetish

BATCH, LENGTH, VOCABULARY = 4, 16, 64


def tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCABULARY, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=LENGTH,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def losses_of_four_steps(
    checkpointed: bool, micro_batch_size: int | None
) -> tuple[list[float], int]:
    """The steps' losses, and how many times the first block's MLP ran forward."""
    model = tiny_llama()
    mlp, runs = model.model.layers[0].mlp, [0]
    forward = mlp.forward

    def counted(*args: Any) -> Any:  # not a forward hook: the recompute runs without them
        runs[0] += 1
        return forward(*args)

    mlp.forward = counted
    line = checkpoint_activations(model, asked=checkpointed, by_fsdp=False)
    assert (line is not None) == checkpointed
    accelerator = Accelerator(cpu=True)
    prepared, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    prepared.train()
    step = MicroBatchedStep(
        accelerator, prepared, optimizer, Ranks(accelerator), BATCH, ["input_ids"],
        micro_batch_size, lambda _: None,
    )  # fmt: skip
    tokens = torch.randint(
        0, VOCABULARY, (BATCH, LENGTH), generator=torch.Generator().manual_seed(1)
    )
    losses = [float(step({"input_ids": tokens, "labels": tokens.clone()})) for _ in range(4)]
    return losses, runs[0]


@pytest.mark.parametrize("micro_batch_size", [None, 2])
def test_checkpointed_steps_give_the_same_losses(micro_batch_size: int | None) -> None:
    kept, forwards = losses_of_four_steps(False, micro_batch_size)
    recomputed, forwards_checkpointed = losses_of_four_steps(True, micro_batch_size)
    assert recomputed == pytest.approx(kept, abs=1e-5)
    assert forwards_checkpointed == 2 * forwards  # each block ran again in the backward
    assert kept[-1] < kept[0]  # it trained


def test_the_setting_turns_transformers_checkpointing_on() -> None:
    assert from_environment({})["gradient_checkpointing"] is False
    assert from_environment({"HYPHA_GRADIENT_CHECKPOINTING": "1"})["gradient_checkpointing"]
    model = tiny_llama()
    assert checkpointed_blocks(model) == 0
    checkpoint_activations(model, asked=True, by_fsdp=False)
    assert checkpointed_blocks(model) == 2  # the two decoder layers, not the model itself


def test_a_model_without_gradient_checkpointing_is_refused_by_its_class() -> None:
    with pytest.raises(NoGradientCheckpointing, match="on, and LeNetish has no gradient") as e:
        checkpoint_activations(LeNetish(), asked=True, by_fsdp=False)
    assert e.value.exit_code == EXIT_USAGE
    assert checkpoint_activations(LeNetish(), asked=False, by_fsdp=False) is None


def test_accelerates_fsdp_checkpointing_is_not_repeated() -> None:
    model = tiny_llama()
    line = checkpoint_activations(model, asked=True, by_fsdp=True)
    assert line is not None and "accelerate's FSDP" in line
    assert checkpointed_blocks(model) == 0  # accelerate wraps them as it prepares the model
