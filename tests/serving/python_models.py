"""Tiny python-backend models whose load and inference take as long as a test needs, packed
as SageMaker MME tarballs: for the 60-second rules, concurrent loads and the churn benchmark.

Each model echoes ``INPUT0`` (FP32, any length) to ``OUTPUT0``; ``initialize`` sleeps
``load_s`` seconds, ``execute`` sleeps ``infer_s`` seconds (or, with ``infer_gate``, waits
until that file exists: a request that hangs until the test lets it go). config.pbtxt is
written through Triton's protobuf like every config in the project.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from mme.fsutil import deterministic_tar_gz

MODEL_PY = '''\
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

LOAD_S = {load_s!r}
INFER_S = {infer_s!r}
INFER_GATE = {infer_gate!r}


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(LOAD_S)

    def execute(self, requests):
        if INFER_GATE:
            while not os.path.exists(INFER_GATE):
                time.sleep(0.05)
        time.sleep(INFER_S)
        replies = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", x.astype(np.float32))
            replies.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return replies
'''


def echo_config() -> mc.ModelConfig:
    """No ``name``: the MME loads each model under its target's name."""
    config = mc.ModelConfig(backend="python", max_batch_size=0)
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[-1])
    config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[-1])
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    return config


def write_echo_model(directory: Path, name: str, *, load_s: float = 0.0, infer_s: float = 0.0,
                     infer_gate: str = "") -> Path:
    """``directory/name`` as a Triton model directory; returns it."""
    model = directory / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(text_format.MessageToString(echo_config()))
    (model / "1" / "model.py").write_text(MODEL_PY.format(load_s=load_s, infer_s=infer_s, infer_gate=infer_gate))
    return model


def write_echo_tarball(models_dir: Path, target: str, *, load_s: float = 0.0, infer_s: float = 0.0,
                       infer_gate: str = "") -> Path:
    """``models_dir/target`` (a ``.tar.gz`` holding one echo model directory)."""
    name = target.removesuffix(".tar.gz").replace("-", "_").replace(".", "_")
    staging = Path(tempfile.mkdtemp(prefix="echo-model-"))
    try:
        model = write_echo_model(staging, name, load_s=load_s, infer_s=infer_s, infer_gate=infer_gate)
        models_dir.mkdir(parents=True, exist_ok=True)
        deterministic_tar_gz(model, name, models_dir / target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return models_dir / target


def echo_request(values=(1.0, 2.0)) -> bytes:
    """A KServe v2 JSON request for the echo models."""
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "FP32",
                                   "data": list(values)}]}).encode()
