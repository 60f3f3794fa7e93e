#!/usr/bin/env bash
# GPU check in one go (about 8 minutes): the CUDA tests, then the decode benchmark in bf16, eager and compiled.
#   bash bench/gpu.sh [LOG_DIR]          (LOG_DIR default: .; each part writes a log there)
set -u
LOG=${1:-.}
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=PASSIVE
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOG/gpu_info.txt"
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)" \
  | tee -a "$LOG/gpu_info.txt"
timeout 280 python3 -m pytest tests/test_gpu.py -m gpu -q -rs -p no:cacheprovider 2>&1 | tee "$LOG/gpu_tests.txt"
timeout 100 python3 bench/decode.py --device cuda --dtype bfloat16 --batch 1 8 --repeat 2 2>&1 \
  | tee "$LOG/gpu_bench_decode.txt"
# compiled: warm-up (Inductor, then one graph per batch size) takes ~2 minutes, so batch 1 only
timeout 200 python3 bench/decode.py --device cuda --dtype bfloat16 --batch 1 --taus 0.95 --repeat 2 --naive-new 0 \
  --compile 2>&1 | tee "$LOG/gpu_bench_compile.txt"
