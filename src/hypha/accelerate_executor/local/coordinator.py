"""The Hypha side of a local cluster, in one process for N workers.

Job assignment, the scheduler's answers, the data service, the model store and the
parameter server, behind a small HTTP/1.1 API on TCP (connections kept alive) that the
workers' bridges call; a bridge in this same process calls it directly (InProcessBackend):

    GET  /health                              {"ok": true}
    POST /jobs               {"worker": NAME}  the job spec for that worker
    GET  /jobs/ID                             {"state": "running"|"cancelled", "reason": ...}
    POST /jobs/ID/fetch      <reference>       {"files": [{"name", "blob"}]}
    GET  /blobs/BLOB                          the file's bytes
    POST /jobs/ID/status     <progress>        the scheduler's answer
    POST /jobs/ID/push?peer=P <bytes>          {} (a file for peer P: the parameter server)
    GET  /jobs/ID/pushes?after=N&wait=S       200 the next file pushed to the job
                                              (X-Seq, X-From-Peer), or 204
    POST /jobs/ID/exit {"exit_code", "leaks"}  {}
    GET  /summary                             the run so far (see summary())

Errors are {"error": "connector_error"|"network_error"|"invalid_request", "detail": ...}.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from hypha.accelerate_executor.local.assets import MODEL_FILENAMES, MODEL_REPOSITORY, Assets
from hypha.accelerate_executor.local.bridge_server import (
    ERROR_KINDS,
    AcceptLoop,
    BackendError,
    Push,
    RemoteFile,
    TracksConnections,
)
from hypha.accelerate_executor.local.output import say, warn
from hypha.accelerate_executor.local.parameter_server import NesterovOuterOptimizer

LrSchedule = Literal["cosine-with-warmup", "linear-with-warmup", "constant"]
MAX_WAIT_S = 30.0
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def new_peer_id() -> str:
    """A libp2p Ed25519 peer id ("12D3KooW..."): base58 of an identity multihash of a random key."""
    raw = bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20]) + secrets.token_bytes(32)
    number = int.from_bytes(raw, "big")
    digits = ""
    while number:
        number, digit = divmod(number, 58)
        digits = _BASE58[digit] + digits
    # Each leading zero byte is a leading "1".
    return "1" * (len(raw) - len(raw.lstrip(b"\0"))) + digits


@dataclass(frozen=True)
class RunOptions:
    workers: int = 2
    rounds: int = 4
    steps_per_round: int = 30
    # How many batches before the round's end the scheduler says ScheduleUpdate.
    lead: int = 2
    batch_size: int = 8
    learning_rate: float = 2e-3
    betas: tuple[float, float] | None = (0.9, 0.95)
    epsilon: float | None = 1e-8
    lr_schedule: LrSchedule = "cosine-with-warmup"
    warmup_steps: int = 10
    outer_learning_rate: float = 0.7
    outer_momentum: float = 0.9

    def __post_init__(self) -> None:
        for name in ("workers", "rounds", "steps_per_round", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1")
        if self.lead < 0 or self.warmup_steps < 0:
            raise ValueError("lead and warmup-steps must not be negative")
        if self.learning_rate <= 0 or self.outer_learning_rate <= 0:
            raise ValueError("learning rates must be positive")

    @property
    def effective_lead(self) -> int:
        # At least one batch per round comes before ScheduleUpdate.
        return min(self.lead, self.steps_per_round - 1)


@dataclass(frozen=True)
class Catalog:
    """What the coordinator serves: the model store and one data set of slices."""

    models_dir: Path
    dataset_dir: Path
    dataset_name: str
    model_repository: str = MODEL_REPOSITORY
    model_filenames: tuple[str, ...] = MODEL_FILENAMES

    @classmethod
    def from_assets(cls, assets: Assets) -> Catalog:
        return cls(assets.models_dir, assets.dataset_dir, assets.spec.dataset_name)


@dataclass
class RoundRecord:
    index: int
    batches: int = 0
    samples: int = 0
    # Throughput runs from the first report on, so the first batch's samples are not timed.
    first_batch_samples: int = 0
    first_status_at: float | None = None
    # Batches reported when ScheduleUpdate was answered.
    scheduled_at_batch: int | None = None
    update_at: float | None = None
    aggregated_at: float | None = None
    received_at: float | None = None


@dataclass
class WorkerRecord:
    name: str
    peer_id: str
    job_id: str
    assigned_at: float
    rounds: list[RoundRecord] = field(default_factory=lambda: [RoundRecord(0)])
    # Keyed by the round number the executor reports.
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    slices: list[int] = field(default_factory=list)
    in_flight: bool = False
    done: bool = False
    exit_code: int | None = None
    leaks: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    pushes: list[Push] = field(default_factory=list)
    push_seq: int = 0

    @property
    def round(self) -> RoundRecord:
        return self.rounds[-1]


class Refusal(Exception):
    def __init__(self, status: int, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.detail = detail


class Coordinator:
    def __init__(
        self,
        catalog: Catalog,
        options: RunOptions,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "coordinator",
    ) -> None:
        self.catalog = catalog
        self.options = options
        self.name = name
        self.scheduler_peer = new_peer_id()
        self.parameter_server_peer = new_peer_id()
        self.started_at = time.time()
        self.cancelled: str | None = None
        self.workers: dict[str, WorkerRecord] = {}  # by job id
        self.aggregations: list[dict[str, Any]] = []
        self._slices = sorted(
            int(path.stem)
            for path in catalog.dataset_dir.glob("*.safetensors")
            if path.stem.isdigit()
        )
        if not self._slices:
            raise ValueError(f"no <index>.safetensors slices in {catalog.dataset_dir}")
        self._next_slice = 0
        self._blobs: dict[str, Path] = {}
        self._pending: dict[str, bytes] = {}
        self._aggregating = False
        self._optimizer = NesterovOuterOptimizer(
            options.outer_learning_rate, options.outer_momentum
        )
        self._printed_rounds: set[int] = set()
        self._cond = threading.Condition()
        self._server = _Server((host, port), self)
        self._accepting = AcceptLoop(self._server, f"{name}-http")

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        host = "127.0.0.1" if host in ("0.0.0.0", "") else str(host)
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._accepting.start()

    def stop(self) -> None:
        self._accepting.stop()
        self._server.cut_connections()
        self._server.server_close()

    def __enter__(self) -> Coordinator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def cancel(self, reason: str) -> None:
        """Cancels every job: the workers see it and stop their executors (SIGTERM)."""
        with self._cond:
            if self.cancelled is None:
                self.cancelled = reason
                warn(self.name, f"cancelling all jobs: {reason}")
            self._cond.notify_all()

    def wait_finished(self, timeout_s: float | None = None) -> bool:
        """Waits until every worker's job has been assigned and has ended."""
        with self._cond:
            return self._cond.wait_for(self.finished, timeout_s)

    def finished(self) -> bool:
        return len(self.workers) == self.options.workers and all(
            worker.exit_code is not None for worker in self.workers.values()
        )

    # Job assignment.

    def assign_job(self, worker_name: str) -> dict[str, Any]:
        with self._cond:
            if any(worker.name == worker_name for worker in self.workers.values()):
                raise Refusal(409, "invalid_request", f"worker {worker_name!r} already had its job")
            if len(self.workers) >= self.options.workers:
                raise Refusal(
                    409, "invalid_request", f"all {self.options.workers} jobs are assigned"
                )
            if self.cancelled is not None:
                raise Refusal(409, "invalid_request", f"the run is cancelled: {self.cancelled}")
            record = WorkerRecord(worker_name, new_peer_id(), str(uuid.uuid4()), time.time())
            self.workers[record.job_id] = record
        say(
            self.name,
            f"job {record.job_id} -> {worker_name} ({len(self.workers)}/{self.options.workers})",
        )
        return self.job_spec(record.job_id)

    def job_spec(self, job_id: str) -> dict[str, Any]:
        """The job JSON, shaped exactly as a Hypha scheduler sends it."""
        options = self.options
        peers = {
            "type": "peers",
            "peers": [self.parameter_server_peer],
            "strategy": {"type": "All"},
            "resource": None,
        }
        config: dict[str, Any] = {
            "model": {
                "task": "causal-lm",
                "artifact": {
                    "type": "huggingface",
                    "repository": self.catalog.model_repository,
                    "revision": None,
                    "filenames": list(self.catalog.model_filenames),
                    "token": None,
                },
                "input-names": ["input_ids", "labels"],
            },
            "data": {
                "type": "scheduler",
                "peer": self.scheduler_peer,
                "dataset": self.catalog.dataset_name,
            },
            "updates": peers,
            "results": dict(peers),
            "optimizer": {
                "learning-rate": options.learning_rate,
                "betas": list(options.betas) if options.betas is not None else None,
                "epsilon": options.epsilon,
            },
            "batch_size": options.batch_size,
        }
        if options.lr_schedule != "constant":
            config["scheduler"] = {
                "type": options.lr_schedule,
                "warmup_steps": options.warmup_steps,
                "training_steps": options.rounds * options.steps_per_round,
            }
        return {
            "job_id": job_id,
            "executor": {
                "class": "train",
                "descriptor": {"name": "diloco-transformer"},
                "config": config,
            },
        }

    def job_state(self, job_id: str) -> dict[str, Any]:
        with self._cond:
            self._record(job_id)
            if self.cancelled is not None:
                return {"state": "cancelled", "reason": self.cancelled}
            return {"state": "running"}

    def backend(self, job_id: str) -> InProcessBackend:
        """The job's bridge backend for a worker in this process (see InProcessBackend)."""
        return InProcessBackend(self, job_id)

    def _record(self, job_id: str) -> WorkerRecord:
        record = self.workers.get(job_id)
        if record is None:
            raise Refusal(404, "connector_error", f"no job {job_id}")
        return record

    # Data service and model store.

    def fetch(self, job_id: str, reference: dict[str, Any]) -> list[dict[str, str]]:
        kind = reference.get("type")
        with self._cond:
            record = self._record(job_id)
            if kind == "scheduler":
                if reference.get("peer") != self.scheduler_peer:
                    raise Refusal(
                        502, "network_error", f"no scheduler at peer {reference.get('peer')}"
                    )
                if reference.get("dataset") != self.catalog.dataset_name:
                    raise Refusal(
                        404,
                        "connector_error",
                        f"the scheduler has no data set {reference.get('dataset')!r}",
                    )
                index = self._slices[self._next_slice % len(self._slices)]
                self._next_slice += 1
                record.slices.append(index)
                return [self._blob(str(index), self.catalog.dataset_dir / f"{index}.safetensors")]
            if kind == "huggingface":
                repository = self._inside(self.catalog.models_dir, str(reference.get("repository")))
                return [
                    self._blob(
                        name,
                        self._inside(repository, name),
                        f"{reference.get('repository')} has no file {name}",
                    )
                    for name in reference.get("filenames") or []
                ]
            if kind == "uri":
                name = urlsplit(str(reference.get("value"))).path.rsplit("/", 1)[-1]
                path = self._inside(self.catalog.models_dir / "uri", unquote(name))
                return [self._blob(name, path, f"nothing is served at {reference.get('value')}")]
        raise Refusal(400, "invalid_request", f"cannot fetch a {kind} reference")

    def _inside(self, root: Path, relative: str) -> Path:
        pure = PurePosixPath(relative)
        if not relative or pure.is_absolute() or ".." in pure.parts:
            raise Refusal(404, "connector_error", f"no such item {relative!r}")
        return root / pure

    def _blob(self, name: str, path: Path, missing: str = "") -> dict[str, str]:
        if not path.is_file():
            raise Refusal(404, "connector_error", missing or f"{path.name} is missing")
        blob = uuid.uuid4().hex
        self._blobs[blob] = path
        return {"name": name, "blob": blob}

    def blob_path(self, blob: str) -> Path:
        with self._cond:
            path = self._blobs.get(blob)
        if path is None:
            raise Refusal(404, "connector_error", f"no blob {blob}")
        return path

    # Scheduler.

    def status(self, job_id: str, progress: Any) -> dict[str, Any]:
        now = time.time()
        with self._cond:
            record = self._record(job_id)
            current = record.round
            if progress == "update":
                if record.in_flight:
                    self._violation(record, f"a second update in round {current.index}")
                elif current.scheduled_at_batch is None:
                    self._violation(
                        record, f"update in round {current.index} before any ScheduleUpdate"
                    )
                elif current.batches - current.scheduled_at_batch != self.options.effective_lead:
                    self._violation(
                        record,
                        f"round {current.index}: trained {current.batches - current.scheduled_at_batch} batches after "
                        f"ScheduleUpdate{{counter: {self.options.effective_lead}}}",
                    )
                # The pseudo-gradient is sent before `update`, so the round may be closed already.
                record.in_flight = current.aggregated_at is None
                current.update_at = now
                return {"type": "Ok"}
            if progress == "update-received":
                if current.aggregated_at is None:
                    self._violation(
                        record,
                        f"update-received in round {current.index} before the update was pushed",
                    )
                current.received_at = now
                record.in_flight = False
                if len(record.rounds) >= self.options.rounds:
                    record.done = True
                    return {"type": "Done"}
                record.rounds.append(RoundRecord(current.index + 1))
                return {"type": "Continue"}
            if progress == "updated":
                return {"type": "Ok"}
            if isinstance(progress, dict) and "metrics" in progress:
                body = progress["metrics"]
                record.metrics[int(body["round"])] = {
                    key: float(value) for key, value in body["metrics"].items()
                }
                self._print_rounds()
                return {"type": "Ok"}
            if isinstance(progress, dict) and "status" in progress:
                if record.in_flight:
                    self._violation(
                        record, f"status while the update of round {current.index} was in flight"
                    )
                    return {"type": "Error"}
                if record.done:
                    self._violation(record, "status after Done")
                    return {"type": "Error"}
                current.batches += 1
                current.samples += int(progress["status"]["batch_size"])
                if current.first_status_at is None:
                    current.first_status_at = now
                    current.first_batch_samples = current.samples
                if (
                    current.scheduled_at_batch is None
                    and current.batches
                    >= self.options.steps_per_round - self.options.effective_lead
                ):
                    current.scheduled_at_batch = current.batches
                    return {"type": "ScheduleUpdate", "counter": self.options.effective_lead}
                return {"type": "Continue"}
        raise Refusal(400, "invalid_request", "unknown progress message")

    def _violation(self, record: WorkerRecord, what: str) -> None:
        record.violations.append(what)
        warn(self.name, f"{record.name} broke the protocol: {what}")

    def _print_rounds(self) -> None:
        """Prints each round's losses once every running worker has reported them."""
        if len(self.workers) < self.options.workers:
            return
        reported = sorted(
            {key for worker in self.workers.values() for key in worker.metrics}
            - self._printed_rounds
        )
        for key in reported:
            waiting = [
                w for w in self.workers.values() if key not in w.metrics and w.exit_code is None
            ]
            if waiting:
                return
            losses = {
                w.name: w.metrics[key]["loss"]
                for w in self.workers.values()
                if "loss" in w.metrics.get(key, {})
            }
            self._printed_rounds.add(key)
            if losses:
                mean = sum(losses.values()) / len(losses)
                parts = "  ".join(f"{name} {loss:.3f}" for name, loss in sorted(losses.items()))
                say(self.name, f"round {key}: loss {parts}  mean {mean:.3f}")

    # Parameter server.

    def push(self, job_id: str, peer: str, data: bytes) -> None:
        with self._cond:
            record = self._record(job_id)
            if peer != self.parameter_server_peer:
                raise Refusal(502, "network_error", f"peer {peer} is not reachable")
            if job_id in self._pending:
                self._violation(record, f"a second pseudo-gradient in round {record.round.index}")
            self._pending[job_id] = data
            self._maybe_aggregate()

    def _maybe_aggregate(self) -> None:
        if self._aggregating or not self._pending or len(self.workers) < self.options.workers:
            return
        running = [job_id for job_id, worker in self.workers.items() if worker.exit_code is None]
        if any(job_id not in self._pending for job_id in running):
            return
        files, self._pending = self._pending, {}
        self._aggregating = True
        threading.Thread(target=self._aggregate, args=(files,), daemon=True).start()

    def _aggregate(self, files: dict[str, bytes]) -> None:
        started = time.time()
        try:
            update, skipped = self._optimizer.step_files(list(files.values()))
        except Exception as exc:  # an unreadable file: safetensors and torch raise many kinds
            # Nobody would ever get this round's update: end the run instead of hanging it.
            with self._cond:
                self._aggregating = False
            self.cancel(f"parameter server could not average round {len(self.aggregations)}: {exc}")
            return
        with self._cond:
            index = len(self.aggregations)
            self.aggregations.append(
                {
                    "round": index,
                    "workers": sorted(self.workers[job_id].name for job_id in files),
                    "seconds": round(time.time() - started, 3),
                    "skipped_tensors": skipped,
                }
            )
            now = time.time()
            for worker in self.workers.values():
                if worker.exit_code is not None:
                    continue
                worker.push_seq += 1
                worker.pushes.append(Push(worker.push_seq, self.parameter_server_peer, update))
                worker.in_flight = False
                worker.round.aggregated_at = now
            self._aggregating = False
            self._maybe_aggregate()
            self._cond.notify_all()
        if skipped:
            warn(self.name, f"round {index}: left out {', '.join(skipped)}")

    def next_push(self, job_id: str, after: int, wait_s: float) -> Push | None:
        with self._cond:
            record = self._record(job_id)
            record.pushes = [push for push in record.pushes if push.seq > after]
            self._cond.wait_for(lambda: bool(record.pushes), min(wait_s, MAX_WAIT_S))
            return record.pushes[0] if record.pushes else None

    def report_exit(self, job_id: str, exit_code: int, leaks: list[str]) -> None:
        with self._cond:
            record = self._record(job_id)
            record.exit_code = exit_code
            record.leaks = list(leaks)
            record.in_flight = False
            # A worker that is gone no longer holds up the round.
            self._maybe_aggregate()
            self._print_rounds()
            self._cond.notify_all()
        if exit_code != 0:
            warn(self.name, f"{record.name}'s executor exited with {exit_code}")

    # Summary.

    def summary(self) -> dict[str, Any]:
        """Everything recorded, per worker and round; `report.py` derives the verdict from it."""
        with self._cond:
            workers = {}
            for record in self.workers.values():
                data = asdict(record)
                del data["pushes"], data["push_seq"]
                timed = [
                    r
                    for r in record.rounds
                    if r.first_status_at is not None and r.update_at is not None
                ]
                seconds = sum(
                    r.update_at - r.first_status_at
                    for r in timed
                    if r.update_at and r.first_status_at
                )
                samples = sum(r.samples - r.first_batch_samples for r in timed)
                data["samples_per_s"] = round(samples / seconds, 2) if seconds > 0 else None
                data["rounds_completed"] = sum(r.received_at is not None for r in record.rounds)
                workers[record.name] = data
            return {
                "options": asdict(self.options),
                "dataset": self.catalog.dataset_name,
                "model": self.catalog.model_repository,
                "scheduler_peer": self.scheduler_peer,
                "parameter_server_peer": self.parameter_server_peer,
                "started_at": self.started_at,
                "wall_s": round(time.time() - self.started_at, 3),
                "cancelled": self.cancelled,
                "aggregations": list(self.aggregations),
                "workers": workers,
            }


@contextmanager
def _as_backend_error() -> Iterator[None]:
    """The coordinator's refusals as the bridge sees them over TCP (coordinator_client.py)."""
    try:
        yield
    except Refusal as exc:
        kind = exc.kind if exc.kind in ERROR_KINDS else "connector_error"
        raise BackendError(kind, exc.detail) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise BackendError("connector_error", f"malformed request: {exc}") from None


def _unreadable(path: Path, exc: OSError) -> BackendError:
    return BackendError("connector_error", f"cannot read {path.name}: {exc.strerror}")


class InProcessBackend:
    """One job's bridge backend when the worker runs in the coordinator's process: the
    calls the TCP API makes, without the HTTP hop.

    A Hypha scheduler runs on another machine. Its stand-in runs on the executor's cores,
    and over TCP it cost them about three times what the bridge itself costs per `status`
    (an HTTP client in the bridge, an HTTP server here, two more thread wake-ups).
    """

    def __init__(self, coordinator: Coordinator, job_id: str) -> None:
        self._coordinator = coordinator
        self._job_id = job_id

    def fetch(self, reference: dict[str, Any]) -> list[RemoteFile]:
        with _as_backend_error():
            files = self._coordinator.fetch(self._job_id, reference)
        return [RemoteFile(name=item["name"], blob=item["blob"]) for item in files]

    def download(self, blob: str, out: BinaryIO) -> None:
        with _as_backend_error():
            path = self._coordinator.blob_path(blob)
        try:
            source = path.open("rb")
        except OSError as exc:
            raise _unreadable(path, exc) from None
        with source:
            while True:
                try:
                    chunk = source.read(1 << 20)
                except OSError as exc:
                    raise _unreadable(path, exc) from None
                if not chunk:
                    return
                out.write(chunk)  # a local write failure is the bridge's io_error

    def send(self, peer: str, data: bytes) -> None:
        with _as_backend_error():
            self._coordinator.push(self._job_id, peer, data)

    def status(self, progress: Any) -> dict[str, Any]:
        with _as_backend_error():
            return self._coordinator.status(self._job_id, progress)

    def next_push(self, after: int, wait_s: float) -> Push | None:
        with _as_backend_error():
            return self._coordinator.next_push(self._job_id, after, wait_s)


class _Server(TracksConnections, ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], coordinator: Coordinator) -> None:
        super().__init__(address, _Handler)
        self.coordinator = coordinator

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A bridge that stopped mid-poll is normal; anything else is one line, not a traceback.
        error = sys.exc_info()[1]
        if not isinstance(error, ConnectionError):
            warn(self.coordinator.name, f"request failed: {error!r}")


class _Handler(BaseHTTPRequestHandler):
    # Kept-alive connections: the bridges report every training step through here.
    protocol_version = "HTTP/1.1"
    # Head and body of an answer leave in one write: with Nagle's algorithm a second small
    # write on a kept-alive connection waits for the client's delayed ACK.
    wbufsize = -1
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def coordinator(self) -> Coordinator:
        return self.server.coordinator

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        parts = [unquote(part) for part in url.path.strip("/").split("/")]
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        coordinator = self.coordinator
        try:
            # Read whatever the route, so that no body is left on a kept-alive connection.
            body = self._body()
            match method, parts:
                case "GET", ["health"]:
                    self._json({"ok": True})
                case "GET", ["summary"]:
                    self._json(coordinator.summary())
                case "POST", ["jobs"]:
                    self._json(coordinator.assign_job(str(_object(body).get("worker", ""))))
                case "GET", ["jobs", job_id]:
                    self._json(coordinator.job_state(job_id))
                case "POST", ["jobs", job_id, "fetch"]:
                    self._json({"files": coordinator.fetch(job_id, _object(body))})
                case "GET", ["blobs", blob]:
                    self._file(coordinator.blob_path(blob))
                case "POST", ["jobs", job_id, "status"]:
                    self._json(coordinator.status(job_id, _object(body)))
                case "POST", ["jobs", job_id, "push"]:
                    coordinator.push(job_id, query.get("peer", ""), body)
                    self._json({})
                case "GET", ["jobs", job_id, "pushes"]:
                    push = coordinator.next_push(
                        job_id, int(query.get("after", "0")), float(query.get("wait", "0"))
                    )
                    if push is None:
                        self._reply(204, b"", {})
                    else:
                        self._reply(
                            200, push.data, {"X-Seq": str(push.seq), "X-From-Peer": push.from_peer}
                        )
                case "POST", ["jobs", job_id, "exit"]:
                    request = _object(body)
                    coordinator.report_exit(
                        job_id,
                        int(request["exit_code"]),
                        [str(leak) for leak in request.get("leaks", [])],
                    )
                    self._json({})
                case _:
                    raise Refusal(404, "invalid_request", f"no route {method} {url.path}")
        except Refusal as exc:
            self._json({"error": exc.kind, "detail": exc.detail}, exc.status)
        except (ValueError, KeyError, TypeError) as exc:
            self._json({"error": "invalid_request", "detail": f"malformed request: {exc}"}, 400)

    def _body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            # Where this body ends is unknown, so nothing after it on the connection can be read.
            self.close_connection = True
            raise
        return self.rfile.read(length)

    def _json(self, payload: Any, status: int = 200) -> None:
        self._reply(status, json.dumps(payload).encode(), {"Content-Type": "application/json"})

    def _file(self, path: Path) -> None:
        try:
            source = path.open("rb")
            size = os.fstat(source.fileno()).st_size
        except OSError as exc:
            raise Refusal(
                500, "connector_error", f"cannot read {path.name}: {exc.strerror}"
            ) from None
        with source:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            sent = 0
            with suppress(OSError):
                while chunk := source.read(1 << 20):
                    self.wfile.write(chunk)
                    sent += len(chunk)
            if sent != size:
                # The answer's head is out: all that is left is to cut the body short, which
                # the client sees as a broken download.
                self.close_connection = True

    def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _object(body: bytes) -> Any:
    """A request body that must be a JSON object (or, for progress, a string)."""
    value = json.loads(body or b"{}")
    if not isinstance(value, dict | str):
        raise ValueError("expected a JSON object")
    return value
