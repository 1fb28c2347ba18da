"""DiLoCo's outer state on a really sharded model, run under a real launcher by
test_sharded_outer_state.py.

    accelerate launch --config_file C tests/sharding/sharded_outer_state_check.py KIND FOLDER

KIND: fsdp2 (a tiny Llama sharded by hand with fully_shard over every rank), tp (loaded as
the executor loads it under the config's parallelism_config: tensor parallel, and FSDP2
beside it where the config asks), or zero3 (accelerate.prepare under a ZeRO-3 config: each
rank's blocks are its partitions). FOLDER: a scratch folder every rank sees.

On every rank: theta_global is taken per block (ModelWeights.local, shares), and the files a
sync round writes and reads are checked against whole tensors, which only this check
assembles (DTensor.full_tensor): the model file holds the reference weights; after an update
file is merged and loaded the model computes what an unsharded copy holding theta + u
computes; the digest is the one a single process computes; the pseudo-gradient file after
an optimizer step is theta_local - theta_global, whole. Prints `ok <rank> <fraction>`, the
fraction of the parameters' elements rank 0 holds, and exits 0, or ends with an
AssertionError.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lift_gpu_gates  # noqa: F401  (as on GPUs: FSDP and parallelism configs on the CPU)
import torch
from accelerate import Accelerator
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from hypha.accelerate_executor.entry import exit_without_teardown
from hypha.accelerate_executor.training.diloco import GlobalWeights
from hypha.accelerate_executor.training.distributed import (
    ModelWeights,
    Ranks,
    canonical_names,
    process_group_settings,
)
from hypha.accelerate_executor.training.modeling import load_model
from hypha.accelerate_executor.training.parallelism import sharded_loading


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)  # every rank and the reference build the same weights
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def full(model: torch.nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    """Every named tensor whole, on every rank (a collective): the check's reference only."""
    from torch.distributed.tensor import DTensor

    parameters = dict(model.named_parameters())
    if any(hasattr(parameter, "ds_tensor") for parameter in parameters.values()):
        from deepspeed.utils import safe_get_full_fp32_param

        return {name: safe_get_full_fp32_param(parameters[name]).float().clone() for name in names}
    state = model.state_dict()
    return {
        name: (state[name].full_tensor() if isinstance(state[name], DTensor) else state[name])
        .detach()
        .float()
        .clone()
        for name in names
    }


def main(kind: str, folder: Path) -> None:
    accelerator = Accelerator(kwargs_handlers=[process_group_settings()])  # the executor's
    ranks = Ranks(accelerator)
    reference = tiny_llama()
    if ranks.is_main:
        reference.save_pretrained(folder / "model")
    ranks.barrier()
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        model = tiny_llama()
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    elif kind == "tp":
        model = load_model("causal-lm", folder / "model", split=sharded_loading(accelerator))
    if kind == "zero3":
        deepspeed = accelerator.state.deepspeed_plugin
        assert deepspeed is not None, "run zero3 under a DeepSpeed accelerate config"
        deepspeed.deepspeed_config["train_micro_batch_size_per_gpu"] = 2
        model = tiny_llama()
        model, optimizer = accelerator.prepare(
            model, torch.optim.AdamW(model.parameters(), lr=1e-2)
        )
        model = accelerator.unwrap_model(model)
        engine = accelerator._models[0]
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    names = canonical_names(model)
    weights = ModelWeights(accelerator, model, names, ranks)
    assert weights.sharded and weights.shares is not None
    unique = weights.names

    # What rank 0 holds: about 1/N of what is sharded.
    held = sum(share.numel for share in weights.shares.values())
    total = sum(share.full_numel for share in weights.shares.values())
    fraction = ranks.share(held / total)

    global_weights = GlobalWeights(weights.local(), weights.shares, ranks)
    assert all(
        tuple(global_weights.tensors[name].shape) == weights.shares[name].shape for name in unique
    ), "theta_global is this rank's blocks, not whole tensors"
    expected = reference.state_dict()
    global_weights.write_model(folder / "model-0.safetensors")
    if ranks.is_main:
        written = load_file(folder / "model-0.safetensors")
        assert sorted(written) == sorted(unique)
        for name in unique:
            torch.testing.assert_close(written[name], expected[name], msg=name)

    # An update, merged block by block and loaded: the model is the reference's theta + u.
    generator = torch.Generator().manual_seed(1)
    update = {name: 0.05 * torch.randn(expected[name].shape, generator=generator)
              for name in unique}  # fmt: skip
    if ranks.is_main:
        save_file(update, folder / "update.safetensors")
    ranks.barrier()
    global_weights.merge_update(folder / "update.safetensors")
    weights.load(global_weights.tensors)
    moved = {name: expected[name] + update[name] for name in unique}
    reference.load_state_dict({alias: moved[canonical] for alias, canonical in names.items()})
    tokens = torch.randint(0, 64, (2, 8), generator=generator)
    with torch.no_grad():
        logits = model(tokens).logits
        reference_logits = reference(tokens).logits
    torch.testing.assert_close(logits.float(), reference_logits, msg="forward after load")
    digest = global_weights.digest()  # a collective
    assert digest == GlobalWeights(moved).digest(), "the digest depends on the sharding"

    # The pseudo-gradient after a step: theta_local - theta_global, whole, in the file.
    if kind == "zero3":
        engine.backward(engine(tokens, labels=tokens).loss)
        engine.step()
    else:
        model(tokens, labels=tokens).loss.backward()
        optimizer.step()
    global_weights.write_pseudo_gradient(
        weights.local(), folder / "pseudo-gradient.safetensors", torch.float32
    )
    local = full(model, unique)
    if ranks.is_main:
        sent = load_file(folder / "pseudo-gradient.safetensors")
        assert sorted(sent) == sorted(unique)
        for name in unique:
            torch.testing.assert_close(sent[name], local[name] - moved[name], msg=name)
        assert any(sent[name].abs().max() > 0 for name in unique), "the step moved nothing"
    ranks.barrier()
    print(f"ok {ranks.index} {fraction:.3f}", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
    exit_without_teardown(0)  # the executor's way out of a process that ran collectives
