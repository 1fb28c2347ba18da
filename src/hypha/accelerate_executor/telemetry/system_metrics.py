"""The process's and the GPUs' state as observable OpenTelemetry instruments, read by the
metric reader's thread at each collection, never by the training thread: CPU time and
utilisation and resident memory of this process (psutil, which accelerate already brings),
and per GPU its utilisation and memory through NVML's official bindings (nvidia-ml-py,
in the NVIDIA images) where NVML answers. Names follow OpenTelemetry's semantic conventions
(process.*, hw.gpu.*)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation


def observe_process_and_gpus(meter: Meter, gpus: bool) -> None:
    """Registers the process's instruments, and the GPUs' when `gpus` (one process per
    container asks, so that each GPU is reported once) and NVML is there."""
    import psutil  # type: ignore[import-untyped,unused-ignore]  # stubs not installed
    from opentelemetry.metrics import Observation

    process = psutil.Process()
    process.cpu_percent(None)  # the first call only starts the interval

    def cpu_time(options: CallbackOptions) -> Iterable[Observation]:
        times = process.cpu_times()
        yield Observation(times.user, {"cpu.mode": "user"})
        yield Observation(times.system, {"cpu.mode": "system"})

    meter.create_observable_counter("process.cpu.time", [cpu_time], unit="s")
    meter.create_observable_gauge(
        "process.cpu.utilization",
        [lambda options: [Observation(process.cpu_percent(None) / 100)]],
        unit="1",
        description="CPU time over wall time since the last collection, in cores",
    )
    meter.create_observable_gauge(
        "process.memory.usage",
        [lambda options: [Observation(process.memory_info().rss)]],
        unit="By",
    )
    if gpus:
        _observe_gpus(meter)


def _observe_gpus(meter: Meter) -> None:
    try:
        import pynvml  # type: ignore[import-untyped,import-not-found,unused-ignore]  # nvidia-ml-py

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # no bindings (cpu, rocm64 images) or no NVIDIA driver: no GPU metrics
        return
    if not count:
        return
    from opentelemetry.metrics import Observation

    def devices() -> Iterator[tuple[Any, dict[str, str | int]]]:
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            yield (
                handle,
                {
                    "hw.id": pynvml.nvmlDeviceGetUUID(handle),
                    "hw.name": name.decode() if isinstance(name, bytes) else name,
                    "gpu.index": index,
                },
            )

    def utilization(options: CallbackOptions) -> Iterable[Observation]:
        for handle, labels in devices():
            yield Observation(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100, labels)

    def memory(field: str) -> Any:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            for handle, labels in devices():
                yield Observation(getattr(pynvml.nvmlDeviceGetMemoryInfo(handle), field), labels)

        return observe

    meter.create_observable_gauge("hw.gpu.utilization", [utilization], unit="1")
    meter.create_observable_gauge("hw.gpu.memory.usage", [memory("used")], unit="By")
    meter.create_observable_gauge("hw.gpu.memory.limit", [memory("total")], unit="By")
