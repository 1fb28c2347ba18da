"""What the image runs for a job: choose an accelerate config, start the training ranks, pass signals on.

In five rooms: which GPUs this process may use (discovery), the accelerate config
(configs), what will run (plan), the checks before anything runs (preflight), and the
command line that runs it (command; `__main__`).

    python -m hypha.accelerate_executor.platform.launcher --socket S --work-dir W [--job J]
        [--accelerate-config auto|NAME|PATH] [--num-processes N] [--print-config]

J, the job JSON or @PATH, defaults to $JOB_JSON, which keeps a token off every command line.

`auto` picks from the image's variant (HYPHA_VARIANT) and the GPUs the container sees:
none -> cpu.yaml (multi-cpu.yaml for several processes; a GPU image says so in a warning
line), one -> gpu.yaml, several -> multi-gpu.yaml with one process per GPU. A
single-process, non-distributed config starts the training module directly with the
environment `accelerate launch` would give it: accelerate's own launcher costs seconds of
start-up and adds nothing for one process. Everything else goes through `accelerate launch`.

The ranks run in their own process group (supervisor.py). SIGTERM/SIGINT/SIGHUP go to the
whole group (the worker signals only its direct child, and the container may run without
--init); whatever is left after the grace period is killed, so a cancelled job is gone
within 3 seconds.

No torch import in this process: GPUs are counted from /dev and the *_VISIBLE_DEVICES
variables. When an image got GPUs, two checks run before any rank starts (platform/gpus.py): an
NVIDIA image reads the host driver's version and says in one line whether it runs natively
or through minor-version compatibility, or ends (exit 2) naming the driver it needs and the
variant that would run on this host; then a short child process asks torch whether it can
use them, and the launch ends (exit 2) when it cannot: GPUs handed in are never left idle
while the job trains on the CPU. The CPU fallback, with a warning, is only for a GPU image
started without any GPU.
"""
