"""The embedded tiny model and Markov data set: deterministic, well formed, learnable."""

from __future__ import annotations

import hashlib
import math

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hypha.standin.data_service.assets import (
    MODEL_FILENAMES,
    AssetSpec,
    chain_entropy,
    ensure_assets,
)


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_generation_is_deterministic_and_cached(tmp_path):
    spec = AssetSpec(slices=2, samples_per_slice=4, n_layer=1)
    first = ensure_assets(tmp_path / "a", spec)
    second = ensure_assets(tmp_path / "b", spec)
    for name in ("0.safetensors", "1.safetensors"):
        assert digest(first.dataset_dir / name) == digest(second.dataset_dir / name)
    assert digest(first.model_dir / "model.safetensors") == digest(
        second.model_dir / "model.safetensors"
    )
    # A second call finds the cache and writes nothing.
    before = (first.model_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_assets(tmp_path / "a", spec) == first
    assert (first.model_dir / "model.safetensors").stat().st_mtime_ns == before
    other_seed = ensure_assets(
        tmp_path / "a", AssetSpec(seed=1, slices=2, samples_per_slice=4, n_layer=1)
    )
    assert digest(other_seed.dataset_dir / "0.safetensors") != digest(
        first.dataset_dir / "0.safetensors"
    )


def test_layout_matches_the_job_reference(assets_dir):
    assets = ensure_assets(assets_dir)
    assert sorted(path.name for path in assets.model_dir.iterdir()) == sorted(MODEL_FILENAMES)
    assert (assets.model_dir / "model.safetensors").stat().st_size < 8 * 1024 * 1024
    slices = sorted(assets.dataset_dir.iterdir(), key=lambda path: int(path.stem))
    assert [path.name for path in slices] == [
        f"{index}.safetensors" for index in range(assets.spec.slices)
    ]
    tensors = load_file(slices[0])
    assert set(tensors) == {"input_ids", "labels"}
    for tensor in tensors.values():
        assert tensor.dtype == torch.int64
        assert tuple(tensor.shape) == (assets.spec.samples_per_slice, assets.spec.seq_len)
        assert int(tensor.min()) >= 0 and int(tensor.max()) < assets.spec.vocab_size


def test_a_few_steps_of_plain_training_lower_the_loss(assets_dir):
    assets = ensure_assets(assets_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for index in range(3):
        data = load_file(assets.dataset_dir / f"{index}.safetensors")
        for start in range(0, 64, 8):
            loss = model(**{name: tensor[start : start + 8] for name, tensor in data.items()}).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    # A random model starts near ln(vocab); 24 steps already learn much of the bigram table.
    assert abs(losses[0] - math.log(assets.spec.vocab_size)) < 0.5
    assert sum(losses[-4:]) / 4 < 0.8 * losses[0]
    assert chain_entropy(assets.spec) < 0.5 * losses[0]
