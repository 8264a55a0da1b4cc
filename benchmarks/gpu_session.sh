#!/usr/bin/env bash
# The checks of one lent-GPU session (about 9 minutes), all at once on the one GPU:
#   - the long-horizon study at width 256, 20,000 steps (examples/long_horizon/study.py --gpu),
#     shaped (advise) and pre-LN at 3 learning rates each, 6 Dask workers, torch.compile;
#   - the CUDA tests (host-sync-free SDE step; the batch sampler draws the CPU's batches) and
#     benchmarks/gpu.py (CPU/GPU agreement in law; its timings are taken while the study
#     runs, so they are marked as under load);
#   - same seed, same numbers: two short training runs on the GPU compared bitwise.
# Writes everything under $OUT (the device tool's folder): logs, gpu.json and gpu_runs.tgz (each
# run's result.json, and log.nc of any run still going when the time ran out).
#
#   bash benchmarks/gpu_session.sh            # wheels of dask/distributed/torchsde/netCDF4 in .whl
#   STUDY=cpu-grid bash benchmarks/gpu_session.sh
#       instead of the width-256 study: the CPU study's own plan (width 64, depths 16 and 64,
#       examples/long_horizon/runs) on the GPU, 8 workers, to finish its grid and seeds; each
#       result.json records its device; the finished runs come back in cpu_grid_runs.tgz
#       (result.json and log.nc), to be unpacked at the repository root and committed.
#   STUDY=transfer bash benchmarks/gpu_session.sh
#       the learning-rate transfer study (examples/transfer, 280+ runs of 1,000 steps) on the
#       GPU, $WORKERS workers (default 8; uncompiled: a run of 1,150 steps would spend much of
#       its time compiling); its finished runs come back in transfer_runs.tgz the same way.
#       TRANSFER_PHASES="ARGS|ARGS..." runs study.py once per argument set, in turn.
#       Depth 64 (H200, 2026-11-30): one run alone takes 0.13 s a step uncompiled (width 64,
#       batch 32 x 64: launch-bound), about 2.5 min for 1,150 steps; 16 runs at once (under
#       CUDA MPS) finished none within 480 s, and the runs of 2026-11-26 took 5.7 min each
#       12 to 15 at a time: 17 depth-64 runs need more than one 10-minute call.
#   STUDY=depth64 bash benchmarks/gpu_session.sh
#       the depth-64 runs the CPU studies have not finished (about 5 h each on one CPU core):
#       the ablation's best two variants (study.py --ablation-long --depths 64, into
#       examples/ablation/long) and pre-LN depth-muP (study.py --depths 64 --models "pre-LN
#       depth-muP", into examples/long_horizon), each study's own plan (lr grid, then seeds),
#       $WORKERS workers each (default 4), torch.compile; the finished runs come back in
#       depth64_runs.tgz (result.json and log.nc), to be unpacked at the repository root and
#       committed.
#   STUDY=train-step bash benchmarks/gpu_session.sh
#       the training-step checks alone, on a quiet GPU (about 10 minutes, no
#       corpus needed): the CUDA and compile tests of tests/test_train_step.py and
#       tests/test_train_many.py, benchmarks/bench_train_step.py (eager, compiled loss,
#       compiled step and 6 runs at once at width 256; eager and compiled step at width 512;
#       bfloat16 autocast at width 256; depth 16, batch 32 x 64) into train_step*.json, and
#       1,000-step runs at width 256 in float32 and bfloat16 autocast, two seeds each, trained
#       together by train_many (autocast.json: their validation losses).
#   BENCH=0 skips benchmarks/gpu.py (its timings would be under load anyway).
#   Every mode trains on the CPU machine's corpus, which the device's Python (another version,
#   another standard library: 10.8 MB of sources on the H200 of 2026-11-26, against 31.5 MB
#   here) does not have: write all of it first on the CPU machine and carry it (the device
#   tool's `carry`), or the script stops before training:
#       python -c "from shapedtx.training import export_corpus; export_corpus('.corpus', max_bytes=None)"
#   A study's max_bytes then reads the same leading documents as on the CPU machine (the
#   CPU studies' 8 MB, the width-256 study's 32 MB: all 31.5 MB), and the studies' reports
#   refuse runs on two corpora (simulations.one_corpus).
set -u
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=2
STUDY_SECONDS=${STUDY_SECONDS:-500}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
  nproc; } > "$OUT/machine.txt" 2>&1
started=$(mktemp)  # the runs newer than this came from this session (machine.txt grows later)

if [ "${STUDY:-gpu}" = train-step ]; then
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_train_step.py \
    tests/test_train_many.py -k "cuda or compiled or graph or finite" > "$OUT/train_step_tests.log" 2>&1
  echo "rc $?" >> "$OUT/train_step_tests.log"
  timeout 300 python3 benchmarks/bench_train_step.py --device cuda --widths 256 \
    --json "$OUT/train_step_256.json" > "$OUT/train_step_bench.log" 2>&1
  echo "rc $?" >> "$OUT/train_step_bench.log"
  timeout 150 python3 benchmarks/bench_train_step.py --device cuda --widths 512 \
    --modes eager step --json "$OUT/train_step_512.json" >> "$OUT/train_step_bench.log" 2>&1
  echo "rc $?" >> "$OUT/train_step_bench.log"
  timeout 150 python3 benchmarks/bench_train_step.py --device cuda --widths 256 \
    --modes step many --autocast bfloat16 --json "$OUT/train_step_bf16.json" \
    >> "$OUT/train_step_bench.log" 2>&1
  echo "rc $?" >> "$OUT/train_step_bench.log"
  timeout 240 python3 - "$OUT/autocast.json" > "$OUT/autocast.log" 2>&1 <<'PY'
import json, sys, time
from shapedtx import TrainConfig, load_corpus, preset
from shapedtx.training import Run, train_many
data = load_corpus(max_bytes=8_000_000)
model = preset("shaped", width=256, depth=16, heads=4, causal=True)
base = TrainConfig(steps=1000, batch_size=32, seq_len=64, lr=1.1e-3, schedule="wsd",
                   log_interval=100, eval_interval=100, eval_batches=8, checkpoint_interval=0)
runs = [Run(model, base.replace(seed=s, autocast=a)) for a in ("none", "bfloat16") for s in (0, 1)]
start = time.time()
results = train_many(runs, data, device="cuda", compile="step", progress=False)
out = [{"autocast": r.config.autocast, "seed": r.config.seed,
        "val_loss": float(res.log["val_loss"].dropna("step").values[-1])} for r, res in zip(runs, results)]
json.dump({"runs": out, "wall_seconds": time.time() - start}, open(sys.argv[1], "w"), indent=1)
print(out, time.time() - start)
PY
  echo "rc $?" >> "$OUT/autocast.log"
  nvidia-smi >> "$OUT/machine.txt" 2>&1
  ls -la "$OUT"
  exit 0
fi

if [ ! -d .corpus ]; then
  echo "gpu_session.sh: the CPU machine's corpus must be carried in .corpus (see the header)" >&2
  exit 2
fi
if [ "${STUDY:-gpu}" = cpu-grid ]; then
  timeout "$STUDY_SECONDS" python3 examples/long_horizon/study.py --device cuda --compile \
    --workers 8 --depths 16 64 --data .corpus > "$OUT/study.log" 2>&1 &
elif [ "${STUDY:-gpu}" = depth64 ]; then
  export WORKERS=${WORKERS:-4}
  timeout "$STUDY_SECONDS" bash -c '
    python3 examples/long_horizon/study.py --ablation-long --device cuda --compile \
      --workers "$WORKERS" --depths 64 --data .corpus &
    python3 examples/long_horizon/study.py --device cuda --compile --workers "$WORKERS" \
      --depths 64 --models "pre-LN depth-muP" --data .corpus &
    wait' > "$OUT/study.log" 2>&1 &
elif [ "${STUDY:-gpu}" = transfer ]; then
  # TRANSFER_PHASES: study.py argument sets separated by '|', run in turn under the one timeout
  # (e.g. the shapes slowest on a CPU first: "--depths 32 64 --widths 256|--depths 16 --widths 128")
  export WORKERS=${WORKERS:-8} TRANSFER_PHASES=${TRANSFER_PHASES:-}
  timeout "$STUDY_SECONDS" bash -c 'IFS="|" read -ra phases <<< "$TRANSFER_PHASES"
    for args in "${phases[@]:-}"; do
      python3 examples/transfer/study.py --device cuda --workers "$WORKERS" --data .corpus $args
    done' > "$OUT/study.log" 2>&1 &
else
  timeout "$STUDY_SECONDS" python3 examples/long_horizon/study.py --gpu --device cuda --compile \
    --workers 6 --max-runs 6 --models "shaped advise" "pre-LN (GPT-2)" --data .corpus \
    > "$OUT/study.log" 2>&1 &
fi
study=$!

timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_sde_steppers.py \
  tests/test_train_data.py -k "host_sync or cuda" > "$OUT/cuda_tests.log" 2>&1
echo "rc $?" >> "$OUT/cuda_tests.log"
if [ "${BENCH:-1}" = 1 ]; then  # BENCH=0: leave the GPU to the study
  timeout 200 python3 benchmarks/gpu.py --device cuda --json "$OUT/gpu.json" > "$OUT/gpu_bench.log" 2>&1
  echo "rc $?" >> "$OUT/gpu_bench.log"
fi
timeout 120 python3 - > "$OUT/reproducible.log" 2>&1 <<'PY'
import sys
import numpy as np
DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
from shapedtx import TrainConfig, load_corpus, preset, train
data = load_corpus(max_bytes=2_000_000)
cfg = TrainConfig(steps=60, batch_size=32, seq_len=64, lr=1e-2, warmup_steps=10, log_interval=20,
                  eval_interval=20, eval_batches=4, seed=7)
model = preset("shaped", width=64, depth=8, heads=4, mlp_ratio=4, causal=True, gamma=0.15, tau0=0.25)
logs = [train(model, data, cfg, device=DEVICE, progress=False).log for _ in range(2)]
same = all(
    np.array_equal(logs[0][k].values, logs[1][k].values, equal_nan=True)
    for k in ("train_loss", "grad_norm", "val_loss")
)
print("val", logs[0]["val_loss"].values, logs[1]["val_loss"].values, "bitwise equal:", same)
PY
echo "rc $?" >> "$OUT/reproducible.log"

wait $study
echo "rc $?" >> "$OUT/study.log"
nvidia-smi >> "$OUT/machine.txt" 2>&1
if [ "${STUDY:-gpu}" = transfer ]; then
  find examples/transfer/runs -newer "$started" \( -name result.json -o -name log.nc \) \
    -print0 | tar czf "$OUT/transfer_runs.tgz" --null -T -
elif [ "${STUDY:-gpu}" = cpu-grid ]; then
  find examples/long_horizon/runs -newer "$started" \( -name result.json -o -name log.nc \) \
    -print0 | tar czf "$OUT/cpu_grid_runs.tgz" --null -T -
elif [ "${STUDY:-gpu}" = depth64 ]; then
  find examples/ablation/long/runs examples/long_horizon/runs -newer "$started" \
    \( -name result.json -o -name log.nc \) -print0 | tar czf "$OUT/depth64_runs.tgz" --null -T -
else
  tar czf "$OUT/gpu_runs.tgz" --exclude='*.pt' examples/long_horizon/gpu
fi
ls -la "$OUT"
