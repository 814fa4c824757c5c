"""Entry script of the ``mme compile --on sagemaker`` training job: ONNX -> TensorRT plan.

Runs inside the serving image (the SageMaker Triton image of the target release) on the
target instance type, so the plan matches the TensorRT version and GPU it will be served
with. Standard library only (Python 3.8+): the image has no extra packages.

    python3 build_plan.py /opt/ml/input/data/code/build_config.json

Builder, in order: ``trtexec`` (on PATH or /usr/src/tensorrt/bin), the TensorRT Python
module, or, when allowed, ``pip install tensorrt==<the image's libnvinfer version>``.
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


def trtexec_command(trtexec: str, config: dict, onnx: str, plan: str) -> list:
    command = [trtexec, "--onnx=" + onnx, "--saveEngine=" + plan]
    shapes = config["shapes"]
    if shapes.get("min"):
        command += ["--minShapes=" + shape_arg(shapes["min"]), "--optShapes=" + shape_arg(shapes["opt"]),
                    "--maxShapes=" + shape_arg(shapes["max"])]
    command.append("--memPoolSize=workspace:{}M".format(int(config.get("workspace_mib", 4096))))
    if config.get("precision") == "fp16":
        command.append("--fp16")
    return command


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
    command = trtexec_command(trtexec, config, onnx, plan)
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
    flags = 0
    if major < 10 and hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(onnx):
        raise BuildError("TensorRT could not parse the ONNX model: " + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    build_config = builder.create_builder_config()
    build_config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(config.get("workspace_mib", 4096)) << 20)
    if config.get("precision") == "fp16" and hasattr(trt.BuilderFlag, "FP16"):
        build_config.set_flag(trt.BuilderFlag.FP16)
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
    print("installing tensorrt=={} to match the image's libnvinfer".format(version), flush=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "tensorrt=={}".format(version)])
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
