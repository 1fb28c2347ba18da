"""alpha.17's job spec (docs/protocol.md): a train config that carries `updates` and `results`,
data slices named `{dataset, index}`, and two executor classes. Read exactly as alpha.17's Rust
side reads it; the types both generations share are protocol/job.py's.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from hypha.accelerate_executor.protocol.job import (
    AggregateOptimizer,
    BatchSize,
    Descriptor,
    HuggingFaceReference,
    InputNames,
    JobModel,
    LrScheduler,
    OptimizerSpec,
    PeerId,
    PreprocessorTask,
    SchedulerReference,
    Strategy,
    TrainableTask,
    UriReference,
    job_bytes,
    read_job,
)
from hypha.accelerate_executor.protocol.serde import UUID, Integer, TryFrom, struct, tagged


class DatasetSlice(JobModel):
    dataset: str
    index: Annotated[int, Integer("u64")]


class PeersReference(JobModel):
    type: Literal["peers"]
    peers: list[PeerId]
    strategy: Annotated[Strategy, tagged(Strategy)]
    resource: DatasetSlice | None = None


# Upstream's Reference in its variant order, which serde also takes a tag's index in.
REFERENCE = tagged(UriReference, HuggingFaceReference, PeersReference, SchedulerReference)
Reference = Annotated[
    UriReference | HuggingFaceReference | PeersReference | SchedulerReference,
    Field(discriminator="type"),
]


def _send_problem(reference: dict[str, Any]) -> str | None:
    return None if reference["type"] == "peers" else "Send can only be created from Peers"


def _receive_problem(reference: dict[str, Any]) -> str | None:
    if reference["type"] != "peers":
        return "Receive can only be created from Peers"
    return None if reference["strategy"]["type"] == "All" else "Receive requires strategy All"


# serde reads every Reference; the bridge fetches uri, huggingface and scheduler references
# only, and a model comes from the first two.
ArtifactReference = Annotated[
    UriReference | HuggingFaceReference, Field(discriminator="type"), REFERENCE
]
DataReference = Annotated[
    SchedulerReference | UriReference | HuggingFaceReference,
    Field(discriminator="type"),
    REFERENCE,
]

# Upstream's Send and Receive: a Reference, then a try_from check.
SendReference = Annotated[PeersReference, TryFrom(REFERENCE, _send_problem)]
ReceiveReference = Annotated[PeersReference, TryFrom(REFERENCE, _receive_problem)]


class ModelSpec(JobModel):
    task: TrainableTask
    artifact: ArtifactReference
    input_names: InputNames


class PreprocessorSpec(JobModel):
    task: PreprocessorTask
    artifact: ArtifactReference
    input_names: InputNames


class TrainConfig(JobModel):
    model: ModelSpec
    data: DataReference
    updates: SendReference
    results: ReceiveReference
    optimizer: OptimizerSpec
    batch_size: BatchSize
    preprocessor: PreprocessorSpec | None = None
    scheduler: LrScheduler | None = None


class ExecutorSpec(JobModel):
    class_: Literal["train"] = Field(alias="class")
    descriptor: Descriptor
    config: TrainConfig


# An aggregate job, declared for serde's sake: the worker's own parameter server runs it.


class AggregateConfig(JobModel):
    updates: ReceiveReference
    results: SendReference
    optimizer: AggregateOptimizer


class AggregateExecutorSpec(JobModel):
    class_: Literal["aggregate"] = Field(alias="class")
    descriptor: Descriptor
    config: AggregateConfig


class Job(JobModel):
    job_id: Annotated[str, UUID]
    # Read straight from serde_json, not from a buffered enclosing enum: its tag is a string.
    executor: Annotated[ExecutorSpec, tagged(ExecutorSpec, AggregateExecutorSpec, index_tags=False)]

    @property
    def config(self) -> TrainConfig:
        return self.executor.config


JOB_SPEC = struct(Job)


def parse_job_bytes(data: bytes) -> Job:
    """An alpha.17 job. Raises JobSpecError (UntrainableJobError for a job that serde
    accepts) with one line naming the field and the problem."""
    return read_job(data, JOB_SPEC, Job)


def parse_job(source: str) -> Job:
    """Parses JOB_JSON, or `@path` naming a file that holds it."""
    return parse_job_bytes(job_bytes(source))


def shaped_for_alpha17(data: bytes) -> bool:
    """Whether the job's config names `updates` or `results`, which only alpha.17's has."""
    try:
        config = json.loads(data)["executor"]["config"]
    except (ValueError, KeyError, TypeError, RecursionError):  # deep nesting: not alpha.17's
        return False
    return isinstance(config, dict) and ("updates" in config or "results" in config)
