"""The end of a local run: the verdict, summary.json and loss.png."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypha.standin.console import say
from hypha.standin.job_status import last_line

# The run passes when the last round's mean loss is at most this fraction of the first's.
LOSS_RATIO = 0.6


def round_losses(summary: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Round (as the executors number them) -> worker -> loss."""
    rounds: dict[int, dict[str, float]] = {}
    for name, worker in summary["workers"].items():
        for key, metrics in worker["metrics"].items():
            if "loss" in metrics:
                rounds.setdefault(int(key), {})[name] = float(metrics["loss"])
    return dict(sorted(rounds.items()))


def judge(summary: dict[str, Any]) -> dict[str, Any]:
    """The verdict and the figures it rests on, to merge into the summary."""
    options = summary["options"]
    expected = int(options["workers"]) + int(options.get("late_workers", 0))
    workers = summary["workers"]
    reasons = []
    if summary.get("cancelled"):
        reasons.append(f"the run was cancelled: {summary['cancelled']}")
    if len(workers) < expected:
        reasons.append(f"only {len(workers)} of {expected} workers got a job")
    for name, worker in sorted(workers.items()):
        if worker["exit_code"] != 0:
            failure = last_line((worker.get("status") or {}).get("err"))
            reasons.append(
                f"{name}'s executor exited with {worker['exit_code']}"
                + (f": {failure}" if failure else "")
            )
        reasons += [f"{name} broke the protocol: {violation}" for violation in worker["violations"]]
        reasons += [f"{name} leaked {leak}" for leak in worker["leaks"]]
    # Every worker applied every aggregate once: the global models agree (core._compare_digest).
    reasons += list(summary.get("digest_mismatches", []))
    reasons += list(summary.get("refused_broadcasts", []))
    rounds = round_losses(summary)
    means = {key: sum(losses.values()) / len(losses) for key, losses in rounds.items()}
    first = final = ratio = None
    if len(means) < 2:
        reasons.append(f"{len(means)} round(s) reported a loss; at least 2 are needed to judge it")
    else:
        first, final = means[min(means)], means[max(means)]
        ratio = final / first if first > 0 else None
        if ratio is None or ratio > LOSS_RATIO:
            reasons.append(
                f"the final mean loss {final:.3f} is not <= {LOSS_RATIO} x the first ({first:.3f})"
            )
    per_worker = {}
    for name in workers:
        own = {key: losses[name] for key, losses in rounds.items() if name in losses}
        per_worker[name] = {
            "first_loss": own[min(own)] if own else None,
            "final_loss": own[max(own)] if own else None,
        }
    return {
        "passed": not reasons,
        "reasons": reasons,
        "rounds": [
            {"round": key, "loss": losses, "mean_loss": means[key]}
            for key, losses in rounds.items()
        ],
        "first_mean_loss": first,
        "final_mean_loss": final,
        "loss_ratio": ratio,
        "worker_losses": per_worker,
    }


def finish(summary: dict[str, Any], out_dir: Path, prefix: str = "local") -> bool:
    """Writes summary.json and loss.png into `out_dir`, prints the verdict; True if it passed."""
    verdict = judge(summary)
    for name, losses in verdict.pop("worker_losses").items():
        summary["workers"][name].update(losses)
    summary = {**verdict, **summary}
    owner = _nearest_existing(out_dir).stat()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    plot_path = out_dir / "loss.png"
    plotted = bool(verdict["rounds"]) and plot_losses(verdict["rounds"], plot_path)
    if os.geteuid() == 0:
        # A coordinator running as root (compose) leaves its report, and any folder it made
        # for it, to whoever owns the output folder on the host.
        for path in (out_dir, out_dir / "summary.json", plot_path):
            if path.exists():
                os.chown(path, owner.st_uid, owner.st_gid)
    for name, worker in sorted(summary["workers"].items()):
        rate = worker["samples_per_s"]
        say(
            prefix,
            f"{name}: exit {worker['exit_code']}, {worker['rounds_completed']} rounds, "
            f"{'-' if rate is None else f'{rate:.1f}'} samples/s, loss {_number(worker['first_loss'])} -> {_number(worker['final_loss'])}",
        )
    say(
        prefix,
        f"wall time {summary['wall_s']:.1f} s; wrote {out_dir / 'summary.json'}"
        + (f" and {plot_path}" if plotted else ""),
    )
    if verdict["passed"]:
        say(
            prefix,
            f"PASSED: mean loss {verdict['first_mean_loss']:.3f} -> {verdict['final_mean_loss']:.3f} (x{verdict['loss_ratio']:.2f})",
        )
    else:
        say(prefix, "FAILED: " + "; ".join(verdict["reasons"]))
    return bool(verdict["passed"])


def _nearest_existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def plot_losses(rounds: list[dict[str, Any]], path: Path) -> bool:
    """Draws the per-worker and mean loss per round; False when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        # A slim coordinator image may lack it; the summary holds the same numbers.
        say("report", "matplotlib is not installed: no loss.png (pip install matplotlib)")
        return False

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.ticker import MaxNLocator

    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    names = sorted({name for entry in rounds for name in entry["loss"]})
    for name in names:
        points = [
            (entry["round"], entry["loss"][name]) for entry in rounds if name in entry["loss"]
        ]
        axes.plot(*zip(*points, strict=True), marker="o", linewidth=1, alpha=0.7, label=name)
    axes.plot(
        [entry["round"] for entry in rounds],
        [entry["mean_loss"] for entry in rounds],
        color="black",
        linewidth=2.5,
        marker="s",
        label="mean",
    )
    axes.set_xlabel("round")
    axes.set_ylabel("loss")
    axes.set_title(f"Local DiLoCo run: {len(names)} workers")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)
    return True
