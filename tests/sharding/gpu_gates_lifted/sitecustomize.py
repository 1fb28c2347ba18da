"""On PYTHONPATH, every Python process started lifts accelerate's GPU-only gates at once
(lift_gpu_gates.py): the project's launcher, `accelerate launch` and the ranks they start run
as on a GPU host, with nothing of the product changed."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lift_gpu_gates  # noqa: F401
