"""One micro-batched step: the loss in every form a model returns it, micro-batches giving the
whole batch's gradient, and the out-of-memory fallback."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from hypha.accelerate_executor.errors import NoLossError, OutOfMemory
from hypha.accelerate_executor.training.optimization import build_adamw
from hypha.accelerate_executor.training.settings import SettingValueError, micro_batch_size
from hypha.accelerate_executor.training.steps import loss_of
from tiny_models import LeNetish, adamw, batch, gradient_of_one_step, sgd, stepper


@pytest.mark.parametrize("form", ["object", "mapping", "tensor", "tuple"])
def test_every_output_form_trains(form: str) -> None:
    step = stepper(LeNetish(form), adamw)
    losses = [float(step(batch())) for _ in range(8)]
    assert losses[-1] < losses[0]


def test_a_model_without_a_loss_ends_in_one_line_naming_the_input_names() -> None:
    with pytest.raises(NoLossError) as raised:
        stepper(LeNetish("none"), adamw)(batch())
    message = str(raised.value)
    assert "input-names pixel_values, labels" in message and "\n" not in message
    with pytest.raises(NoLossError):
        loss_of((torch.ones(4, 10),), ["input_ids"])  # a tuple led by logits is no loss


@pytest.mark.parametrize("micro_batch_size", [1, 5, 6, 11])
def test_micro_batches_give_the_whole_batch_gradient(micro_batch_size: int) -> None:
    whole = gradient_of_one_step(LeNetish(), None)
    micro = gradient_of_one_step(LeNetish(), micro_batch_size)
    for a, b in zip(whole, micro, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_micro_batches_follow_the_same_loss_curve() -> None:
    whole, micro = stepper(LeNetish(), adamw), stepper(LeNetish(), adamw, micro_batch_size=5)
    curves = [[float(step(batch())) for _ in range(10)] for step in (whole, micro)]
    torch.testing.assert_close(curves[0], curves[1], rtol=1e-4, atol=1e-5)
    assert curves[0][-1] < 0.5 * curves[0][0]


def test_out_of_memory_halves_the_micro_batch_and_retries_the_step() -> None:
    said: list[str] = []
    model = LeNetish(oom_above=4)
    before = [p.detach().clone() for p in model.parameters()]
    step = stepper(model, sgd, said=said)
    step(batch())
    assert step.micro_batch_size == 3  # 12 -> 6 -> 3
    assert said == [
        "out of memory in micro-batches of 12 samples: running the step again in micro-batches of 6",
        "out of memory in micro-batches of 6 samples: running the step again in micro-batches of 3",
    ]
    moved = [b - p.detach() for b, p in zip(before, model.parameters(), strict=True)]
    for a, b in zip(gradient_of_one_step(LeNetish(), None), moved, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the failed tries left no trace


def test_out_of_memory_at_one_sample_is_one_clear_error() -> None:
    with pytest.raises(OutOfMemory, match="even in micro-batches of 1 sample"):
        stepper(LeNetish(oom_above=0), sgd)(batch())


def test_the_micro_batch_size_setting_is_a_number_or_auto() -> None:
    assert micro_batch_size("auto") is None and micro_batch_size("AUTO") is None
    assert micro_batch_size("64") == 64
    for bad in ("0", "-3", "1.5", "lots", ""):
        with pytest.raises(SettingValueError, match="a positive number of samples, or auto"):
            micro_batch_size(bad)


# What copies a tensor's value to the host: on a GPU, each waits for every queued kernel.
HOST_READS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__")


def executors_adamw(parameters: Any) -> torch.optim.Optimizer:
    return build_adamw(parameters, {"lr": 1e-2}, torch.device("cpu"))


@pytest.mark.parametrize("optimizer", [adamw, executors_adamw], ids=["default", "fused"])
def test_a_step_reads_nothing_back_from_the_device(
    monkeypatch: pytest.MonkeyPatch, optimizer: Callable[[Any], torch.optim.Optimizer]
) -> None:
    # The step's loss stays on the device (the round reads it once); any read per step would
    # stall a GPU's queue every step.
    step = stepper(LeNetish(), optimizer)
    step(batch())  # the first step sets up the optimizer's state
    fused = bool(step.optimizer.defaults["fused"])
    assert fused == (optimizer is executors_adamw)
    # Unfused, Adam's step counters are host tensors on every device (torch keeps them on the
    # CPU unless `capturable`): reading them costs a GPU nothing. Fused, they live with the
    # parameters, and no read of them is allowed either.
    counters = set() if fused else {id(state["step"]) for state in step.optimizer.state.values()}
    reads: list[str] = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any, _name: str = name, _f: Any = original) -> Any:
            if id(self) not in counters:
                reads.append(_name)
            return _f(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    losses = [step(batch()) for _ in range(3)]
    assert reads == []
    assert float(sum(losses)) > 0  # and the counting works: this read is seen
    assert reads == ["__float__"]
