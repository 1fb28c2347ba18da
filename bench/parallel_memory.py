"""What every rank holds at its peak over a whole training job, under each parallel layout.

    python bench/parallel_memory.py [--quick] [--sizes 50m,200m] [--ranks 2,4]
        [--cases ddp,fsdp2,zero3,tp,tp-fsdp2] [--rounds 2] [--steps-per-round 3]
        [--configs DIR] [--baseline-tree PATH] [--gpu] [--out DIR]

With --gpu (a host with GPUs: bench/gpu_acceptance/run.sh's `parallel` part) the configs run
as shipped, one rank per GPU in bf16, and each rank's device peak (the executor's own
max-allocated, from its round lines) stands beside its host one.

Each case is one job of the local stand-in (one worker, alpha.17 bridges) run as
tests/system/test_accelerate_configs.py runs it: the launcher's own plan for the case's
accelerate config (`platform.launcher.plan`: `accelerate launch --config_file ... --num_processes
N ...`), the config copied in fp32 (`mixed_precision: 'no'`) and, for the sharded layouts, with
`use_cpu: true` and ACCELERATE_USE_CPU=True so that the ranks join over gloo. The one change
to that command: `-m hypha.accelerate_executor.training` becomes bench/parallel_memory_rank.py,
which lifts accelerate's GPU-only gates as a GPU host would (FSDP's distributed type, TP's
`multi_device`), runs the executor's main() and writes the rank's VmHWM once it returned.

  case      config (in --configs, default accelerate-configs/)   gates lifted
  ddp       multi-cpu.yaml                                       -
  fsdp2     fsdp.yaml                                            fsdp
  zero3     deepspeed-zero3.yaml                                 -
  tp        tp.yaml (parallelism_config_tp_size)                 tp
  tp-fsdp2  tp-fsdp.yaml (dp_shard_size x tp_size), 4 ranks only tp
  ddp-ckpt, fsdp2-ckpt: ddp and fsdp2 with HYPHA_GRADIENT_CHECKPOINTING=on (no baseline tree
            run: the baseline has no such setting)

A case whose config file is missing is skipped with one line saying so.

The model: a Llama (transformers LlamaConfig, random init, untied output layer) written as a
model folder the stand-in serves in place of its tiny GPT-2, on the stand-in's Markov data
(its 512-token alphabet is a subset of the model's vocabulary); every size's head count
divides by 4, for tensor parallelism. Measured per case: each rank's VmHWM (peak resident set
over the whole job, absolute: nothing subtracted), its largest rank against DDP's largest
rank at the same ranks and size in the same run, and the sync seconds per round: the
executor's own `sync X s` of its alpha.17 round lines (synchroniser.PARTS but the wait for
the parameter server: gathering and writing the pseudo-gradient, sending it, merging and
loading the update, reporting), the mean over the job's rounds. With --baseline-tree, every
case also runs on that checkout's src/ (stand-in and executor alike), the trees taking turns
case by case, and the sync time is given as a ratio to the baseline's.

Once per run: the resident peak of a Python that imported torch, and of one that imported the
executor's training module, so that a reader can subtract what any rank pays before it
loads a model. Progress goes to stderr, the table to stdout, results.json and every run's
output to --out (default bench/results/parallel-memory/).

A guard: the machine is shared, and DDP's 4 ranks of the 200M model come near its memory.
While a job runs, MemAvailable is watched; below --reserve-gb the job's processes are
killed (by pid, the ones this bench started) and the case is reported as stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

REPO = Path(__file__).resolve().parents[1]
if __name__ == "__main__" and sys.path[0] == str(REPO / "bench"):
    # `python bench/parallel_memory.py` puts bench/ first on sys.path; the `bench` package
    # needs its parent. A --one child keeps its PYTHONPATH's hypha (a baseline tree's) first.
    sys.path.insert(1, str(REPO))

from hypha.standin.data_service.assets import AssetSpec, cache_key  # noqa: E402

RANK_SCRIPT = REPO / "bench" / "parallel_memory_rank.py"
DEFAULT_OUT = REPO / "bench" / "results" / "parallel-memory"
WORKER = "w1"
GB = 1e9
KB = 1024


@dataclass(frozen=True)
class Case:
    name: str
    config: str  # file name in --configs
    lifts: tuple[str, ...]  # the GPU-only gates of accelerate's it needs lifted on the CPU
    ranks: tuple[int, ...] | None = None  # None: every --ranks
    # The goal for the largest rank against DDP's, by rank count (None: at any).
    goals: dict[int | None, float] = field(default_factory=dict)
    # HYPHA_GRADIENT_CHECKPOINTING=on: a rank's activations, which no sharding divides (they
    # are its share of the batch's), recomputed in the backward instead of kept.
    checkpointing: bool = False


CASES: dict[str, Case] = {
    case.name: case
    for case in (
        Case("ddp", "multi-cpu.yaml", ()),
        Case("fsdp2", "fsdp.yaml", ("fsdp",), goals={2: 0.55, 4: 0.3}),
        Case("zero3", "deepspeed-zero3.yaml", ()),
        Case("tp", "tp.yaml", ("tp",), goals={None: 0.65}),
        Case("tp-fsdp2", "tp-fsdp.yaml", ("tp",), ranks=(4,)),  # 2 x 2
        Case("ddp-ckpt", "multi-cpu.yaml", (), checkpointing=True),
        Case("fsdp2-ckpt", "fsdp.yaml", ("fsdp",), goals={2: 0.55, 4: 0.3}, checkpointing=True),
    )
}
BASELINE_CASE = "ddp"


@dataclass(frozen=True)
class BenchLlama(AssetSpec):
    """The stand-in's causal-LM data, and a Llama of the given shape in place of its GPT-2.
    Not the stand-in's own LlamaSpec: the baseline tree a run compares with (4a389a6) has only
    AssetSpec, and the same class must build both trees' assets."""

    model_vocab: int = 32000
    hidden: int = 512
    layers: int = 6
    heads: int = 8
    intermediate: int = 1408

    model_repository: ClassVar[str] = "local/bench-llama"
    model_filenames: ClassVar[tuple[str, ...]] = (
        "config.json",
        "model.safetensors",
        "generation_config.json",
    )

    def cache_key(self) -> str:
        return cache_key("bench-llama-v1", asdict(self))

    @property
    def parameters(self) -> int:
        """Counted from the shape (embedding, untied output layer, blocks, final norm)."""
        block = 4 * self.hidden**2 + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return 2 * self.model_vocab * self.hidden + self.layers * block + self.hidden

    def write_model(self, folder: Path) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        config = LlamaConfig(
            vocab_size=self.model_vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.heads,
            max_position_embeddings=self.seq_len,
            # Untied: a tensor-parallel plan shards the output layer and the embedding apart.
            tie_word_embeddings=False,
            bos_token_id=0,
            eos_token_id=0,
        )
        torch.manual_seed(self.seed)
        LlamaForCausalLM(config).save_pretrained(folder)


SIZES: dict[str, BenchLlama] = {
    # --quick's smoke size, about 5.3M.
    "5m": BenchLlama(model_vocab=4096, hidden=256, layers=4, heads=4, intermediate=688),
    "50m": BenchLlama(model_vocab=32000, hidden=512, layers=6, heads=8, intermediate=1408),  # 52M
    "200m": BenchLlama(
        model_vocab=32000, hidden=1024, layers=10, heads=16, intermediate=2816
    ),  # 194M
}
SYNC_LINE = re.compile(rf"\[{WORKER}\] round (\d+): .*\| sync ([\d.]+) s \(")
# A round's batches and the time its steps took (the round line's `step X ms`).
STEP_LINE = re.compile(rf"\[{WORKER}\] round (\d+): .*?\| (\d+) batches,.*?\| step ([\d.]+) ms")
# The executor's own per-rank GPU peaks (max-allocated), in its round lines on a GPU.
DEVICE_PEAKS = re.compile(rf"\[{WORKER}\] round \d+: .*\| peak device ([\d./]+) GB")
TREE_THIS, TREE_BASELINE = "this", "baseline"
# What a rank holds before it loads a model: torch alone, and the libraries the executor
# trains with (its own modules import them lazily, so importing those says little).
IMPORTS = ("torch", "torch, accelerate, transformers.models.llama.modeling_llama")


@dataclass
class Result:
    case: str
    ranks: int
    size: str
    tree: str
    status: str  # ok, failed (exit N), stopped (...), no peaks
    seconds: float
    peaks_gb: list[float] = field(default_factory=list)  # by rank
    sync_s: list[float] = field(default_factory=list)  # by round
    step_s: list[float] = field(default_factory=list)  # a batch's step, by round
    device_peaks_gb: list[float] = field(default_factory=list)  # by rank, with --gpu
    log: str = ""

    @property
    def largest_gb(self) -> float | None:
        return max(self.peaks_gb) if self.peaks_gb else None

    @property
    def sync_mean_s(self) -> float | None:
        return statistics.mean(self.sync_s) if self.sync_s else None

    @property
    def step_mean_s(self) -> float | None:
        return statistics.mean(self.step_s) if self.step_s else None


def say(text: str) -> None:
    print(f"parallel-memory: {text}", file=sys.stderr, flush=True)


# The child: one case's job --------------------------------------------------------------


def fp32_config(source: Path, folder: Path, use_cpu: bool, gpu: bool = False) -> Path:
    """The config as shipped but in fp32 (as the system test runs it), and with the sharded
    layouts' ranks on the CPU over gloo; on GPUs (`gpu`), the config as shipped."""
    text = source.read_text(encoding="utf-8")
    if use_cpu and not gpu:
        text = text.replace("use_cpu: false", "use_cpu: true")
    if not gpu:
        text = re.sub(r"mixed_precision: \S+", "mixed_precision: 'no'", text)
    path = folder / source.name
    path.write_text(text, encoding="utf-8")
    return path


def one_job(spec: dict[str, object]) -> int:
    """Runs one case's job under the stand-in (in this child, whose PYTHONPATH names the tree
    under test) and prints the executor's exit code."""
    from hypha.accelerate_executor.platform.launcher.plan import TRAINING_MODULE, plan
    from hypha.standin.coordinator.client import CoordinatorClient
    from hypha.standin.coordinator.server import Catalog, RunOptions, build_coordinator
    from hypha.standin.data_service.assets import ensure_assets
    from hypha.standin.worker.worker import ExecutorEntry, LocalWorker, serve_one_job

    case = CASES[str(spec["case"])]
    ranks = int(str(spec["ranks"]))
    options = RunOptions(
        workers=1,
        rounds=int(str(spec["rounds"])),
        steps_per_round=int(str(spec["steps_per_round"])),
        generation="alpha17",
    )
    assets = ensure_assets(Path(str(spec["assets"])), SIZES[str(spec["size"])])
    coordinator = build_coordinator(Catalog.from_assets(assets), options)
    coordinator.start()
    # Short (a socket path must fit 107 bytes).
    with tempfile.TemporaryDirectory(prefix="hy-pmem-", dir="/tmp") as folder:
        work_base = Path(folder)
        gpu = bool(spec.get("gpu"))
        config = fp32_config(Path(str(spec["config"])), work_base, bool(case.lifts), gpu)
        arguments = argparse.Namespace(
            accelerate_config=str(config),
            num_processes=ranks,
            socket="{SOCKET_PATH}",
            work_dir="{WORK_DIR}",
            job="{JOB_JSON}",
        )
        launch = plan(arguments, os.environ)
        command = list(launch.command)
        at = command.index(TRAINING_MODULE)
        command[at - 1 : at + 1] = [str(RANK_SCRIPT)]  # the rank wrapper in place of `-m ...`
        env = {**launch.env, "HYPHA_BENCH_PEAKS": str(spec["peaks"])}
        if case.lifts and not gpu:
            env["ACCELERATE_USE_CPU"] = "True"  # gloo, as accelerate's CPU path joins
        if case.checkpointing:
            env["HYPHA_GRADIENT_CHECKPOINTING"] = "on"
        # The ranks share the cores: oversubscribed torch threads only slow every rank.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ranks))
        print(f"parallel-memory: command: {' '.join(command)}", flush=True)
        entry = ExecutorEntry(command[0], tuple(command[1:]), tuple(env.items()))
        try:
            code = serve_one_job(
                CoordinatorClient(coordinator.url), LocalWorker(WORKER, entry, work_base)
            )
        finally:
            coordinator.stop()
    print(f"parallel-memory: executor exit code {code}", flush=True)
    return 0


# The parent: cases, trees, the guard ----------------------------------------------------


def mem_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * KB / GB
    return float("inf")


def descendants(root: int) -> list[int]:
    """The pids below `root` (children first found, then theirs), read from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, queue = [], [root]
    while queue:
        for child in parents.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def kill_tree(root: int) -> None:
    """SIGKILL to `root` and every process below it: all started by this bench."""
    for pid in [*descendants(root), root]:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.kill(pid, signal.SIGKILL)


def run_case(
    case: Case,
    ranks: int,
    size: str,
    tree: tuple[str, Path],
    args: argparse.Namespace,
    assets: Path,
) -> Result:
    name, root = tree
    label = f"{case.name}-{ranks}-{size}-{name}"
    peaks = Path(tempfile.mkdtemp(prefix=f"peaks-{label}-"))
    spec = {
        "case": case.name, "ranks": ranks, "size": size, "rounds": args.rounds,
        "steps_per_round": args.steps_per_round, "assets": str(assets), "peaks": str(peaks),
        "config": str(args.configs / case.config), "gpu": args.gpu,
    }  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(REPO)])}
    command = [sys.executable, str(Path(__file__).resolve()), "--one", json.dumps(spec)]
    log_path = args.out / f"{label}.log"
    say(f"{label}: running (the log: {log_path})")
    started = time.perf_counter()
    status = ""
    with log_path.open("wb") as log:
        child = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            cwd=REPO,
        )  # fmt: skip
        deadline = time.monotonic() + args.timeout
        while child.poll() is None:
            if mem_available_gb() < args.reserve_gb:
                status = f"stopped (MemAvailable under {args.reserve_gb:g} GB)"
            elif time.monotonic() > deadline:
                status = f"stopped (past {args.timeout:g} s)"
            if status:
                kill_tree(child.pid)
                child.wait()
                break
            time.sleep(0.2)
    seconds = time.perf_counter() - started
    output = log_path.read_text(encoding="utf-8", errors="replace")
    result = Result(case.name, ranks, size, name, status, round(seconds, 1), log=str(log_path))
    records = [json.loads(p.read_text()) for p in sorted(peaks.glob("rank-*.json"))]
    records.sort(key=lambda record: record["rank"])
    result.peaks_gb = [record["VmHWM"] * KB / GB for record in records]
    by_round = {int(m.group(1)): float(m.group(2)) for m in SYNC_LINE.finditer(output)}
    result.sync_s = [by_round[number] for number in sorted(by_round)]
    steps = {int(m.group(1)): float(m.group(3)) / 1000 / max(1, int(m.group(2)))
             for m in STEP_LINE.finditer(output)}  # fmt: skip
    result.step_s = [steps[number] for number in sorted(steps)]
    device = DEVICE_PEAKS.findall(output)
    if device:  # the last round's: the peak over the whole job so far
        result.device_peaks_gb = [float(value) for value in device[-1].split("/")]
    code = re.search(r"parallel-memory: executor exit code (-?\d+)", output)
    if not result.status:
        if code is None or int(code.group(1)) != 0:
            result.status = f"failed (exit {code.group(1) if code else '?'})"
        elif len(records) != ranks:
            result.status = f"{len(records)} of {ranks} peaks"
        else:
            result.status = "ok"
    say(f"{label}: {result.status} in {seconds:.0f} s; peaks GB {fmt_list(result.peaks_gb)}; "
        f"sync s {fmt_list(result.sync_s, 3)}")  # fmt: skip
    for path in peaks.iterdir():
        path.unlink()
    peaks.rmdir()
    return result


def import_peak_gb(modules: str) -> float:
    """VmHWM of a fresh Python that imported `modules`: what any rank pays before a model."""
    code = (
        f"import {modules}, pathlib\n"
        "for line in pathlib.Path('/proc/self/status').read_text().splitlines():\n"
        "    if line.startswith('VmHWM:'): print(line.split()[1])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return int(done.stdout.split()[-1]) * KB / GB


def projection(
    results: list[Result], case: str, ranks: int, size: str, floor_gb: float
) -> float | None:
    """The memory a case's job would take at `size`, from the same case and ranks at a smaller
    size in this run: every rank's peak scaled as the floor of a rank that imported the
    libraries plus a part proportional to the parameters; the stand-in's parameter server
    holds a few copies of them besides. None when nothing smaller ran."""
    parameters = SIZES[size].parameters
    smaller = [
        r for r in results
        if r.case == case and r.ranks == ranks and r.status == "ok" and r.peaks_gb
        and SIZES[r.size].parameters < parameters
    ]  # fmt: skip
    if not smaller:
        return None
    known = max(smaller, key=lambda r: SIZES[r.size].parameters)
    scale = parameters / SIZES[known.size].parameters
    ranks_gb = sum(floor_gb + max(0.0, peak - floor_gb) * scale for peak in known.peaks_gb)
    return ranks_gb + 4 * parameters * 4 / GB


# The table ------------------------------------------------------------------------------


def fmt_list(values: Sequence[float], digits: int = 2) -> str:
    return "/".join(f"{value:.{digits}f}" for value in values) or "-"


def goal_of(case: Case, ranks: int) -> float | None:
    return case.goals.get(ranks, case.goals.get(None))


def table(results: list[Result], floor_gb: float) -> list[dict[str, object]]:
    """Rows of this tree's results, with the ratios derived from the same run; `floor_gb`,
    what a rank holds before it loads a model, taken off both sides in the second ratio (what
    the model and its training cost, which sharding divides)."""
    mine = {(r.case, r.ranks, r.size): r for r in results if r.tree == TREE_THIS}
    theirs = {(r.case, r.ranks, r.size): r for r in results if r.tree == TREE_BASELINE}
    rows: list[dict[str, object]] = []
    for (case, ranks, size), result in mine.items():
        ddp = mine.get((BASELINE_CASE, ranks, size))
        ratio = above = None
        # Only whole jobs: a rank that failed early has a low peak that proves nothing.
        ok = ddp is not None and ddp.status == result.status == "ok"
        if ok and ddp is not None and ddp.largest_gb and result.largest_gb:
            ratio = result.largest_gb / ddp.largest_gb
            above = (result.largest_gb - floor_gb) / (ddp.largest_gb - floor_gb)
        goal = goal_of(CASES[case], ranks)
        base = theirs.get((case, ranks, size))
        sync_ratio = step_ratio = peak_ratio = None
        ok = base is not None and base.status == result.status == "ok"
        if ok and base is not None:
            if base.sync_mean_s and result.sync_mean_s:
                sync_ratio = result.sync_mean_s / base.sync_mean_s
            if base.step_mean_s and result.step_mean_s:
                step_ratio = result.step_mean_s / base.step_mean_s
            if base.largest_gb and result.largest_gb:
                peak_ratio = result.largest_gb / base.largest_gb
        verdict = "-"
        if goal is not None and ratio is not None:
            verdict = "met" if ratio <= goal else "GAP"
        rows.append(
            {
                "case": case, "ranks": ranks, "size": size, "status": result.status,
                "peaks_gb": [round(p, 4) for p in result.peaks_gb],
                "device_peaks_gb": result.device_peaks_gb,
                "largest_vs_ddp": None if ratio is None else round(ratio, 3),
                "above_floor_vs_ddp": None if above is None else round(above, 3),
                "goal": goal, "verdict": verdict,
                "sync_s": None if result.sync_mean_s is None else round(result.sync_mean_s, 3),
                "baseline_sync_s": None if base is None or base.sync_mean_s is None
                else round(base.sync_mean_s, 3),
                "baseline_peaks_gb": None if base is None else [round(p, 4) for p in base.peaks_gb],
                "sync_vs_baseline": None if sync_ratio is None else round(sync_ratio, 3),
                "step_s": None if result.step_mean_s is None else round(result.step_mean_s, 3),
                "step_vs_baseline": None if step_ratio is None else round(step_ratio, 3),
                "largest_vs_baseline": None if peak_ratio is None else round(peak_ratio, 3),
            }
        )  # fmt: skip
    return rows


def print_table(rows: list[dict[str, object]], with_baseline: bool) -> None:
    def num(value: object, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    on_gpu = any(row["device_peaks_gb"] for row in rows)
    header = ["case", "ranks", "size", "peak GB by rank", "largest / DDP",
              "above the floor / DDP", "goal", "sync s/round", "step s/batch"]  # fmt: skip
    if on_gpu:  # the ratio and goal are then the host's; the device's peaks beside them
        header.insert(4, "device peak GB by rank")
    if with_baseline:
        header += ["baseline sync s", "sync / baseline", "largest / baseline", "step / baseline"]
    header.append("status")
    lines = [header]
    for row in rows:
        goal = row["goal"]
        line = [
            str(row["case"]), str(row["ranks"]), str(row["size"]),
            fmt_list(row["peaks_gb"]),  # type: ignore[arg-type]
            num(row["largest_vs_ddp"]),
            num(row["above_floor_vs_ddp"]),
            "-" if goal is None else f"<= {goal:g} ({row['verdict']})",
            num(row["sync_s"], 3),
            num(row["step_s"], 2),
        ]  # fmt: skip
        if on_gpu:
            line.insert(4, fmt_list(row["device_peaks_gb"]))  # type: ignore[arg-type]
        if with_baseline:
            line += [num(row["baseline_sync_s"], 3), num(row["sync_vs_baseline"]),
                     num(row["largest_vs_baseline"]), num(row["step_vs_baseline"])]  # fmt: skip
        line.append(str(row["status"]))
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for line in lines[1:]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |")


# The command line -----------------------------------------------------------------------


FULL = {"sizes": "50m,200m", "ranks": "2,4", "cases": ",".join(CASES), "rounds": 2,
        "steps_per_round": 3}  # fmt: skip
QUICK = {"sizes": "5m", "ranks": "2", "cases": "ddp,fsdp2", "rounds": 2, "steps_per_round": 2}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one case's job
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: the 5M model, 2 ranks, ddp and fsdp2, 2 rounds of 2 "
                        "batches (options given beside it still count)")  # fmt: skip
    parser.add_argument("--sizes", help=f"of {', '.join(SIZES)} (default 50m,200m)")
    parser.add_argument("--ranks", help="default 2,4")
    parser.add_argument("--cases", help=f"of {', '.join(CASES)} (default all)")
    parser.add_argument("--rounds", type=int, help="default 2")
    parser.add_argument("--steps-per-round", type=int, help="batches a round, default 3")
    parser.add_argument("--configs", type=Path, default=REPO / "accelerate-configs",
                        help="the accelerate configs' folder (default: this checkout's)")  # fmt: skip
    parser.add_argument("--baseline-tree", type=Path,
                        help="a checkout whose src/ runs the same cases, in turns (e.g. a "
                        "`git worktree add /tmp/base 4a389a6`)")  # fmt: skip
    parser.add_argument("--gpu", action="store_true",
                        help="on a GPU host: the configs as shipped (bf16, one rank per GPU), "
                        "and each rank's device peak beside its host one")  # fmt: skip
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--timeout", type=float, default=1800, help="per job, in seconds")
    parser.add_argument("--reserve-gb", type=float, default=2.0,
                        help="stop a job when the machine's MemAvailable falls below this")  # fmt: skip
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.one:
        return one_job(json.loads(args.one))
    # Smallest first: a larger model's need is projected from a smaller one's peaks.
    sizes = sorted(
        args.sizes.split(","), key=lambda size: SIZES[size].parameters if size in SIZES else 0
    )
    ranks_list = [int(r) for r in args.ranks.split(",")]
    cases = args.cases.split(",")
    unknown = [s for s in sizes if s not in SIZES] + [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"parallel-memory: unknown size or case: {', '.join(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    args.configs = args.configs.resolve()
    trees = [(TREE_THIS, REPO)]
    if args.baseline_tree is not None:
        if not (args.baseline_tree / "src" / "hypha").is_dir():
            raise SystemExit(f"parallel-memory: {args.baseline_tree} has no src/hypha")
        trees.append((TREE_BASELINE, args.baseline_tree.resolve()))
    from hypha.standin.data_service.assets import ensure_assets

    assets = args.out / "assets"
    for size in sizes:  # generated once, here, so both trees serve the same files
        say(f"model {size}: {SIZES[size].parameters / 1e6:.1f}M parameters")
        ensure_assets(assets, SIZES[size])
    imports = {modules: import_peak_gb(modules) for modules in IMPORTS}
    results: list[Result] = []
    turn = 0
    skipped: list[str] = []
    for size in sizes:
        for ranks in ranks_list:
            for name in cases:
                case = CASES[name]
                if case.ranks is not None and ranks not in case.ranks:
                    continue
                if not (args.configs / case.config).is_file():
                    line = f"{name}: skipped, no {case.config} in {args.configs}"
                    if line not in skipped:
                        skipped.append(line)
                        say(line)
                    continue
                projected = projection(results, name, ranks, size, imports[IMPORTS[-1]])
                available = mem_available_gb()
                if projected is not None and projected > available - args.reserve_gb:
                    line = (
                        f"{name} at {ranks} ranks, {size}: skipped, its ranks would need about "
                        f"{projected:.1f} GB (scaled from the smaller model's run) and "
                        f"{available:.1f} GB are available"
                    )
                    skipped.append(line)
                    say(line)
                    continue
                # The trees take turns going first, so that a busy spell of the machine
                # falls on both.
                order = trees if turn % 2 == 0 else trees[::-1]
                turn += 1
                for tree in order:
                    # A layout the baseline has no config for is this tree's alone, and so
                    # is checkpointing: the baseline tree has no such setting.
                    if tree[0] == TREE_BASELINE and (
                        case.checkpointing
                        or not (tree[1] / "accelerate-configs" / case.config).is_file()
                    ):
                        continue
                    results.append(run_case(case, ranks, size, tree, args, assets))
    with_baseline = len(trees) > 1
    rows = table(results, imports[IMPORTS[-1]])
    print_table(rows, with_baseline)
    for line in skipped:
        print(line)
    print(
        "peaks are each rank's VmHWM over the whole job, absolute; a fresh Python peaks at "
        + " and ".join(f"{gb:.2f} GB after `import {modules}`" for modules, gb in imports.items())
    )
    print(
        f"above the floor: both peaks less the last of those ({imports[IMPORTS[-1]]:.2f} GB), "
        "what the model and its training cost, which is what sharding can divide"
    )
    print(
        f"sync s/round: the executor's `sync X s` (alpha.17 round lines: all of PARTS but "
        f"the wait), mean of {args.rounds} rounds of {args.steps_per_round} batches; step "
        "s/batch: the round line's `step X ms` over its batches, mean of the rounds"
    )
    (args.out / "results.json").write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "parameters": {size: SIZES[size].parameters for size in sizes},
                "import_peaks_gb": imports,
                "rows": rows,
                "runs": [asdict(r) for r in results],
                "skipped": skipped,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
