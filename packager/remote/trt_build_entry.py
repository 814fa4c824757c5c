"""Entry script of the ``mme compile --on sagemaker`` training job: ONNX -> TensorRT plan.

Runs inside the serving image (the SageMaker Triton image of the target release) on the
target instance type, so the plan matches the TensorRT version and GPU it will be served
with. Standard library only (Python 3.8+): the image has no extra packages.

    python3 build_plan.py /opt/ml/input/data/code/build_config.json

Builder, in order: ``trtexec`` (on PATH or /usr/src/tensorrt/bin), the TensorRT Python
module, or, when allowed, ``pip install tensorrt-cu<CUDA major>==<the image's libnvinfer
version>.*`` from NVIDIA's index. Precision uses what the TensorRT major found here takes:

* fp32: TF32 off (``--noTF32`` / ``clear_flag(TF32)``: it is on by default);
* tf32: the defaults;
* fp16: TensorRT 10 and older: ``--fp16`` / ``BuilderFlag.FP16``; TensorRT 11 has neither
  (unknown options make trtexec fail), so it builds from the FP16 ONNX graph that
  ``mme compile`` converts and uploads (``"fp16_graph": true``), strongly typed. An FP16
  build is never silently built in FP32.

Writes ``model.plan`` and ``build_info.json`` (TensorRT version, GPU, builder, command) to
the model directory, which SageMaker uploads as ``output/model.tar.gz``. On failure the
reason goes to ``/opt/ml/output/failure``, which SageMaker reports as FailureReason.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

TRTEXEC_PATHS = ("/usr/src/tensorrt/bin/trtexec", "/opt/tensorrt/bin/trtexec")
LIB_GLOBS = ("/usr/lib/x86_64-linux-gnu/libnvinfer.so.*.*.*", "/usr/local/lib/python3*/dist-packages/tensorrt*/libnvinfer.so.*.*.*",
             "/usr/lib/aarch64-linux-gnu/libnvinfer.so.*.*.*")


class BuildError(Exception):
    pass


def shape_arg(shapes: dict) -> str:
    """{"input_ids": [1, 128]} -> "input_ids:1x128" (trtexec's --minShapes syntax)."""
    return ",".join("{}:{}".format(name, "x".join(str(d) for d in dims)) for name, dims in shapes.items())


def find_trtexec() -> str | None:
    found = shutil.which("trtexec")
    if found:
        return found
    for path in TRTEXEC_PATHS:
        if os.access(path, os.X_OK):
            return path
    return None


def major_of(version) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def fp16_impossible(major: int) -> BuildError:
    return BuildError(
        "TensorRT {} has no FP16 flag (networks are strongly typed) and the uploaded ONNX graph is FP32; "
        "re-run mme compile with --triton-release of a TensorRT 11 release so it uploads an FP16 graph, "
        "or --precision fp32".format(major)
    )


def precision_flags(major: int | None, config: dict) -> list:
    """trtexec's precision options for the TensorRT major found in the image."""
    precision = config.get("precision", "fp32")
    fp16_graph = bool(config.get("fp16_graph"))
    if precision == "fp32":
        return ["--noTF32"]
    if precision == "tf32":
        return []
    if precision != "fp16":
        raise BuildError("unknown precision {!r}; use fp32, tf32 or fp16".format(precision))
    if fp16_graph:
        return [] if (major or 0) >= 11 else ["--stronglyTyped"]
    if major is not None and major >= 11:
        raise fp16_impossible(major)
    return ["--fp16"]


def trtexec_command(trtexec: str, config: dict, onnx: str, plan: str, major: int | None = None) -> list:
    command = [trtexec, "--onnx=" + onnx, "--saveEngine=" + plan]
    shapes = config["shapes"]
    if shapes.get("min"):
        command += ["--minShapes=" + shape_arg(shapes["min"]), "--optShapes=" + shape_arg(shapes["opt"]),
                    "--maxShapes=" + shape_arg(shapes["max"])]
    command.append("--memPoolSize=workspace:{}M".format(int(config.get("workspace_mib", 4096))))
    command += precision_flags(major, config)
    if config.get("hardware_compatible"):
        command.append("--hardwareCompatibilityLevel=ampere+")
    return command


def trtexec_version(trtexec: str) -> str | None:
    """The TensorRT version trtexec reports (it prints ``[TensorRT v100400]`` on every run)."""
    try:
        proc = subprocess.run([trtexec, "--help"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    return version_from_trtexec_output(proc.stdout + proc.stderr)


def version_from_trtexec_output(text: str) -> str | None:
    match = re.search(r"TensorRT version:\s*([0-9][0-9.]*)", text)
    if match:
        return match.group(1)
    match = re.search(r"\[TensorRT v(\d+)\]", text)
    if match:  # e.g. v8501 -> 8.5.1, v100300 -> 10.3.0
        number = int(match.group(1))
        major = number // 10000 if number >= 100000 else number // 1000
        rest = number - major * (10000 if number >= 100000 else 1000)
        return "{}.{}.{}".format(major, rest // 100, rest % 100)
    return None


def library_version() -> str | None:
    for pattern in LIB_GLOBS:
        for path in sorted(glob.glob(pattern)):
            match = re.search(r"libnvinfer\.so\.(\d+\.\d+\.\d+)", path)
            if match:
                return match.group(1)
    return None


def gpu_info() -> dict:
    for query in ("name,compute_cap", "name"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=" + query, "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return {"gpu": "unknown", "compute_capability": "unknown"}
        if out.returncode == 0 and out.stdout.strip():
            parts = [p.strip() for p in out.stdout.strip().splitlines()[0].split(",")]
            return {"gpu": parts[0], "compute_capability": parts[1] if len(parts) > 1 else "unknown"}
    return {"gpu": "unknown", "compute_capability": "unknown"}


def build_with_trtexec(trtexec: str, config: dict, onnx: str, plan: str) -> dict:
    known = library_version() or trtexec_version(trtexec)
    command = trtexec_command(trtexec, config, onnx, plan, major_of(known) if known else None)
    print("running: " + " ".join(command), flush=True)
    proc = subprocess.run(command, capture_output=True, text=True)
    sys.stdout.write(proc.stdout[-20000:])
    sys.stderr.write(proc.stderr[-20000:])
    if proc.returncode != 0 or not os.path.isfile(plan):
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        raise BuildError("trtexec failed (exit {}): {}".format(proc.returncode, " | ".join(tail)))
    version = version_from_trtexec_output(proc.stdout + proc.stderr) or library_version() or "unknown"
    return {"builder": "trtexec", "tensorrt": version, "command": command}


def build_with_python(trt, config: dict, onnx: str, plan: str) -> dict:
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    precision = config.get("precision", "fp32")
    fp16_graph = bool(config.get("fp16_graph"))
    legacy_fp16 = hasattr(trt.BuilderFlag, "FP16")
    if precision == "fp16" and not fp16_graph and not legacy_fp16:
        raise fp16_impossible(major)
    flags = 0
    if major < 10 and hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    if precision == "fp16" and fp16_graph and legacy_fp16 and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(onnx):
        raise BuildError("TensorRT could not parse the ONNX model: " + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    build_config = builder.create_builder_config()
    build_config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(config.get("workspace_mib", 4096)) << 20)
    if precision == "fp32":
        build_config.clear_flag(trt.BuilderFlag.TF32)
    elif precision == "fp16" and not fp16_graph:
        build_config.set_flag(trt.BuilderFlag.FP16)
    if config.get("hardware_compatible"):
        build_config.hardware_compatibility_level = trt.HardwareCompatibilityLevel.AMPERE_PLUS
    shapes = config["shapes"]
    if shapes.get("min"):
        profile = builder.create_optimization_profile()
        for name in shapes["min"]:
            profile.set_shape(name, shapes["min"][name], shapes["opt"][name], shapes["max"][name])
        build_config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, build_config)
    if serialized is None:
        raise BuildError("TensorRT failed to build the engine; try a smaller max batch size or a larger workspace")
    with open(plan, "wb") as fh:
        fh.write(bytes(serialized))
    io_dtypes = {}
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        io_dtypes[tensor.name] = str(tensor.dtype).rsplit(".", 1)[-1]
    for index in range(network.num_outputs):
        tensor = network.get_output(index)
        io_dtypes[tensor.name] = str(tensor.dtype).rsplit(".", 1)[-1]
    return {"builder": "python", "tensorrt": trt.__version__, "io_dtypes": io_dtypes}


NVIDIA_INDEX = "https://pypi.nvidia.com"


def pip_requirement(library: str, cuda: int | None) -> str:
    """The pip requirement for the TensorRT bindings of libnvinfer ``library`` (x.y.z): PyPI
    versions have four parts (10.13.3.9), so the build number is a wildcard."""
    return "tensorrt-cu{}=={}.*".format(cuda or 12, ".".join(library.split(".")[:3]))


def cuda_major() -> int | None:
    """The image's CUDA major: $CUDA_VERSION (NVIDIA's images set it), else libcudart's name."""
    value = os.environ.get("CUDA_VERSION", "")
    if value[:2].isdigit() or value[:1].isdigit():
        return major_of(value)
    for path in sorted(glob.glob("/usr/local/cuda*/lib64/libcudart.so.*")):
        match = re.search(r"libcudart\.so\.(\d+)", path)
        if match:
            return int(match.group(1))
    return None


def import_tensorrt(allow_pip: bool):
    try:
        import tensorrt  # noqa: F401 - may be absent from the image

        return tensorrt
    except ImportError:
        if not allow_pip:
            return None
    version = library_version()
    if version is None:
        return None
    requirement = pip_requirement(version, cuda_major())
    print("installing {} to match the image's libnvinfer {}".format(requirement, version), flush=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir",
                           "--extra-index-url", NVIDIA_INDEX, requirement])
    if proc.returncode != 0:
        return None
    try:
        import tensorrt

        return tensorrt
    except ImportError:
        return None


def fail(output_dir: str, message: str) -> int:
    print("build failed: " + message, file=sys.stderr, flush=True)
    try:
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, "failure"), "w") as fh:
            fh.write(message[:1000])
    except OSError as exc:
        print("cannot write the failure file: {}".format(exc), file=sys.stderr)
    return 1


def main(argv: list) -> int:
    config_path = argv[1] if len(argv) > 1 else "/opt/ml/input/data/code/build_config.json"
    with open(config_path) as fh:
        config = json.load(fh)
    output_dir = config.get("output_dir", "/opt/ml/output")
    model_dir = config.get("model_dir", "/opt/ml/model")
    onnx = os.path.join(config.get("model_channel", "/opt/ml/input/data/model"), config.get("onnx", "model.onnx"))
    plan = os.path.join(model_dir, "model.plan")
    os.makedirs(model_dir, exist_ok=True)
    if not os.path.isfile(onnx):
        return fail(output_dir, "no ONNX model at {}; check the model channel's S3 URI".format(onnx))
    start = time.time()
    try:
        trtexec = find_trtexec()
        if trtexec is not None:
            info = build_with_trtexec(trtexec, config, onnx, plan)
        else:
            trt = import_tensorrt(bool(config.get("allow_pip", True)))
            if trt is None:
                raise BuildError(
                    "neither trtexec nor the TensorRT Python module is available in this image; "
                    "pass --image-uri with an image of the same release that has TensorRT's tools"
                )
            info = build_with_python(trt, config, onnx, plan)
    except BuildError as exc:
        return fail(output_dir, str(exc))
    info.update(gpu_info())
    info.update({"precision": config.get("precision"), "seconds": round(time.time() - start, 1),
                 "plan_bytes": os.path.getsize(plan), "shapes": config.get("shapes")})
    with open(os.path.join(model_dir, "build_info.json"), "w") as fh:
        json.dump(info, fh, indent=2)
    print("built {} ({} bytes) with TensorRT {} on {}".format(plan, info["plan_bytes"], info["tensorrt"], info["gpu"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
