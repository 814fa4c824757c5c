#!/usr/bin/env bash
# The GPU check: on a GPU host, the measurements of `mme gpu-check run` (bench/gpu_check/:
# a preflight of what the host has, then Triton python-backend copies on the GPU to the real
# threshold, TorchScript latency with TF32 off and on, in-process copies to the real threshold,
# TensorRT where installed, an encoder on CUDA; gpu_check.json rewritten after every step), and
# the gpu-marked tests where the project's test dependencies are installed. Runs what the host
# allows (no TensorRT, no Docker, no network) and says plainly what it did not measure.
#
#   bash tests/gpu/gpu_check.sh [--out DIR] [--allow-no-gpu] [--skip-tests] [--wheels DIR]
#                               [-- extra options for mme gpu-check run]
#   bash tests/gpu/gpu_check.sh --download-wheels DIR   (on a machine with pip access)
#   make gpu-check / make gpu-check-wheels
#
# A bare GPU host (Python 3.12 with torch, no network): copy the repository and the wheels
# of tests/gpu/wheels.txt from --download-wheels (about 60 MiB), then:
#   bash tests/gpu/gpu_check.sh --wheels DIR
# Python: $GPU_CHECK_PYTHON, else .venv/bin/python, else python3.
# Exit: 0 everything measured and passed; 1 something failed; 2 bad usage or no Python;
#       3 partial (a figure not measured: TensorRT absent, the budget spent);
#       4 no usable GPU (0 with --allow-no-gpu).
set -uo pipefail

EXIT_PARTIAL=3
EXIT_NO_GPU=4
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2

# What a bare GPU host lacks (tests/gpu/wheels.txt), pinned as constraints.txt pins them.
mapfile -t WHEELS < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' tests/gpu/wheels.txt)

require_gpu=1
run_tests=1
out="results/gpu-check"
wheels=""
download=""
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --require-gpu) require_gpu=1 ;;
        --allow-no-gpu) require_gpu=0 ;;
        --skip-tests) run_tests=0 ;;
        --out) out="${2:?--out needs a directory}"; shift ;;
        --wheels) wheels="${2:?--wheels needs a directory}"; shift ;;
        --download-wheels) download="${2:?--download-wheels needs a directory}"; shift ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ -n "$download" ]; then
    pins=()
    for name in "${WHEELS[@]}"; do
        pin="$(grep -i "^${name}==" constraints.txt | head -n 1)"
        [ -n "$pin" ] || { echo "gpu-check: $name is not pinned in constraints.txt" >&2; exit 2; }
        pins+=("$pin")
    done
    mkdir -p "$download"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
        --platform manylinux1_x86_64 -d "$download" "${pins[@]}" || exit 1
    echo "gpu-check: wheels for a bare GPU host (Python 3.12) in $download ($(du -sh "$download" | cut -f1)):"
    ls -1 "$download"
    exit 0
fi

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

if [ -n "$wheels" ]; then
    site="$(mktemp -d "${TMPDIR:-/tmp}/mme-gpu-check-site.XXXXXX")"
    echo "==> installing the wheels of $wheels into $site"
    "$py" -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl || exit 1
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

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
facts="$("$py" -m mme gpu-check detect)" || {
    echo "gpu-check: $py -m mme gpu-check detect failed" >&2
    exit 1
}
# Shell assignments, values quoted by mme gpu-check detect (TORCH_CUDA=1, GPU_COUNT=1, TENSORRT=..., ...).
eval "$facts"
echo "    torch ${TORCH:-absent} (CUDA usable: ${TORCH_CUDA}), GPUs: ${GPU_COUNT}${GPU_NAME:+ ($GPU_NAME)}," \
     "compute capability: ${COMPUTE_CAPABILITY:-unknown}," \
     "NVML GPUs: $([ "${NVML_GPUS}" = -1 ] && echo unavailable || echo "${NVML_GPUS}")," \
     "nvidia-pytriton: ${PYTRITON:-absent}, Docker: ${DOCKER}"
if [ -n "${TENSORRT}" ] && [ -z "${TENSORRT_REASON}" ]; then
    echo "    TensorRT ${TENSORRT}"
else
    echo "    TensorRT: ${TENSORRT_REASON}"
fi

if [ "${TORCH_CUDA}" != 1 ] || [ "${GPU_COUNT}" -lt 1 ]; then
    echo "gpu-check: no usable NVIDIA GPU on this host (${NO_GPU_REASON}); nothing GPU-side was run"
    skipped+=("gpu-marked tests (no GPU)" "GPU measurements (no GPU)")
    summary
    if [ "$require_gpu" = 1 ]; then
        exit "$EXIT_NO_GPU"
    fi
    exit 0
fi

# 1. The measurements first: they are what a short lease is for.
echo "==> GPU measurements: $py -m mme gpu-check run --out $out ${extra[*]+"${extra[*]}"}"
"$py" -m mme gpu-check run --out "$out" "${extra[@]+"${extra[@]}"}"
measure_rc=$?
case "$measure_rc" in
    0) ran+=("GPU measurements: every figure measured; files in $out") ;;
    "$EXIT_PARTIAL") ran+=("GPU measurements: PARTIAL, the headlines name what was NOT MEASURED; files in $out") ;;
    "$EXIT_NO_GPU") skipped+=("GPU measurements (no usable GPU)") ;;
    *) failed+=("GPU measurements (exit $measure_rc; see the FAILED lines above; files in $out)") ;;
esac

# 2. The gpu-marked tests, where the project's test dependencies are installed.
if [ "$run_tests" = 0 ]; then
    skipped+=("gpu-marked tests (--skip-tests)")
elif [ "${PROJECT_TESTS}" != 1 ]; then
    skipped+=("gpu-marked tests (the project's test dependencies are not installed in this Python: make install)")
else
    echo "==> gpu-marked tests: $py -m pytest -m gpu -q -p no:cacheprovider tests/packager/test_gpu_formats.py"
    "$py" -m pytest -m gpu -q -p no:cacheprovider tests/packager/test_gpu_formats.py
    rc=$?
    case "$rc" in
        0) ran+=("gpu-marked tests: passed") ;;
        5) skipped+=("gpu-marked tests: none selected on this host") ;;
        *) failed+=("gpu-marked tests (pytest exit $rc)") ;;
    esac
    if [ -n "${TENSORRT_REASON}" ]; then
        skipped+=("gpu tests that need TensorRT: ${TENSORRT_REASON}")
    fi
fi

# 3. Docker: this script does not build or run images; say whether it could.
if [ "${DOCKER}" = ok ]; then
    skipped+=("Docker images (engine reachable; not built here: make docker-build, make docker-package)")
else
    skipped+=("Docker images (${DOCKER})")
fi

summary
[ "${#failed[@]}" -eq 0 ] || exit 1
[ "$measure_rc" = "$EXIT_PARTIAL" ] && exit "$EXIT_PARTIAL"
exit 0
