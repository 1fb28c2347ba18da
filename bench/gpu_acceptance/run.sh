#!/usr/bin/env bash
# The GPU acceptance run, second half: on a bare GPU machine, from this checkout and the
# wheels prepare.sh put into .gpu-acceptance/wheels/, turn one GPU into figures.
#
#   HYPHA_ACCEPTANCE_OUT=DIR bash bench/gpu_acceptance/run.sh
#
# Parts, each `hypha-accelerate selftest` under a time limit, on the machine's own torch:
#   selftest    one GPU, GPT-2 124M in bf16: the executor (eager, --compile off) against a
#               bare loop, MFU, memory, the out-of-memory micro-batching on the real allocator
#   selftest-compiled  the same with the executor's step compiled (--compile on); the bare
#               loop, eager, stays the baseline
#   fsdp        the same model through accelerate-configs/fsdp.yaml (FSDP2), one process
#   fsdp-compiled  the same, compiled
#   variants    compile_variants.py: the bare step eager, blocks compiled, blocks and output
#               projection compiled, the whole model compiled, Liger's fused loss; ratios to eager
#   deepspeed   through accelerate-configs/deepspeed-zero2.yaml, one process; DeepSpeed's
#               ops, where it needs any, JIT-build with the machine's nvcc
#   actions     the same job on the action protocol of later Hypha workers, the stand-in's
#               answers held back 50 ms as a remote scheduler's, with the speculative step
#   actions-blocking  the same without it (--speculative-step off), the executor alone
#   actions-auto  the same with --speculative-step auto (both ways tried in turns as it runs),
#               the executor alone; not among the default parts
#   parallel    a host with 2 GPUs or more: bench/parallel_memory.py --gpu, a 200M Llama
#               under DDP, FSDP2, ZeRO-3, TP (and TP x FSDP2 on 4 GPUs), every rank's peak
#               on the device and the host, against DDP's; said skipped on fewer GPUs
# The sharded parts need a GPU and are skipped (and said) without one. Where a compiled part
# and its eager one both ran, a table sets them side by side: samples/s, tokens/s, the ratio
# to the bare eager loop, MFU, peak memory, how much longer the first round took (compiling).
# The compile table alone, in one device call of under 10 minutes:
#   HYPHA_ACCEPTANCE_PARTS="selftest selftest-compiled fsdp fsdp-compiled profile" \
#       bash bench/gpu_acceptance/run.sh
# Everything lands in
# DIR (default gpu-acceptance-results/): summary.txt (every part's table, exit code and
# time, and what was skipped), each part's findings as JSON, and logs.tar.gz (stdout and
# stderr of every part). About 6 minutes on an H100; the limits add up to 8 and a half.
#
# Settings: HYPHA_ACCEPTANCE_MODEL (default gpt2-124m; the local dry run passes tiny),
# HYPHA_ACCEPTANCE_PARTS (default "selftest selftest-compiled fsdp fsdp-compiled deepspeed
# profile actions actions-blocking parallel": more than one 10-minute call; a rerun can take
# fewer; on a multi-GPU host `HYPHA_ACCEPTANCE_PARTS=parallel` alone fits one), HYPHA_ACCEPTANCE_ANSWER_DELAY_MS (default 50: the actions parts'
# answer delay),
# PYTHON (default python3, the machine's own).
set -uo pipefail
cd "$(dirname "$0")/../.."

python=${PYTHON:-python3}
model=${HYPHA_ACCEPTANCE_MODEL:-gpt2-124m}
out=${HYPHA_ACCEPTANCE_OUT:-gpu-acceptance-results}
wheels=.gpu-acceptance/wheels
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
logs=$(mktemp -d)
site=$(mktemp -d)
trap 'rm -rf "$site" "$logs"' EXIT

say() { echo "$*" | tee -a "$summary"; }

if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    echo "run: no wheels in $wheels: run bench/gpu_acceptance/prepare.sh first" >&2
    exit 2
fi
"$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl || exit 2
export PYTHONPATH=$site HYPHA_ACCELERATE_CONFIGS=$PWD/accelerate-configs PYTHONUNBUFFERED=1

say "gpu acceptance: $(date -u +%Y-%m-%dT%H:%M:%SZ), model $model, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
"$python" - <<'PY' 2>&1 | tee -a "$summary"
import importlib.metadata as m, platform
names = ("torch", "accelerate", "transformers", "deepspeed", "pydantic", "hypha-accelerate-executor")
print(f"python {platform.python_version()}; " + ", ".join(f"{n} {m.version(n)}" for n in names))
PY
"$python" - <<'PY' 2>&1 | tee -a "$summary"
import importlib.util, shutil
triton = importlib.util.find_spec("triton") is not None
import os, sysconfig
compilers = [name for name in ("cc", "gcc", "clang") if shutil.which(name)]
headers = os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
print(f"compile: triton {'yes' if triton else 'no'}, C compiler {', '.join(compilers) or 'none'}, "
      f"Python.h {'yes' if headers else 'no'} (without them, a compiled part falls back to "
      "eager, and says so below)")
PY
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /' | tee -a "$summary"
gpus=$("$python" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')

failed=0
part() {
    local name=$1 limit=$2 started rc
    shift 2
    started=$(date +%s)
    timeout -k 10 "$limit" "$python" -m hypha.accelerate_executor.cli selftest --model "$model" \
        --json "$out/$name.json" "$@" >"$logs/$name.txt" 2>"$logs/$name.log"
    rc=$?
    say ""
    say "== $name: exit $rc after $(($(date +%s) - started)) s (limit $limit s): selftest --model $model $*"
    [ "$rc" = 124 ] && say "   (timed out; the end of its log is in logs.tar.gz)"
    cat "$logs/$name.txt" >>"$summary"
    grep -h "compile failed, running eager" "$logs/$name.txt" "$logs/$name.log" | head -n 1 | sed 's/^/   /' | tee -a "$summary"
    [ "$rc" = 0 ] || failed=1
}

parts=" ${HYPHA_ACCEPTANCE_PARTS:-selftest selftest-compiled fsdp fsdp-compiled deepspeed profile actions actions-blocking parallel} "
delay=${HYPHA_ACCEPTANCE_ANSWER_DELAY_MS:-50}
wanted() { [[ $parts == *" $1 "* ]]; }
wanted selftest && part selftest 125 --compile off
# A cold compile of GPT-2 124M's block, forward and backward, takes tens of seconds.
wanted selftest-compiled && part selftest-compiled 180 --compile on --skip oom
if [ "$gpus" -gt 0 ]; then
    fsdp=(--accelerate-config fsdp --num-processes 1 --rounds 2)
    wanted fsdp && part fsdp 70 "${fsdp[@]}" --compile off
    wanted fsdp-compiled && part fsdp-compiled 130 "${fsdp[@]}" --compile on
    wanted deepspeed && part deepspeed 80 --accelerate-config deepspeed-zero2 --num-processes 1 --rounds 2 --compile off
    if wanted variants; then
        say ""
        say "== variants: the bare step compiled each way (bench/gpu_acceptance/compile_variants.py)"
        timeout -k 10 "${HYPHA_ACCEPTANCE_VARIANTS_LIMIT:-300}" "$python" bench/gpu_acceptance/compile_variants.py \
            --model "$model" ${HYPHA_ACCEPTANCE_VARIANTS:+--variants "$HYPHA_ACCEPTANCE_VARIANTS"} \
            >>"$summary" 2>"$logs/variants.log" || say "   (exit $?; see logs.tar.gz)"
    fi
    if wanted profile; then
        say ""
        say "== profile: where a bare step's GPU time goes (bench/gpu_acceptance/profile_step.py)"
        timeout -k 10 35 "$python" bench/gpu_acceptance/profile_step.py --model "$model" >>"$summary" 2>"$logs/profile.log" ||
            say "   (exit $?; see logs.tar.gz)"
    fi
else
    say ""
    say "== fsdp, deepspeed, profile: skipped: no GPU (accelerate shards only on GPUs)"
fi
actions=(--bridge-generation actions --answer-delay-ms "$delay")
if wanted parallel; then
    say ""
    if [ "$gpus" -ge 2 ]; then
        ranks=2
        [ "$gpus" -ge 4 ] && ranks=2,4
        say "== parallel: every rank's peak under each layout (bench/parallel_memory.py --gpu --ranks $ranks)"
        timeout -k 10 "${HYPHA_ACCEPTANCE_PARALLEL_LIMIT:-480}" "$python" bench/parallel_memory.py --gpu \
            --sizes 200m --ranks "$ranks" --rounds 2 --out "$out/parallel" \
            >>"$summary" 2>"$logs/parallel.log" || { say "   (exit $?; see logs.tar.gz)"; failed=1; }
    else
        say "== parallel: skipped: $gpus GPU(s); TP and the per-rank table need 2 or more, TP x FSDP2 4"
    fi
fi
wanted actions && part actions 120 "${actions[@]}" --speculative-step on --skip oom --compile off
wanted actions-blocking && part actions-blocking 75 "${actions[@]}" --speculative-step off --skip bare,oom --compile off
wanted actions-auto && part actions-auto 75 "${actions[@]}" --speculative-step auto --skip bare,oom --compile off
say ""
"$python" bench/gpu_acceptance/compile_table.py "$out" 2>&1 | tee -a "$summary"
if [ -f "$out/actions.json" ] && [ -f "$out/actions-blocking.json" ]; then
    say ""
    "$python" - "$out" "$delay" <<'PY' 2>&1 | tee -a "$summary"
import json, sys
on, off = (json.load(open(f"{sys.argv[1]}/{n}.json"))["figures"]["executor_samples_per_s"]
           for n in ("actions", "actions-blocking"))
rate = lambda x: "none" if x is None else f"{x:.1f}"
ratio = f"{on / off:.3f}" if on and off else "n/a"
try:
    auto = json.load(open(f"{sys.argv[1]}/actions-auto.json"))["figures"]["executor_samples_per_s"]
except FileNotFoundError:
    auto = None
print(f"== speculative step, answers {sys.argv[2]} ms late: samples/s {rate(on)} on, "
      f"{rate(off)} off, ratio {ratio}; auto {rate(auto)}")
PY
fi

tar -czf "$out/logs.tar.gz" -C "$logs" .
say ""
say "gpu acceptance: $([ "$failed" = 0 ] && echo "every part passed" || echo "a part failed"); logs in $out/logs.tar.gz"
exit "$failed"
