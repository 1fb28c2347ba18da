"""On a GPU machine: do the executor's GPU metrics (NVML through nvidia-ml-py) carry real
utilisation and memory? (docs/telemetry.md)

    PYTHONPATH=src python3 bench/gpu_acceptance/telemetry_gpu.py

Keeps GPU 0 busy with matrix products on 2 GiB of its memory, meanwhile exports the
executor's process and GPU metrics (telemetry.Telemetry, as a rank does) to the stand-in's
OTLP receiver on loopback, then prints every hw.gpu.* point that arrived. Exits 1 unless
some utilisation point is above 0.5 and some memory point above 2 GiB.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import torch

from hypha.accelerate_executor.telemetry import Telemetry
from hypha.standin.otlp_receiver import Receiver

GIB = 1 << 30


def main() -> int:
    receiver = Receiver(("127.0.0.1", 0))
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    # Read by the SDK, from the process's environment, as in a rank.
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.url
    os.environ["OTEL_METRIC_EXPORT_INTERVAL"] = "1000"
    exporting = Telemetry("gpu-check", 0, os.environ)
    held = torch.empty(2 * GIB, dtype=torch.uint8, device="cuda")
    a = torch.randn(8192, 8192, device="cuda")
    end = time.monotonic() + 8
    while time.monotonic() < end:
        a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    exporting.round_ended({"loss": 1.0})
    exporting.flush(10.0)
    del held
    gpu = [i for i in receiver.items if i.name.startswith("hw.gpu.")]
    for item in gpu:
        print(item.name, item.value, item.attributes)
    busy = max((i.value for i in gpu if i.name == "hw.gpu.utilization"), default=0.0)
    used = max((i.value for i in gpu if i.name == "hw.gpu.memory.usage"), default=0)
    print(f"max utilization {busy:.2f}, max memory used {used / GIB:.2f} GiB")
    return 0 if busy > 0.5 and used > 2 * GIB else 1


if __name__ == "__main__":
    sys.exit(main())
