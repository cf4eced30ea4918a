#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU (sized for an H200 box with 16 cores: < 8 minutes),
# install the project and compare fusion strategies on the full-size zoo for llvm and cuda,
# measuring both (numerics of every build checked against no fusion), then time a few CUDA
# candidate groups into a feedback database (`costfuse tune --target h200`). Results go to $OUT
# if set, else gpu_results/: machine.txt, per batch compare.csv, kernels.csv, compare.md, plots
# and the log, and tune_cuda/ with its log. Not used by the tests.
#
#   bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS="${OUT:-gpu_results}"
mkdir -p "$RESULTS"
{
  nvidia-smi || true
  command -v nvcc && nvcc --version || echo "nvcc not found: registers will be empty"
  nproc
} > "$RESULTS/machine.txt" 2>&1
# The box may be offline: fall back to installing the project alone over what is there.
timeout 40 python3 -m pip install -q -e . > "$RESULTS/pip.log" 2>&1 \
  || timeout 20 python3 -m pip install -q --no-deps -e . >> "$RESULTS/pip.log" 2>&1
python3 -c "import tvm; print('tvm', tvm.__version__, 'cuda present:', tvm.cuda().exist)" \
  2>&1 | tee -a "$RESULTS/machine.txt"
# Two batches, each with its own time guard, so a slow one cannot take the other's results.
# Guards: pip 40 + 20, compare 200 + 160, tune 45: 465 s at most, inside 8 minutes.
# On 2 busy vCPUs the whole zoo took 6.5 min (130 s of it compiling, most of the rest ptxas
# and LLVM spill counts); the two ImageNet CNNs are ~60% of it.
run() {  # run NAME TIMEOUT_S MODELS
  timeout "$2" costfuse compare --models "$3" --targets llvm,cuda --measure-cuda --repeat 5 \
    --no-progress --out "$RESULTS/$1" > "$RESULTS/$1.log" 2>&1
  echo "$1: exit $? ($(tail -n 1 "$RESULTS/$1.log"))"
}
run transformers_and_small 200 \
  mlp_gelu,attention,conv_bn_relu,bert_layer,gpt2_block,layernorm_mlp,rmsnorm,elementwise_chain
run cnn 160 resnet18,mobilenetv2
# The feedback loop on CUDA: candidate kernels timed on the GPU (and ptxas-profiled) into a
# meta-schedule database; without a GPU they are recorded untimed.
timeout 45 costfuse tune mlp_gelu --small --target h200 --budget 6 \
  --work-dir "$RESULTS/tune_cuda" > "$RESULTS/tune_cuda.log" 2>&1
echo "tune_cuda: exit $? ($(tail -n 1 "$RESULTS/tune_cuda.log"))"
echo "results in $RESULTS"
