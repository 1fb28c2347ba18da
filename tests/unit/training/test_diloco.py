"""DiLoCo's outer step on one process: pseudo-gradients, merges, tied weights, optimizer state."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

from hypha.accelerate_executor.errors import ExecutorError, UpdateError
from hypha.accelerate_executor.training import diloco
from hypha.accelerate_executor.training.diloco import GlobalWeights
from hypha.accelerate_executor.training.distributed import ModelWeights, canonical_names


def tiny_tied_model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2, tie_word_embeddings=True
    )
    return GPT2LMHeadModel(config)


def one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ids = torch.randint(0, 64, (4, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def test_tied_weights_have_one_canonical_name() -> None:
    names = canonical_names(tiny_tied_model())
    assert names["lm_head.weight"] == "transformer.wte.weight"
    assert names["transformer.wte.weight"] == "transformer.wte.weight"


def test_round_trip_sends_delta_and_merges_in_place(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    model = tiny_tied_model()
    names = canonical_names(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    weights = ModelWeights(accelerator, model, names)
    start = {n: t.clone() for n, t in weights.local().items()}
    global_weights = GlobalWeights(weights.local())
    assert "lm_head.weight" not in global_weights.tensors  # tied: sent once

    one_step(model, optimizer)
    sent = tmp_path / "round-1.safetensors"
    global_weights.write_pseudo_gradient(weights.local(), sent)
    delta = load_file(sent)
    for name, tensor in weights.local().items():
        torch.testing.assert_close(delta[name], tensor - start[name])
        assert delta[name].dtype == torch.float32

    # The parameter server's update: here, half the pseudo-gradient.
    update = tmp_path / "update"
    save_file({name: tensor * 0.5 for name, tensor in delta.items()}, update)
    embedding = accelerator.unwrap_model(model).transformer.wte.weight
    state_before = optimizer.state[embedding]["exp_avg"].clone()
    assert global_weights.merge_update(update).held == len(delta)
    weights.load(global_weights.tensors)

    module = accelerator.unwrap_model(model)
    expected = start["transformer.wte.weight"] + 0.5 * delta["transformer.wte.weight"]
    torch.testing.assert_close(module.transformer.wte.weight.detach(), expected)
    assert module.lm_head.weight is module.transformer.wte.weight  # still tied, updated once
    assert module.transformer.wte.weight is embedding  # same Parameter: optimizer state stays
    torch.testing.assert_close(optimizer.state[embedding]["exp_avg"], state_before)
    one_step(model, optimizer)  # and training goes on with the carried-over moments


def test_bf16_pseudo_gradient_halves_the_bytes(tmp_path: Path) -> None:
    model = tiny_tied_model()
    weights = {n: t for n, t in model.state_dict().items() if n != "lm_head.weight"}
    global_weights = GlobalWeights(weights)
    fp32 = global_weights.write_pseudo_gradient(weights, tmp_path / "a", torch.float32)
    bf16 = global_weights.write_pseudo_gradient(weights, tmp_path / "b", torch.bfloat16)
    assert bf16 < 0.6 * fp32
    assert all(t.dtype == torch.bfloat16 for t in load_file(tmp_path / "b").values())


def test_update_that_does_not_fit_is_refused(tmp_path: Path) -> None:
    global_weights = GlobalWeights({"w": torch.zeros(3)})
    save_file({"w": torch.zeros(4)}, tmp_path / "shape")
    save_file({"other": torch.zeros(3)}, tmp_path / "name")
    with pytest.raises(UpdateError, match="shape"):
        global_weights.merge_update(tmp_path / "shape")
    with pytest.raises(UpdateError, match="lacks"):
        global_weights.merge_update(tmp_path / "name")


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 7 elements, so that every test tensor spans several, with a short last one."""
    monkeypatch.setattr(diloco, "CHUNK", 7)


def odd_tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {
        "scalar": torch.tensor(0.5),
        "empty": torch.zeros(0, 3),
        "matrix": torch.randn(5, 9, generator=generator),
        "vector": torch.randn(23, generator=generator),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.usefixtures("small_chunks")
def test_streamed_pseudo_gradient_is_a_standard_safetensors_file(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    start = odd_tensors()
    global_weights = GlobalWeights(start)
    local = {name: tensor * 3 + 1 for name, tensor in start.items()}
    size = global_weights.write_pseudo_gradient(local, tmp_path / "delta", dtype)
    assert size == (tmp_path / "delta").stat().st_size
    written = load_file(tmp_path / "delta")  # safetensors' own reader
    assert written.keys() == start.keys()
    for name, tensor in start.items():
        assert written[name].dtype == dtype
        torch.testing.assert_close(written[name], (local[name] - tensor).to(dtype))


@pytest.mark.usefixtures("small_chunks")
def test_streamed_merge_reads_what_safetensors_writes(tmp_path: Path) -> None:
    start = odd_tensors()
    global_weights = GlobalWeights(start)
    update = {name: torch.full_like(tensor, 0.25) for name, tensor in start.items()}
    update["vector"] = update["vector"].to(torch.bfloat16)  # dtypes may differ per tensor
    del update["scalar"]  # the parameter server may leave tensors out
    save_file(update, tmp_path / "update", metadata={"format": "pt"})
    assert global_weights.merge_update(tmp_path / "update").held == 3
    for name, tensor in start.items():
        expected = tensor if name == "scalar" else tensor + 0.25
        torch.testing.assert_close(global_weights.tensors[name], expected)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[:5], "too short"),
        (lambda data: b"\xff" * 8 + data[8:], "header length"),
        (lambda data: data[:8] + b"{" * (len(data) - 8), "not JSON"),
        (lambda data: data[:-3], "do not fit"),
        (lambda data: data.replace(b'"F32"', b'"F99"'), "dtype"),
        (lambda data: data.replace(b'"shape":[23]', b'"shape":[-1]'), "shape"),
    ],
)
def test_malformed_update_is_one_clear_error(
    tmp_path: Path, damage: Callable[[bytes], bytes], message: str
) -> None:
    global_weights = GlobalWeights({"vector": torch.zeros(23)})
    save_file({"vector": torch.ones(23)}, tmp_path / "good")
    (tmp_path / "bad").write_bytes(damage((tmp_path / "good").read_bytes()))
    with pytest.raises(ExecutorError, match=message) as caught:
        global_weights.merge_update(tmp_path / "bad")
    assert "\n" not in str(caught.value)


def batch_norm_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4))
    model.register_buffer("keep", torch.tensor([True, False, True]))  # a boolean buffer
    return model


def test_integer_and_boolean_tensors_keep_their_dtype_on_the_wire(tmp_path: Path) -> None:
    model = batch_norm_model()
    global_weights = GlobalWeights(model.state_dict())
    model(torch.rand(8, 1, 6, 6))  # training mode: running stats move, the counter counts
    model.get_buffer("keep").logical_not_()
    path = tmp_path / "pg.safetensors"
    global_weights.write_pseudo_gradient(model.state_dict(), path, torch.bfloat16)
    sent = load_file(path)
    assert sent["1.num_batches_tracked"].dtype == torch.int64
    assert sent["1.num_batches_tracked"].item() == 1
    assert sent["keep"].dtype == torch.bool and sent["keep"].all()  # changed: local XOR global
    assert sent["1.running_mean"].dtype == torch.bfloat16


def test_a_batch_norm_model_comes_out_of_a_round_in_the_dtypes_it_went_in(tmp_path: Path) -> None:
    """Through the stand-in's parameter server, which does what Hypha's (candle) does: the
    counter's update is zeros in int64, the boolean is left out (candle cannot load it) and
    keeps its global value, floating tensors get their update."""
    from hypha.standin.parameter_server.server import NesterovOuterOptimizer

    model = batch_norm_model()
    dtypes = {name: tensor.dtype for name, tensor in model.state_dict().items()}
    global_weights = GlobalWeights(model.state_dict())
    started = {name: tensor.clone() for name, tensor in global_weights.tensors.items()}
    model(torch.rand(8, 1, 6, 6))
    model.get_buffer("keep").logical_not_()
    files = []
    for worker in ("a", "b"):
        path = tmp_path / f"{worker}.safetensors"
        global_weights.write_pseudo_gradient(model.state_dict(), path)
        files.append(path.read_bytes())
    update, skipped = NesterovOuterOptimizer(learning_rate=0.7, momentum=0.9).step_files(files)
    assert skipped == ["keep (bool: Hypha's parameter server cannot load it)"]
    (tmp_path / "u.safetensors").write_bytes(update)
    received = load_file(tmp_path / "u.safetensors")
    assert received["1.num_batches_tracked"].dtype == torch.int64
    assert received["1.num_batches_tracked"].item() == 0
    assert global_weights.merge_update(tmp_path / "u.safetensors").held == len(dtypes) - 1
    model.load_state_dict(global_weights.tensors)
    assert {name: t.dtype for name, t in model.state_dict().items()} == dtypes
    assert torch.equal(model.get_buffer("keep"), started["keep"])
    assert model.get_buffer("1.num_batches_tracked").item() == 0
    assert not torch.equal(model.get_buffer("1.running_mean"), started["1.running_mean"])


def test_candle_s_integer_arithmetic_truncates_the_outer_step_s_scalars() -> None:
    from hypha.standin.parameter_server.server import NesterovOuterOptimizer

    counters = [{"n": torch.tensor([3], dtype=torch.int64)}]
    one_worker = NesterovOuterOptimizer(learning_rate=2.5, momentum=0.9)
    # One worker: mean 3 (1/1 is 1); m = g; u = trunc(2.5) * (trunc(0.9) * m + g) = 2 * 3.
    assert one_worker.step(counters)[0]["n"].tolist() == [6]
    two = NesterovOuterOptimizer(learning_rate=0.7, momentum=0.9).step(counters * 2)[0]["n"]
    assert two.dtype == torch.int64 and two.tolist() == [0]  # 1/2 truncates to 0
