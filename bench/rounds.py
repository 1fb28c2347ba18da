"""Benchmark 6: short DiLoCo rounds, where what an executor costs per round shows.

Two workers share the machine's two cores, each executor on one torch thread, and train
the demo GPT-2 (its embeddings untied: Hypha's own executor cannot save tied weights; no
dropout, see MODELS) at batch 8 for several rounds of about 15 batches each, against the
local stand-in; its scheduler answers every status at once, then with a 50 ms round trip
(a wrapper around the bridge's backend, as in the status-delay benchmark). Each executor runs the same job in
turn, all of them once per repeat and every repeat in the same order, so that the
machine's drift falls on all alike:
- `bare`: bench/bare_executor.py, a PyTorch loop and the protocol by hand (the baseline);
- `bare-eval`: the same loop with its model left in eval mode (dropout off), with the
  `demo-dropout` model only;
- `executor`: this project's executor, as a Hypha worker would start it;
- any other given with `--against NAME=PATH`: a Python interpreter whose environment holds
  another `hypha.accelerate_executor.training` (Hypha's own executor, say), or a source tree
  whose `src/` holds one (an earlier commit of this project).

Measured per run, from the coordinator's records: samples/s per worker over rounds 2..
(the samples both workers reported over the wall time from round 1's update to the
last round's, halved), and each round split per worker into `reload` (from the update
being pushed to `update-received`: read, merged, loaded), `first step` (from there to the
next round's first status), `training` (to `update`) and `waiting` (from `update` to the
round's update being pushed: the other worker, and the parameter server). Executors that
print a timing line (the bare loop and this executor, see bare_executor.TIMING_LINE) also
split `training` into step, data and statuses, with the CPU time it took.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import itertools
import json
import os
import re
import shutil
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from bench.errors import BenchError
from bench.status_delay import serve_delayed
from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
from hypha.standin.data_service.assets import (
    AssetKind,
    AssetSpec,
    build_model,
    cache_key,
    ensure_assets,
)
from hypha.standin.demo import supervise
from hypha.standin.worker.worker import ExecutorEntry, LocalWorker

DELAYS_MS = (0, 50)
BASELINE = "bare"
EXECUTOR = "executor"
SPLIT = ("reload", "first step", "training", "waiting")
ROUND_LINE = re.compile(r"\[w\d+\] round (\d+): ")
PART = re.compile(r"(\w+) ([\d.]+) ms")
# One torch thread each, as two workers sharing two cores should; and the near-free model
# is remote code, which this project's executor runs only when told it may.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "HYPHA_TRUST_REMOTE_CODE": "1"}
DROPOUT_MODEL = "demo-dropout"
BARE_EVAL = "bare-eval"
BARE_SCRIPT = Path(__file__).resolve().with_name("bare_executor.py")


NEAR_FREE_CODE = ("configuration_near_free.py", "modeling_near_free.py")


@dataclass(frozen=True)
class NearFreeSpec(AssetSpec):
    """The demo's data, and a model of a few weights whose step costs almost nothing
    (bench/near_free_code, shipped as remote code as Hypha's default job ships its LeNet)."""

    model_repository: ClassVar[str] = "local/near-free"
    model_filenames: ClassVar[tuple[str, ...]] = (
        "config.json",
        "model.safetensors",
        *NEAR_FREE_CODE,
    )

    def cache_key(self) -> str:
        return cache_key("near-free-v1", asdict(self))

    def write_model(self, folder: Path) -> None:
        from bench.near_free_code.configuration_near_free import NearFreeConfig
        from bench.near_free_code.modeling_near_free import NearFreeForCausalLM

        NearFreeForCausalLM(NearFreeConfig(vocab_size=self.vocab_size)).save_pretrained(folder)
        for name in NEAR_FREE_CODE:
            shutil.copyfile(Path(__file__).with_name("near_free_code") / name, folder / name)
        config = json.loads((folder / "config.json").read_text())
        config["auto_map"] = {
            "AutoConfig": "configuration_near_free.NearFreeConfig",
            "AutoModelForCausalLM": "modeling_near_free.NearFreeForCausalLM",
        }
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


@dataclass(frozen=True)
class UntiedSpec(AssetSpec):
    """The demo's assets, but for a GPT-2 whose output layer is its own tensor, with the
    given dropout (embeddings, attention and residuals alike)."""

    tied: bool = False
    dropout: float = 0.0

    def write_model(self, folder: Path) -> None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model = build_model(self)
        model.config.tie_word_embeddings = self.tied
        for name in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
            setattr(model.config, name, self.dropout)
        untied = type(model)(model.config)
        untied.load_state_dict(model.state_dict())  # the same starting weights, copied apart
        untied.save_pretrained(folder)


# Hypha's own executor never puts its model in train mode (from_pretrained gives it in eval
# mode), so dropout never fires there. The `demo` GPT-2 therefore has none, which makes every
# executor do the same arithmetic a step; `demo-dropout` keeps GPT-2's default 0.1, and runs
# `bare-eval` beside the others to show what leaving dropout out is worth.
MODELS: dict[str, AssetKind] = {
    "demo": UntiedSpec(),
    DROPOUT_MODEL: UntiedSpec(dropout=0.1),
    "near-free": NearFreeSpec(),
}


class ChildrenCpu:
    """Samples the CPU time of this process's children (the executors) in the background,
    from /proc, so that any executor's CPU in a wall-clock window can be read afterwards."""

    def __init__(self, period_s: float = 0.02) -> None:
        self._period_s = period_s
        self._samples: list[tuple[float, float]] = []  # (time.time(), children's CPU s)
        self._seen: dict[int, float] = {}  # pid -> CPU seconds when last read
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="children-cpu", daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> ChildrenCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        parent = os.getpid()
        while True:
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    fields = (entry / "stat").read_text().rpartition(")")[2].split()
                except OSError:
                    continue  # gone meanwhile
                if int(fields[1]) == parent:  # ppid; utime and stime follow at 11 and 12
                    self._seen[int(entry.name)] = (int(fields[11]) + int(fields[12])) / self._tick
            self._samples.append((time.time(), sum(self._seen.values())))
            if self._stop.wait(self._period_s):
                return

    def between(self, start: float, end: float) -> float:
        """The children's CPU seconds between two time.time() instants (nearest samples)."""
        times = [at for at, _ in self._samples]
        first = min(bisect.bisect_left(times, start), len(times) - 1)
        last = min(bisect.bisect_left(times, end), len(times) - 1)
        return self._samples[last][1] - self._samples[first][1]


@dataclass
class Run:
    """One executor's run of the job at one delay."""

    samples_per_s: float  # per worker, rounds 2..
    cpu_ms_per_batch: float  # the executors' CPU (all threads) over rounds 2.., per batch
    cpu_ms_per_round: float  # the same per round and worker
    split_s: dict[str, float]  # per round and worker, medians over rounds 2..
    timing: dict[str, float]  # the executor's own timing line, per round, medians over 2..


@dataclass
class RoundsResult:
    model: str  # one of MODELS
    executors: list[str]
    delays_ms: tuple[int, ...]
    rounds: int
    steps_per_round: int
    batch_size: int
    # runs[delay][executor]: one per repeat, in the order they ran
    runs: dict[int, dict[str, list[Run]]] = field(default_factory=dict)

    @property
    def same_work(self) -> bool:
        """Whether every executor does the same arithmetic a step: not with dropout, which
        Hypha's own executor leaves off."""
        return self.model != DROPOUT_MODEL

    @property
    def others(self) -> list[str]:
        """The executors given with `--against`."""
        return [name for name in self.executors if name not in (BASELINE, BARE_EVAL, EXECUTOR)]

    def median(self, delay: int, name: str) -> float:
        return statistics.median(run.samples_per_s for run in self.runs[delay][name])

    def ratio(self, delay: int, name: str, against: str) -> float:
        """The median over repeats of the two executors' ratio within each repeat."""
        pairs = zip(self.runs[delay][name], self.runs[delay][against], strict=True)
        return statistics.median(a.samples_per_s / b.samples_per_s for a, b in pairs)

    def split(self, delay: int, name: str) -> dict[str, float]:
        runs = self.runs[delay][name]
        keys = {key for run in runs for key in (*run.split_s, *run.timing)}
        return {
            key: statistics.median([run.split_s.get(key, run.timing.get(key, 0.0)) for run in runs])
            for key in sorted(keys)
        }

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["runs"] = {
            str(d): {n: [asdict(r) for r in rs] for n, rs in by.items()}
            for d, by in self.runs.items()
        }
        return data


def executor_entries(against: dict[str, Path], bare_eval: bool = False) -> dict[str, ExecutorEntry]:
    """The executors to run, the baseline first."""
    args = ("--socket", "{SOCKET_PATH}", "--work-dir", "{WORK_DIR}")
    module = ("-m", "hypha.accelerate_executor.training", *args, "--job", "{JOB_JSON}")
    entries = {BASELINE: ExecutorEntry(sys.executable, (str(BARE_SCRIPT), *args))}
    if bare_eval:
        entries[BARE_EVAL] = ExecutorEntry(sys.executable, (str(BARE_SCRIPT), *args, "--eval-mode"))
    entries[EXECUTOR] = ExecutorEntry(sys.executable, module)
    for name, path in against.items():
        if path.is_dir():
            source = path / "src"
            package = source / "hypha" / "accelerate_executor"
            # Either layout: training.py before the folders, training/ after (issue 29).
            if not any(
                (package / name).is_file() for name in ("training.py", "training/__main__.py")
            ):
                raise BenchError(f"--against {name}: {source} holds no hypha.accelerate_executor")
            entries[name] = ExecutorEntry(sys.executable, module, (("PYTHONPATH", str(source)),))
        elif path.is_file():
            entries[name] = ExecutorEntry(str(path), module)
        else:
            raise BenchError(f"--against {name}: {path} is neither a Python nor a source tree")
    return entries


def one_run(
    entry: ExecutorEntry,
    spec: AssetKind,
    options: RunOptions,
    delay_ms: int,
    work_base: Path,
    timeout_s: float,
) -> Run:
    assets = ensure_assets(spec=spec)
    echoed = io.StringIO()
    with (
        build_coordinator(
            Catalog.from_assets(assets), options, name="bench-coordinator"
        ) as coordinator,
        contextlib.redirect_stdout(_Tee(echoed, sys.stderr)),
    ):
        workers = [
            LocalWorker(f"w{i + 1}", entry, work_base, env=WORKER_ENV)
            for i in range(options.workers)
        ]
        failures: list[BaseException] = []
        threads = [
            threading.Thread(
                target=serve_delayed, args=(coordinator, w, delay_ms / 1e3, failures), daemon=True
            )
            for w in workers
        ]
        with ChildrenCpu() as cpu:
            for thread in threads:
                thread.start()
            supervise(coordinator, lambda: not any(t.is_alive() for t in threads), timeout_s)
        summary = coordinator.summary()
    records = summary["workers"]
    if failures or any(record["exit_code"] != 0 for record in records.values()):
        codes = {name: record["exit_code"] for name, record in records.items()}
        raise BenchError(f"{' '.join(entry.args[:2])} failed at {delay_ms} ms: {failures or codes}")
    start, end = _timed_window(records)
    rounds = [r for record in records.values() for r in record["rounds"][1:]]
    samples, batches = sum(r["samples"] for r in rounds), sum(r["batches"] for r in rounds)
    return Run(
        samples / (end - start) / options.workers,
        1e3 * cpu.between(start, end) / batches,
        1e3 * cpu.between(start, end) / (options.rounds - 1) / options.workers,
        _split(records),
        _timing(echoed.getvalue()),
    )


def _timed_window(records: dict[str, Any]) -> tuple[float, float]:
    """From round 1's update being pushed to the last round's."""
    pushed = [
        [r["aggregated_at"] for r in record["rounds"] if r["aggregated_at"] is not None]
        for record in records.values()
    ]
    start, end = min(p[0] for p in pushed), max(p[-1] for p in pushed)
    if end <= start:
        raise BenchError("the coordinator recorded fewer than two rounds")
    return start, end


def _split(records: dict[str, Any]) -> dict[str, float]:
    parts: dict[str, list[float]] = {name: [] for name in SPLIT}
    for record in records.values():
        rounds = record["rounds"]
        for previous, current in itertools.pairwise(rounds):
            marks = (
                previous["aggregated_at"],
                previous["received_at"],
                current["first_status_at"],
                current["update_at"],
                current["aggregated_at"],
            )
            if any(mark is None for mark in marks):
                continue
            for name, begin, end in zip(SPLIT, marks, marks[1:], strict=False):
                parts[name].append(end - begin)
    return {name: statistics.median(values) for name, values in parts.items() if values}


def _timing(output: str) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for line in output.splitlines():
        match = ROUND_LINE.search(line)
        if match is None or int(match.group(1)) < 2:
            continue
        for key, value in PART.findall(line):
            values.setdefault(key, []).append(float(value) / 1e3)
    return {key: statistics.median(samples) for key, samples in values.items()}


class _Tee(io.TextIOBase):
    def __init__(self, *streams: Any) -> None:
        self._streams = streams

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()


def run(
    work_base: Path,
    options: RunOptions,
    repeats: int,
    against: dict[str, Path] | None = None,
    delays_ms: tuple[int, ...] = DELAYS_MS,
    model: str = "demo",
    timeout_s: float = 900.0,
) -> RoundsResult:
    """`options`: workers, rounds (at least 2; the first is left out) and batches per round."""
    if options.rounds < 2:
        raise BenchError("the rounds benchmark needs at least 2 rounds (the first is warm-up)")
    entries = executor_entries(against or {}, bare_eval=model == DROPOUT_MODEL)
    spec = MODELS[model]
    result = RoundsResult(
        model, list(entries), delays_ms, options.rounds, options.steps_per_round, options.batch_size
    )
    result.runs = {delay: {name: [] for name in entries} for delay in delays_ms}
    for _ in range(repeats):
        for delay in delays_ms:
            for name, entry in entries.items():
                run_ = one_run(entry, spec, options, delay, work_base, timeout_s)
                result.runs[delay][name].append(run_)
    return result
