"""The action protocol's job spec (crates/messages/src/lib.rs @3058282936,
docs/protocol-actions.md): the train config loses `updates` and `results` (targets and sources
arrive inside actions), a peers reference's slice is named by the hash of its bytes, and the
executor enum gains `gymnasium` and `rl-trainer`. The types both generations share are
protocol/job.py's.
"""

from __future__ import annotations

from typing import Annotated, Literal

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
    read_job,
)
from hypha.accelerate_executor.protocol.serde import UUID, Integer, struct, tagged


class HashedSlice(JobModel):
    dataset: str
    hash: Annotated[int, Integer("u64")]


class ActionPeersReference(JobModel):
    type: Literal["peers"]
    peers: list[PeerId]
    strategy: Annotated[Strategy, tagged(Strategy)]
    resource: HashedSlice | None = None


ACTION_REFERENCE = tagged(
    UriReference, HuggingFaceReference, ActionPeersReference, SchedulerReference
)
ActionReference = Annotated[
    UriReference | HuggingFaceReference | ActionPeersReference | SchedulerReference,
    Field(discriminator="type"),
]
ActionArtifactReference = Annotated[
    UriReference | HuggingFaceReference, Field(discriminator="type"), ACTION_REFERENCE
]
ActionDataReference = Annotated[
    SchedulerReference | UriReference | HuggingFaceReference,
    Field(discriminator="type"),
    ACTION_REFERENCE,
]


class ActionModelSpec(JobModel):
    task: TrainableTask
    artifact: ActionArtifactReference
    input_names: InputNames


class ActionPreprocessorSpec(JobModel):
    task: PreprocessorTask
    artifact: ActionArtifactReference
    input_names: InputNames


class ActionTrainConfig(JobModel):
    model: ActionModelSpec
    data: ActionDataReference
    optimizer: OptimizerSpec
    batch_size: BatchSize
    preprocessor: ActionPreprocessorSpec | None = None
    scheduler: LrScheduler | None = None


class ActionExecutorSpec(JobModel):
    class_: Literal["train"] = Field(alias="class")
    descriptor: Descriptor
    config: ActionTrainConfig


# The other executor classes, declared for serde's sake and refused: a worker runs them with
# other executors (its parameter server, an RL environment).


class ActionAggregateConfig(JobModel):
    optimizer: AggregateOptimizer


class ActionAggregateExecutorSpec(JobModel):
    class_: Literal["aggregate"] = Field(alias="class")
    descriptor: Descriptor
    config: ActionAggregateConfig


class GymnasiumConfig(JobModel):
    model: ActionModelSpec
    environment: str


class GymnasiumExecutorSpec(JobModel):
    class_: Literal["gymnasium"] = Field(alias="class")
    descriptor: Descriptor
    config: GymnasiumConfig


class RlTrainerConfig(JobModel):
    model: ActionModelSpec
    optimizer: OptimizerSpec
    batch_size: Annotated[int, Integer("u32")]
    scheduler: LrScheduler | None = None


class RlTrainerExecutorSpec(JobModel):
    class_: Literal["rl-trainer"] = Field(alias="class")
    descriptor: Descriptor
    config: RlTrainerConfig


class ActionJob(JobModel):
    job_id: Annotated[str, UUID]
    executor: Annotated[
        ActionExecutorSpec,
        tagged(
            ActionExecutorSpec,
            ActionAggregateExecutorSpec,
            GymnasiumExecutorSpec,
            RlTrainerExecutorSpec,
            index_tags=False,
        ),
    ]

    @property
    def config(self) -> ActionTrainConfig:
        return self.executor.config


ACTION_JOB_SPEC = struct(ActionJob)


def parse_action_job_bytes(data: bytes) -> ActionJob:
    """An action-era job. Raises JobSpecError (UntrainableJobError for a job that serde
    accepts) with one line naming the field and the problem."""
    return read_job(data, ACTION_JOB_SPEC, ActionJob)
