"""Every way the trained model leaves the executor, in one place: theta_global written as a
Hugging Face folder (model_export.py), kept in the operator's model dir at the job's end,
pushed to a Hub repository (hub_push.py), or sent to a peer as one safetensors file (a late
joiner's start). Where the model is sharded every rank writes its part of the weights file
(diloco.py); rank 0 writes the rest and sends; the other ranks wait for it where they must.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from hypha.accelerate_executor.training.diloco import GlobalWeights
    from hypha.accelerate_executor.training.distributed import ModelWeights, Ranks

EXPORT_DIR = "model"  # the work dir's Hugging Face folder that push-to-hub uploads
EXPORT_WEIGHTS = "model.safetensors"  # the weights' file in it, where the ranks write them


class ModelOutput:
    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        weights: ModelWeights,
        global_weights: GlobalWeights,
        ranks: Ranks,
        work_dir: Path,
        model_dir: Path | None,
        say: Callable[[str], None],
    ) -> None:
        self.accelerator = accelerator
        self.model = model
        self.weights = weights
        self.global_weights = global_weights
        self.ranks = ranks
        self.work_dir = work_dir
        self.model_dir = model_dir  # where the final model is kept at the end, if anywhere
        self.say = say
        self.models_sent = 0

    def write(self, folder: Path) -> None:
        """theta_global as a Hugging Face folder: rank 0 writes it, every rank its part of the
        weights where the model is sharded; every rank waits for it."""
        from hypha.accelerate_executor.errors import ModelExportError
        from hypha.accelerate_executor.training.model_export import write_hf_folder

        weights_file = None
        if self.weights.sharded:  # save_pretrained would need the whole model on rank 0
            weights_file = folder / f".{EXPORT_WEIGHTS}.partial"
            try:
                self.global_weights.write_model(weights_file)
            except OSError as exc:
                raise ModelExportError(
                    f"writing the model to {folder} failed: {exc.strerror or exc}"
                ) from None
        try:
            if self.ranks.is_main:
                files = write_hf_folder(
                    self.accelerator.unwrap_model(self.model),
                    {} if weights_file else self.global_weights.tensors,
                    self.weights.aliases,
                    self.work_dir / "artifacts",
                    folder,
                    weights_file,
                )
                self.say(f"wrote the model to {folder}: {', '.join(files)}")
        finally:
            self.ranks.barrier()  # the other ranks wait for rank 0 whatever came of it

    def keep(self, job_id: str) -> None:
        """At the job's end: the final model into the operator's model dir, if one is set, in
        a folder named after the job (one job's model never overwrites another's), so that
        nothing trained is lost when the job has no destination."""
        if self.model_dir is not None:
            self.write(self.model_dir / job_id)

    def push(self, repository: str, token: str) -> str | None:
        """The final model written into the work dir's EXPORT_DIR, then uploaded by rank 0 to
        `repository`: the commit's URL there, None on the other ranks. Raises
        ExecutorError (PushError, ModelExportError) with one line when it failed."""
        from hypha.accelerate_executor.training.hub_push import push

        folder = self.work_dir / EXPORT_DIR
        self.write(folder)
        return push(folder, repository, token) if self.ranks.is_main else None

    def send(self, send_file: Callable[[str], None] | None) -> None:
        """Every rank: a copy of theta_global for a late joiner, a file of its own in the work
        dir, handed on rank 0 to `send_file` (its path relative to the work dir; None on the
        other ranks), which sends it and has the bridge delete it; raising as the send does
        when it did not go."""
        relative = f"models/model-{self.models_sent}.safetensors"
        self.models_sent += 1
        self.global_weights.write_model(self.work_dir / relative)
        if send_file is not None:
            send_file(relative)
