"""Where the shim's container path finds `Interrupts`, which now lives with the process
supervisor (supervisor.py) that the host mode, the launcher and the local worker share."""

from hypha.accelerate_executor.supervisor import Interrupts

__all__ = ["Interrupts"]
