"""Stand-in executor for the shim's tests. Takes the launcher's arguments; WORK_DIR/plan.json
says what to do (all keys optional):

    lines: N          print N numbered lines to stdout
    stderr: TEXT      print TEXT to stderr
    bad_bytes: true   print a line holding bytes that are not UTF-8
    write_files: true create files and folders in the work dir
    on_sigterm: "exit" (default) | "ignore"
    alloc_mb: N       allocate and touch N MiB
    sleep: S          then wait S seconds, printing "ready" first; exit 1 when the bridge's
                      socket disappears (the executor does the same within ~10 s)
    self_kill: true   end by SIGKILL to itself
    cache_mark: TEXT  list the files in $TORCHINDUCTOR_CACHE_DIR ("cache holds ..."), then
                      leave a file named TEXT there, as a compiling executor leaves kernels
    exit: CODE        exit code at the end (default 0)
"""

import argparse
import json
import os
import signal
import socket
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--socket", required=True)
parser.add_argument("--work-dir", required=True)
parser.add_argument("--job", default=os.environ.get("JOB_JSON"))
args, rest = parser.parse_known_args()

with open(os.path.join(args.work_dir, "plan.json")) as file:
    plan = json.load(file)


def on_sigterm(signum, frame):
    print("got SIGTERM", flush=True)
    sys.exit(143)


signal.signal(signal.SIGTERM, signal.SIG_IGN if plan.get("on_sigterm") == "ignore" else on_sigterm)

print(f"uid {os.getuid()} gid {os.getgid()} groups {sorted(os.getgroups())}", flush=True)
print(f"container {socket.gethostname()}", flush=True)
print(f"extra args {rest}", flush=True)
print(f"job from {'argv' if '--job' in sys.argv else 'JOB_JSON'}", flush=True)
job = args.job
if job.startswith("@"):
    with open(job[1:]) as file:
        job = file.read()
print(f"job id {json.loads(job)['job_id']}", flush=True)
bridge = socket.socket(socket.AF_UNIX)
bridge.settimeout(10)
bridge.connect(args.socket)
bridge.close()
print("bridge reachable", flush=True)
print(f"env trust {os.environ.get('HYPHA_TRUST_REMOTE_CODE', '-')}", flush=True)
for name in ("OMP_NUM_THREADS", "QEMU_CPU", "HYPHA_SHIM_ONLY"):
    print(f"env {name} {os.environ.get(name, '-')}", flush=True)

for i in range(plan.get("lines", 0)):
    print(f"line {i}", flush=True)
if plan.get("stderr"):
    print(plan["stderr"], file=sys.stderr, flush=True)
if plan.get("bad_bytes"):
    os.write(1, b"bad \xff\xfe bytes \xe2\x82\xac\n")
if plan.get("write_files"):
    os.makedirs(os.path.join(args.work_dir, "out", "deeper"), exist_ok=True)
    for name in ("out/a.bin", "out/deeper/b.bin", "c.txt"):
        with open(os.path.join(args.work_dir, name), "wb") as file:
            file.write(b"x" * 1000)
    print("files written", flush=True)
if plan.get("cache_mark"):
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/.cache/torchinductor")
    os.makedirs(cache, exist_ok=True)
    print(f"cache holds {sorted(os.listdir(cache))}", flush=True)
    with open(os.path.join(cache, plan["cache_mark"]), "w") as file:
        file.write("kernel")
if plan.get("alloc_mb"):
    blocks = []
    for _ in range(plan["alloc_mb"]):
        blocks.append(bytearray(b"\1" * (1 << 20)))
    print(f"allocated {len(blocks)} MiB", flush=True)
if plan.get("sleep"):
    print("ready", flush=True)
    deadline = time.monotonic() + plan["sleep"]
    while time.monotonic() < deadline:
        if not os.path.exists(args.socket):
            print("bridge gone", flush=True)
            sys.exit(1)
        time.sleep(0.1)
if plan.get("self_kill"):
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(plan.get("exit", 0))
