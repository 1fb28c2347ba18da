"""ModelWeights on a really sharded model, run under a real launcher by test_model_weights.py.

    accelerate launch --config_file deepspeed-zero2.yaml tests/sharding/model_weights_check.py

On every rank: shards a tiny GPT-2 with tied embeddings (DeepSpeed ZeRO-2, through
accelerate.prepare: its weights are gathered to rank 0; FSDP2's, tensor parallelism's and
ZeRO-3's are kept per block, and sharded_outer_state_check.py checks those), then checks what a sync round relies on. gather() returns the full
weights on rank 0; after load(new) the model computes exactly what an unsharded copy holding
`new` computes (so no stale copy of the old weights is left anywhere), gather() returns
`new`, and the optimizer still moves the live parameters. Prints `ok <rank>` and exits 0, or
ends with an AssertionError.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel

from hypha.accelerate_executor.entry import exit_without_teardown
from hypha.accelerate_executor.training.distributed import (
    ModelWeights,
    canonical_names,
    process_group_settings,
)


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)  # every rank and the reference build the same weights
    config = GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,  # the same forward twice
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def main() -> None:
    accelerator = Accelerator(kwargs_handlers=[process_group_settings()])  # the executor's
    reference = tiny_gpt2()
    model = tiny_gpt2()
    names = canonical_names(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    deepspeed = accelerator.state.deepspeed_plugin
    assert deepspeed is not None, "run this under a DeepSpeed accelerate config"
    deepspeed.deepspeed_config["train_micro_batch_size_per_gpu"] = 2
    model, optimizer = accelerator.prepare(model, optimizer)
    weights = ModelWeights(accelerator, model, names)
    is_main = accelerator.is_main_process
    unique = weights.names
    assert "lm_head.weight" not in unique, "the tied LM head travels once, as its embedding"

    gathered = weights.local()
    expected = reference.state_dict()
    if is_main:
        assert sorted(gathered) == sorted(unique)
        for name in unique:
            torch.testing.assert_close(gathered[name].float().cpu(), expected[name], msg=name)
    else:
        assert gathered == {}

    generator = torch.Generator().manual_seed(1)
    new = {name: expected[name] + 0.05 * torch.randn(expected[name].shape, generator=generator)
           for name in unique}  # fmt: skip
    weights.load(new if is_main else {})
    reference.load_state_dict({alias: new[canonical] for alias, canonical in names.items()})

    tokens = torch.randint(0, 64, (2, 8), generator=generator)
    with torch.no_grad():
        reference_logits = reference(tokens.to(reference.device)).logits
        logits = model(tokens.to(accelerator.device)).logits
    torch.testing.assert_close(logits.float().cpu(), reference_logits, msg="forward after load")
    reloaded = weights.local()
    for name in reloaded:
        torch.testing.assert_close(reloaded[name].float().cpu(), new[name], msg=name)

    loss = model(tokens.to(accelerator.device), labels=tokens.to(accelerator.device)).loss
    accelerator.backward(loss)
    optimizer.step()
    moved = weights.local()
    if is_main:
        assert any(not torch.equal(moved[name].float().cpu(), new[name]) for name in unique), (
            "an optimizer step after load changed nothing: it lost the live parameters"
        )
    accelerator.wait_for_everyone()
    print(f"ok {accelerator.process_index}", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown(0)  # the executor's way out of a process that ran collectives
