#!/usr/bin/env bash
# The prepared GPU check: on a GPU host, run the gpu-marked tests and a short TorchScript vs
# TensorRT comparison for resnet50 (latency at batch 1 and 16, GPU memory per loaded copy
# with NVML, copies that fit), printing the figures. Runs what the host allows (no
# TensorRT, no NVML, no Docker are fine) and says plainly what it skipped.
#
#   bash tests/gpu/gpu_check.sh [--require-gpu] [--skip-tests] [--model resnet50] [--batches 1,16]
#                               [--out results/gpu_check.json] [-- extra args for gpu_check.py compare]
#   make gpu-check
#
# Python: $GPU_CHECK_PYTHON, else .venv/bin/python, else python3.
# Exit: 0 everything that could run passed (also: no GPU, unless --require-gpu);
#       1 something failed; 2 bad usage or no Python; 4 no usable GPU with --require-gpu.
set -uo pipefail

EXIT_NO_GPU=4
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2

require_gpu=0
run_tests=1
model=resnet50
batches=1,16
out="results/gpu_check.json"
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --require-gpu) require_gpu=1 ;;
        --skip-tests) run_tests=0 ;;
        --model) model="${2:?--model needs a value}"; shift ;;
        --batches) batches="${2:?--batches needs a value}"; shift ;;
        --out) out="${2:?--out needs a value}"; shift ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
    py="$GPU_CHECK_PYTHON"
elif [ -x .venv/bin/python ]; then
    py=.venv/bin/python
else
    py=python3
fi
if ! command -v "$py" >/dev/null 2>&1; then
    echo "gpu-check: no Python at '$py' (run make install, or set GPU_CHECK_PYTHON)" >&2
    exit 2
fi

ran=()
skipped=()
failed=()
summary() {
    echo
    echo "==> gpu-check summary"
    local line
    for line in "${ran[@]+"${ran[@]}"}"; do echo "RAN      $line"; done
    for line in "${skipped[@]+"${skipped[@]}"}"; do echo "SKIPPED  $line"; done
    for line in "${failed[@]+"${failed[@]}"}"; do echo "FAILED   $line"; done
}

echo "==> gpu-check: what this host has ($py)"
facts="$("$py" tests/gpu/gpu_check.py detect)" || {
    echo "gpu-check: $py tests/gpu/gpu_check.py detect failed" >&2
    exit 1
}
# Shell assignments, values quoted by the helper (TORCH_CUDA=1, GPU_COUNT=1, TENSORRT=..., ...).
eval "$facts"
echo "    torch ${TORCH:-absent} (CUDA usable: ${TORCH_CUDA}), GPUs: ${GPU_COUNT}${GPU_NAME:+ ($GPU_NAME)},"  \
     "NVML GPUs: $([ "${NVML_GPUS}" = -1 ] && echo unavailable || echo "${NVML_GPUS}")," \
     "TensorRT: ${TENSORRT:-absent}, Torch-TensorRT: ${TORCH_TENSORRT:-absent}, Docker: ${DOCKER}"

if [ "${TORCH_CUDA}" != 1 ] || [ "${GPU_COUNT}" -lt 1 ]; then
    echo "gpu-check: no usable NVIDIA GPU on this host (${NO_GPU_REASON}); nothing GPU-side was run"
    skipped+=("gpu-marked tests (no GPU)" "TorchScript vs TensorRT comparison (no GPU)")
    summary
    if [ "$require_gpu" = 1 ]; then
        exit "$EXIT_NO_GPU"
    fi
    exit 0
fi

# 1. The gpu-marked tests; those needing TensorRT / Torch-TensorRT only where installed.
if [ "$run_tests" = 0 ]; then
    skipped+=("gpu-marked tests (--skip-tests)")
elif [ "${PYTEST}" != 1 ]; then
    skipped+=("gpu-marked tests (pytest is not installed: make install)")
else
    select=()
    if [ -z "${TENSORRT}" ]; then
        select=(-k "not tensorrt and not plan")
        skipped+=("gpu tests that need TensorRT (the tensorrt package is not installed: pip install -e '.[gpu]')")
    elif [ -z "${TORCH_TENSORRT}" ]; then
        select=(-k "not torch_tensorrt")
        skipped+=("gpu tests that need Torch-TensorRT (torch-tensorrt is not installed)")
    fi
    echo "==> gpu-marked tests: $py -m pytest -m gpu -q -p no:cacheprovider ${select[*]+"${select[*]}"}"
    "$py" -m pytest -m gpu -q -p no:cacheprovider "${select[@]+"${select[@]}"}"
    rc=$?
    case "$rc" in
        0) ran+=("gpu-marked tests: passed") ;;
        5) skipped+=("gpu-marked tests: none selected on this host") ;;
        *) failed+=("gpu-marked tests (pytest exit $rc)") ;;
    esac
fi

# 2. TorchScript vs TensorRT (and ONNX Runtime CUDA where present) for the model.
echo "==> TorchScript vs TensorRT: $model, batches $batches"
"$py" tests/gpu/gpu_check.py compare --model "$model" --batches "$batches" --out "$out" "${extra[@]+"${extra[@]}"}"
rc=$?
case "$rc" in
    0) ran+=("comparison for $model: figures above, JSON in $out") ;;
    "$EXIT_NO_GPU") skipped+=("comparison (no usable GPU)") ;;
    *) failed+=("comparison for $model (exit $rc; see the FAILED lines above)") ;;
esac
if [ -z "${TENSORRT}" ]; then
    skipped+=("TensorRT side of the comparison (tensorrt not installed): TorchScript figures only")
fi

# 3. Docker: this script does not build or run images; say whether it could.
if [ "${DOCKER}" = ok ]; then
    skipped+=("Docker images (engine reachable; not built here: make docker-build, make docker-package MODEL=$model)")
else
    skipped+=("Docker images (${DOCKER})")
fi

summary
[ "${#failed[@]}" -eq 0 ] || exit 1
exit 0
