"""The embedded models and data sets of the local cluster: nothing to download.

Each kind of job has its assets: a spec that writes a model folder and a data set of
safetensors slices (`AssetKind`). Here the masked-LM job's (MaskedLmSpec) and the causal-LM
job's: a tiny GPT-2 (random init, fixed seed) saved with `save_pretrained` into a model store,
and token sequences drawn from a fixed random sparse Markov chain, cut into safetensors
slices. The chain gives the data learnable structure: a model that learns its bigram
table drops from ln(vocab) to about the chain's entropy, so a falling loss is visible
within a few hundred CPU steps. Everything is generated on first use into a cache folder
keyed by the parameters, and is bit-identical for the same seed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    import torch
    from transformers import GPT2LMHeadModel

MODEL_REPOSITORY = "local/tiny-gpt2"
MODEL_FILENAMES = ("config.json", "model.safetensors", "generation_config.json")


class AssetKind(Protocol):
    """What `ensure_assets` needs of a job kind's assets."""

    @property
    def model_repository(self) -> str: ...

    @property
    def model_filenames(self) -> tuple[str, ...]: ...

    @property
    def preprocessor_filenames(self) -> tuple[str, ...]: ...

    @property
    def dataset_name(self) -> str: ...

    def cache_key(self) -> str: ...

    def write_model(self, folder: Path) -> None: ...

    def write_dataset(self, folder: Path) -> None: ...


@dataclass(frozen=True)
class AssetSpec:
    seed: int = 0
    vocab_size: int = 512
    seq_len: int = 64
    # Successors per token: fewer means a lower floor for the loss.
    branching: int = 4
    # Few enough that a demo run goes over the data set more than once: each worker then
    # gets its slices again and its bridge rewrites them in place, as on a real network.
    slices: int = 12
    samples_per_slice: int = 64
    n_embd: int = 128
    n_layer: int = 2
    n_head: int = 4

    model_repository: ClassVar[str] = MODEL_REPOSITORY
    model_filenames: ClassVar[tuple[str, ...]] = MODEL_FILENAMES
    preprocessor_filenames: ClassVar[tuple[str, ...]] = ()

    @property
    def dataset_name(self) -> str:
        return f"markov-{self.vocab_size}"

    def cache_key(self) -> str:
        return cache_key("v1", asdict(self))

    def write_model(self, folder: Path) -> None:
        _write_model(self, folder)

    def write_dataset(self, folder: Path) -> None:
        _write_dataset(self, folder)

    def chain(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The data's Markov chain: successors [vocab, branching], their probabilities."""
        return markov_chain(self)


def cache_key(version: str, fields: dict[str, object]) -> str:
    """A folder name that changes with a spec's fields and with `version`, which is bumped
    whenever generation changes, so that old caches are not reused."""
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return f"{version}-{digest[:16]}"


@dataclass(frozen=True)
class Assets:
    """Where the generated files lie: `models/<repository>/<file>` and `<dataset>/<i>.safetensors`."""

    spec: AssetKind
    models_dir: Path
    dataset_dir: Path

    @property
    def model_dir(self) -> Path:
        return self.models_dir / self.spec.model_repository


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hypha-accelerate" / "local-assets"


def ensure_assets(cache_dir: Path | None = None, spec: AssetKind | None = None) -> Assets:
    """Returns the assets for `spec` (default: the causal-LM job's), generating them into
    `cache_dir` the first time."""
    spec = spec or AssetSpec()
    root = (cache_dir or default_cache_dir()) / spec.cache_key()
    assets = Assets(spec, root / "models", root / "datasets" / spec.dataset_name)
    if root.is_dir():
        return assets
    root.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the final name and renamed into place, so a concurrent or interrupted
    # run never sees half a cache.
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root.parent))
    try:
        spec.write_model(staging / "models" / spec.model_repository)
        spec.write_dataset(staging / "datasets" / spec.dataset_name)
        staging.chmod(0o755)
        try:
            staging.rename(root)
        except OSError:
            if not root.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return assets


def markov_chain(spec: AssetSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The chain's successor table [vocab, branching] and its row probabilities."""
    import torch

    generator = torch.Generator().manual_seed(spec.seed)
    successors = torch.stack(
        [
            torch.randperm(spec.vocab_size, generator=generator)[: spec.branching]
            for _ in range(spec.vocab_size)
        ]
    )
    # Skewed rows (not uniform) so the floor sits well below ln(branching).
    logits = 1.5 * torch.randn(spec.vocab_size, spec.branching, generator=generator)
    return successors, torch.softmax(logits, dim=-1)


def chain_entropy(spec: AssetSpec) -> float:
    """The mean entropy (nats) of the next token: the loss a perfect model approaches."""
    _, probs = markov_chain(spec)
    return float(-(probs * probs.log()).sum(dim=-1).mean())


def build_model(spec: AssetSpec) -> GPT2LMHeadModel:
    """The spec's GPT-2, freshly initialised from its seed."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=spec.vocab_size,
        n_positions=spec.seq_len,
        n_embd=spec.n_embd,
        n_layer=spec.n_layer,
        n_head=spec.n_head,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(spec.seed)
    return GPT2LMHeadModel(config)


@dataclass(frozen=True)
class LlamaSpec(AssetSpec):
    """The causal-LM job with a tiny Llama instead of GPT-2, on the same data: a model class
    that ships a tensor-parallel plan (accelerate-configs/tp.yaml). Heads and widths divide
    by 4, so that up to 4 ranks can split every layer; the embedding and the head are tied
    off, as in Llama's own configs."""

    intermediate_size: int = 256
    n_kv_head: int = 4

    model_repository: ClassVar[str] = "local/tiny-llama"

    def cache_key(self) -> str:
        return cache_key("llama-v1", asdict(self))

    def write_model(self, folder: Path) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        config = LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.n_embd,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.n_layer,
            num_attention_heads=self.n_head,
            num_key_value_heads=self.n_kv_head,
            max_position_embeddings=self.seq_len,
            bos_token_id=0,
            eos_token_id=0,
        )
        torch.manual_seed(self.seed)
        LlamaForCausalLM(config).save_pretrained(folder)
        _check_written(folder, MODEL_FILENAMES)


def _write_model(spec: AssetSpec, folder: Path) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    build_model(spec).save_pretrained(folder)
    _check_written(folder, MODEL_FILENAMES)


def _write_dataset(spec: AssetSpec, folder: Path) -> None:
    import torch
    from safetensors.torch import save_file

    successors, probs = spec.chain()
    generator = torch.Generator().manual_seed(spec.seed + 1)
    folder.mkdir(parents=True)
    for index in range(spec.slices):
        tokens = torch.empty(spec.samples_per_slice, spec.seq_len, dtype=torch.int64)
        current = torch.randint(spec.vocab_size, (spec.samples_per_slice,), generator=generator)
        for position in range(spec.seq_len):
            tokens[:, position] = current
            choice = torch.multinomial(probs[current], 1, generator=generator).squeeze(1)
            current = successors[current, choice]
        # The model shifts labels itself, so labels are the inputs.
        save_file(
            {"input_ids": tokens, "labels": tokens.clone()}, str(folder / f"{index}.safetensors")
        )


# BERT's special tokens, ahead of the chain's tokens in the masked-LM job's vocabulary.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass(frozen=True)
class MaskedLmSpec:
    """The masked-LM job's assets: a tiny BERT shipped with its tokenizer (word-level, BERT's
    special tokens, then `words` words) and slices of `input_ids` and `attention_mask`
    without labels, as upstream's data docs prepare text: [CLS] words [SEP], every other row
    padded at its end. Each row draws its words from one topic of `topic_words` words, so a
    masked word follows from the others in its row: the loss falls from ln(vocabulary)
    towards ln(topic_words) within a demo's rounds."""

    seed: int = 0
    words: int = 64
    topic_words: int = 4
    seq_len: int = 32
    slices: int = 12
    samples_per_slice: int = 64
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    padded_tokens: int = 6

    model_repository: ClassVar[str] = "local/tiny-bert-mlm"
    model_filenames: ClassVar[tuple[str, ...]] = (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    )
    preprocessor_filenames: ClassVar[tuple[str, ...]] = ()

    @property
    def dataset_name(self) -> str:
        return f"topics-{self.words}-text"

    def cache_key(self) -> str:
        return cache_key("mlm-v1", asdict(self))

    def write_model(self, folder: Path) -> None:
        import torch
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel
        from tokenizers.pre_tokenizers import WhitespaceSplit
        from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

        words = [*SPECIAL_TOKENS, *(f"w{i}" for i in range(self.words))]
        backend = Tokenizer(WordLevel({word: i for i, word in enumerate(words)}, "[UNK]"))
        backend.pre_tokenizer = WhitespaceSplit()
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend,
            **{
                f"{role}_token": f"[{role.upper()}]"
                for role in ("pad", "unk", "cls", "sep", "mask")
            },
        )
        config = BertConfig(
            vocab_size=len(words),
            hidden_size=self.hidden_size,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            intermediate_size=4 * self.hidden_size,
            max_position_embeddings=self.seq_len,
            pad_token_id=0,
        )
        torch.manual_seed(self.seed)
        BertForMaskedLM(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        _check_written(folder, self.model_filenames)

    def write_dataset(self, folder: Path) -> None:
        import torch
        from safetensors.torch import save_file

        cls, sep = SPECIAL_TOKENS.index("[CLS]"), SPECIAL_TOKENS.index("[SEP]")
        generator = torch.Generator().manual_seed(self.seed + 1)
        topics = torch.randperm(self.words, generator=generator).view(-1, self.topic_words)
        folder.mkdir(parents=True)
        for index in range(self.slices):
            rows = self.samples_per_slice
            topic = torch.randint(len(topics), (rows,), generator=generator)
            pick = torch.randint(self.topic_words, (rows, self.seq_len), generator=generator)
            ids = len(SPECIAL_TOKENS) + topics[topic.unsqueeze(1), pick]
            mask = torch.ones_like(ids)
            mask[1::2, -self.padded_tokens :] = 0
            ids[:, 0] = cls
            ids[torch.arange(rows), mask.sum(1) - 1] = sep
            save_file(
                {"input_ids": ids * mask, "attention_mask": mask},
                str(folder / f"{index}.safetensors"),
            )


def _check_written(folder: Path, filenames: tuple[str, ...]) -> None:
    missing = [name for name in filenames if not (folder / name).is_file()]
    if missing:
        raise RuntimeError(f"save_pretrained did not write {', '.join(missing)}")
