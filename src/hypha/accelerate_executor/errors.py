"""Every exception this package raises on purpose, and the exit codes they end in.

Each message is one line that a worker's log, a terminal or an HTTP body shows as it is.
A process's `main` (entry.run_main) prints `PROG: message` on stderr and exits with the
error's `exit_code`.

    HyphaError                  the root: a one-line message and an exit code (1 unless below)
    ├── UsageError              bad command-line arguments (OneLineArgumentParser): 2
    ├── ExecutorError           the executor, in the image, cannot go on
    │   ├── JobSpecError        the job is refused: 2
    │   │   ├── JsonError       not JSON as serde_json reads it
    │   │   ├── SerdeError      JSON that Hypha's Rust types refuse
    │   │   ├── UntrainableJobError  serde accepts it, nothing could train it
    │   │   └── RemoteCodeRefused    the model ships Python the operator has not allowed
    │   ├── BridgeError         talking to the bridge failed
    │   │   ├── BridgeAnswerError   the bridge answered a request with an error
    │   │   └── BridgeGoneError     the bridge cannot be reached any more
    │   ├── UnsafePathError     the bridge handed back a path outside the work dir
    │   ├── SchedulerError      the scheduler answered Error, or something unknown
    │   ├── DataError           a data slice does not hold what the job says
    │   ├── NoLossError         the model's forward returned no loss
    │   ├── OutOfMemory         a step does not fit even in the smallest micro-batches
    │   ├── NoGradientCheckpointing  HYPHA_GRADIENT_CHECKPOINTING for a model without it: 2
    │   ├── UpdateError         the parameter server's update does not fit the model
    │   └── TensorFileError     a file is not the safetensors file it should be
    ├── LaunchError             the image's launcher: bad argument, config or container: 2
    ├── ShimError               the host shim: bad arguments, job or work dir: 2
    │   ├── DockerError         Docker cannot run the container (engine, image, runtime): 125
    │   └── BuildError          a step of an image or bundle build failed: 1
    └── (LocalError)            the local stand-in's own, in hypha/standin/errors.py
    Cancelled                   SIGTERM reached the executor: 143. A BaseException, like
                                KeyboardInterrupt (130), so no `except Exception` stops it

A job cancelled by signal N exits 128 + N (supervisor.signal_exit_status); a child killed
by signal N is reported as 128 + N too, as a shell shows it.
"""

from __future__ import annotations

import signal
from typing import Literal

# The kinds of failure beyond a bridge that its 500 answers name (docs/protocol.md section 2).
ErrorKind = Literal["network_error", "connector_error", "io_error"]

EXIT_OK = 0
EXIT_FAILED = 1  # the job (or the command) failed
EXIT_USAGE = 2  # bad arguments or a bad job
EXIT_DOCKER = 125  # as `docker run`: Docker could not run the container
EXIT_SIGNAL_BASE = 128  # + N: ended by signal N


class HyphaError(Exception):
    """Root of every failure this package reports: one line, and the exit code it ends in."""

    exit_code = EXIT_FAILED
    # What the one line says before the message.
    prefix = ""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class UsageError(HyphaError):
    """Bad command-line arguments."""

    exit_code = EXIT_USAGE


# The executor, inside the image.


class ExecutorError(HyphaError):
    """A failure the executor reports with one line and a non-zero exit."""


class JobSpecError(ExecutorError):
    """The job JSON is malformed or asks for something this executor does not do."""

    exit_code = EXIT_USAGE
    prefix = "bad job: "


class JsonError(JobSpecError):
    """Not JSON as serde_json reads it; the message names the problem and where."""


class SerdeError(JobSpecError):
    """JSON that Hypha's Rust types (serde) refuse; the message names the field."""

    def __init__(self, path: tuple[str | int, ...], problem: str) -> None:
        where = ".".join(str(part) for part in path) or "job"
        super().__init__(f"{where}: {problem}")


class UntrainableJobError(JobSpecError):
    """A job Hypha's Rust side accepts that this executor cannot train: one of those in
    docs/jobs.md, "Parsing, and the jobs refused beyond serde"."""


class RemoteCodeRefused(JobSpecError):
    """The model or preprocessor ships Python code and the operator has not allowed it."""


class BridgeError(ExecutorError):
    """Talking to the bridge failed: it answered with an error, or it cannot be reached."""


class BridgeAnswerError(BridgeError):
    """The bridge answered a request with an error."""

    def __init__(self, route: str, status: int, error: str, detail: str) -> None:
        super().__init__(f"bridge {route} failed: {status} {error}: {detail}")
        self.route = route
        self.status = status
        self.error = error
        self.detail = detail


class BridgeGoneError(BridgeError):
    """The bridge cannot be reached any more: socket gone, refused, or stream closed.
    `transient` when it may come back (refused, reset, no answer in time): bridge/retry.py
    tries such a request again; a socket that is gone is final."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class UnsafePathError(ExecutorError):
    """The bridge handed back a path outside the work dir."""


class SchedulerError(ExecutorError):
    """The scheduler answered with Error, or with something this executor does not know."""


class DataError(ExecutorError):
    """A data slice does not hold what the job says it holds."""


class NoLossError(ExecutorError):
    """The model's forward returned no loss to train on."""


class OutOfMemory(ExecutorError):
    """A step does not fit in memory even in the smallest micro-batches."""


class NoGradientCheckpointing(ExecutorError):
    """HYPHA_GRADIENT_CHECKPOINTING is on and the model's class has no gradient checkpointing
    (transformers' `supports_gradient_checkpointing`): a setting the job cannot have, as a
    refused value is."""

    exit_code = EXIT_USAGE


class UpdateError(ExecutorError):
    """The parameter server's update does not fit the model."""


class TensorFileError(ExecutorError):
    """A file is not the safetensors file it should be."""


class ModelExportError(ExecutorError):
    """The trained model could not be written as a Hugging Face folder."""


class PushError(ExecutorError):
    """The trained model could not be uploaded to its destination (`push-to-hub`)."""


class Cancelled(BaseException):
    """SIGTERM from the worker, or from a launcher passing it on. Not an Exception: the
    training loop's `except Exception` clauses must let it through."""

    exit_code = EXIT_SIGNAL_BASE + signal.SIGTERM


# The image's launcher.


class LaunchError(HyphaError):
    """A bad argument or accelerate config, or a container the job cannot run in."""

    exit_code = EXIT_USAGE


# The host shim.


class ShimError(HyphaError):
    """A failure a user can cause on the host: arguments, job, work dir."""

    exit_code = EXIT_USAGE


class DockerError(ShimError):
    """Docker cannot run the container: engine, image, GPU runtime, mounts."""

    exit_code = EXIT_DOCKER


class BuildError(ShimError):
    """A step of an image or bundle build failed; its own output says why."""

    exit_code = EXIT_FAILED
