"""One executor container, described once and rendered two ways: as docker-py create
arguments (the shim) and as `docker run` arguments (the worker's plain docker entry), so
that both run with the same mounts, user and hardening."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hypha.accelerate_executor.platform.variants import BY_NAME

if TYPE_CHECKING:
    from docker import APIClient

LABEL_PREFIX = "hypha.accelerate."
LABEL_JOB_ID = LABEL_PREFIX + "job-id"
LABEL_VARIANT = LABEL_PREFIX + "variant"
LABEL_WORK_DIR = LABEL_PREFIX + "work-dir"
LABEL_SHIM_HOST = LABEL_PREFIX + "shim-host"
LABEL_SHIM_PID = LABEL_PREFIX + "shim-pid"
LABEL_SHIM_START = LABEL_PREFIX + "shim-start"

# exec: Triton and torch.compile build kernels under /tmp (the image points every cache
# there) and load them from it.
TMPFS_OPTIONS = "rw,exec,nosuid,nodev"
# Threads count against the pids cgroup: 8 ranks x (intra-op threads + loader workers + NCCL
# threads) stay well under this on a large host, a fork bomb does not.
DEFAULT_PIDS_LIMIT = 4096


def default_shm_size(variant: str) -> str:
    # NCCL and DataLoader workers move tensors through /dev/shm; Docker's 64 MiB is too small
    # for either. tmpfs pages are only used as written, so a generous cap costs nothing idle.
    return "8g" if BY_NAME[variant].gpu else "1g"


def launcher_args(
    socket: str,
    work_dir: str,
    job: str | None = None,
    accelerate_config: str | None = None,
    num_processes: int | None = None,
) -> list[str]:
    """The in-container launcher's arguments; the mps-host bundle's launcher takes the same.
    Without `job` the launcher reads JOB_JSON from its environment."""
    args = ["--socket", socket, "--work-dir", work_dir]
    if job is not None:
        args += ["--job", job]
    if accelerate_config:
        args += ["--accelerate-config", accelerate_config]
    if num_processes is not None:
        args += ["--num-processes", str(num_processes)]
    return args


@dataclass(frozen=True)
class ContainerSpec:
    image: str
    command: list[str]
    user: str
    # The work dir as the executor (and the shim) see it, and the bind source on the
    # engine's host: they differ when the shim itself runs in a container.
    work_dir: str
    work_dir_source: str
    shm_size: str | None
    ipc_host: bool = False
    network: str = "none"
    env: dict[str, str] = field(default_factory=dict)
    # Variables the container takes from the caller's environment (`docker run --env NAME`):
    # their values never show on a command line.
    env_from_caller: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    memory: str | None = None
    pids_limit: int = DEFAULT_PIDS_LIMIT
    nvidia_gpus: str | None = None  # "all" or device ids "0,1"
    devices: tuple[str, ...] = ()
    group_add: tuple[str, ...] = ()
    # More writable bind mounts, (host path, container path): the compile cache.
    binds: tuple[tuple[str, str], ...] = ()

    def create_kwargs(self, api: APIClient) -> dict[str, Any]:
        """Arguments for `APIClient.create_container`."""
        from docker.types import DeviceRequest

        device_requests = None
        if self.nvidia_gpus == "all":
            device_requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        elif self.nvidia_gpus:
            ids = self.nvidia_gpus.split(",")
            device_requests = [DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]
        host_config = api.create_host_config(
            binds={
                source: {"bind": target, "mode": "rw"}
                for source, target in ((self.work_dir_source, self.work_dir), *self.binds)
            },
            network_mode=self.network,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            read_only=True,
            tmpfs={"/tmp": TMPFS_OPTIONS},
            pids_limit=self.pids_limit,
            init=True,
            ipc_mode="host" if self.ipc_host else None,
            shm_size=self.shm_size,
            # Swap equal to memory: the limit is a real cap, the job is OOM-killed, not paged.
            mem_limit=self.memory,
            memswap_limit=self.memory,
            device_requests=device_requests,
            devices=list(self.devices) or None,
            group_add=list(self.group_add) or None,
        )
        return {
            "image": self.image,
            "command": self.command,
            "user": self.user,
            "environment": {
                **{n: os.environ[n] for n in self.env_from_caller if n in os.environ},
                **self.env,
            }
            or None,
            "labels": self.labels,
            "host_config": host_config,
        }

    def docker_run_args(self) -> list[str]:
        """Arguments for the docker CLI: `docker run --rm ...`, the same container."""
        args = ["run", "--rm", "--init", "--user", self.user, "--network", self.network]
        args += ["--read-only", "--tmpfs", f"/tmp:{TMPFS_OPTIONS}"]
        args += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        args += ["--pids-limit", str(self.pids_limit)]
        if self.ipc_host:
            args += ["--ipc", "host"]
        elif self.shm_size:
            args += ["--shm-size", self.shm_size]
        if self.memory:
            args += ["--memory", self.memory, "--memory-swap", self.memory]
        if self.nvidia_gpus:
            # The CLI splits --gpus on commas: a device list has to arrive quoted.
            gpus = "all" if self.nvidia_gpus == "all" else f'"device={self.nvidia_gpus}"'
            args += ["--gpus", gpus]
        for device in self.devices:
            args += ["--device", device]
        for group in self.group_add:
            args += ["--group-add", group]
        for key, value in self.env.items():
            args += ["--env", f"{key}={value}"]
        for name in self.env_from_caller:
            args += ["--env", name]
        for key, value in self.labels.items():
            args += ["--label", f"{key}={value}"]
        for source, target in self.binds:
            args += ["--volume", f"{source}:{target}"]
        args += ["--volume", f"{self.work_dir_source}:{self.work_dir}", self.image]
        return args + self.command
