"""The trained model's Hugging Face folder (training/model_export.py): save_pretrained's files
for theta_global, not the live model's weights, with the artifact's tokenizer files beside
them and its old weights left out."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hypha.accelerate_executor.training.distributed import canonical_names
from hypha.accelerate_executor.training.model_export import write_hf_folder
from hypha.standin.data_service.assets import AssetSpec, build_model


def test_the_folder_is_save_pretrained_of_the_global_weights_with_the_tokenizer(
    tmp_path: Path,
) -> None:
    model = build_model(AssetSpec())
    artifacts = tmp_path / "artifacts"
    model.save_pretrained(artifacts)  # what the bridge fetched: config and weights
    (artifacts / "tokenizer.json").write_text('{"version": "1.0"}\n')
    (artifacts / "vocab.txt").write_text("a\nb\n")
    (artifacts / "pytorch_model.bin").write_bytes(b"old weights")
    aliases = canonical_names(model)
    # theta_global differs from the live model (which may have trained on since).
    global_weights = {
        name: tensor.detach().clone() + 1.0
        for name, tensor in model.state_dict().items()
        if aliases[name] == name
    }
    destination = tmp_path / "kept"
    destination.mkdir()
    (destination / "README.md").write_text("the operator's own file\n")

    written = write_hf_folder(model, global_weights, aliases, artifacts, destination)

    assert written == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "vocab.txt"
    ]  # fmt: skip
    assert (destination / "README.md").read_text() == "the operator's own file\n"
    assert not list(destination.glob(".writing-*"))
    reference = build_model(AssetSpec())
    reference.load_state_dict(global_weights, strict=False)
    reference.tie_weights()  # the head is the embedding: one tensor, saved once
    reference.save_pretrained(tmp_path / "reference")
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        assert (destination / name).read_bytes() == (tmp_path / "reference" / name).read_bytes()
    assert (destination / "tokenizer.json").read_text() == '{"version": "1.0"}\n'
    # The live model was not touched: it is not what was written.
    assert not torch.equal(
        model.state_dict()["transformer.wte.weight"], global_weights["transformer.wte.weight"]
    )


def test_a_model_dir_the_executor_cannot_make_is_refused_before_training(tmp_path: Path) -> None:
    from hypha.accelerate_executor.errors import UsageError
    from hypha.accelerate_executor.training.main import parse_arguments

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    argv = ["--socket", "s", "--work-dir", str(tmp_path), "--job", "{}"]
    with pytest.raises(UsageError, match=r"model dir .*a-file/models"):
        parse_arguments([*argv, "--model-dir", str(a_file / "models")])
    made = tmp_path / "kept" / "models"
    assert parse_arguments([*argv, "--model-dir", str(made)]).model_dir == made
    assert made.is_dir()
