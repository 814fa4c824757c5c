"""The tensorrt artifact of a remote compile, laid out by the packager's own code: the Triton
model directory and MME tarball through ``packager.layout``, config.pbtxt through
``packager.triton_config`` (the ONNX artifact's config, turned into a TensorRT plan's), the
sample requests of the ONNX artifact, and a manifest whose build details name the training
job, its image, GPU and TensorRT version.
"""

from __future__ import annotations

import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from mme import __version__
from mme.fsutil import staged_directory
from mme.versions import release as triton_release
from packager import layout
from packager.formats.base import ExportedModel
from packager.formats.gpu import HARDWARE_COMPATIBLE
from packager.manifest import Manifest
from packager.manifest_records import BuildDetails, TritonSettings, TritonTarget, Validation
from packager.model_config import mc  # enum values only; text I/O is triton_config's
from packager.remote.job import PLAN_FILE, JobOutput
from packager.remote.plan import CompilePlan, OnnxArtifact
from packager.triton_config import read_config

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

FORMAT = "tensorrt"
PLATFORM = "tensorrt_plan"
INSTANCE_KIND = "KIND_GPU"
# TensorRT's dtype names (build_info.json's io_dtypes) -> Triton's
TRT_TO_TRITON = {"FLOAT": "TYPE_FP32", "HALF": "TYPE_FP16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64",
                 "INT8": "TYPE_INT8", "BOOL": "TYPE_BOOL", "BF16": "TYPE_BF16", "UINT8": "TYPE_UINT8"}


def tensorrt_config(onnx_config: "ModelConfig", max_batch: int, io_dtypes: Mapping[str, str]) -> "ModelConfig":
    """The ONNX artifact's config as a TensorRT plan's: platform tensorrt_plan, no backend or
    ONNX parameters, the plan's max batch size, the I/O dtypes the engine really has (when the
    job recorded them), GPU instances."""
    config = mc.ModelConfig()
    config.CopyFrom(onnx_config)
    config.ClearField("backend")
    config.ClearField("parameters")
    config.ClearField("default_model_filename")
    config.platform = PLATFORM
    config.max_batch_size = max_batch
    for tensor in list(config.input) + list(config.output):
        triton = TRT_TO_TRITON.get(str(io_dtypes.get(tensor.name, "")).upper())
        if triton:
            tensor.data_type = mc.DataType.Value(triton)
    if not config.instance_group:
        config.instance_group.add(count=1)
    for group in config.instance_group:
        group.kind = mc.ModelInstanceGroup.Kind.Value(INSTANCE_KIND)
    return config


def build_details(plan: CompilePlan, artifact: OnnxArtifact, output: JobOutput) -> BuildDetails:
    info = output.info
    return BuildDetails.from_dict({
        "tensorrt": info.tensorrt,
        "precision": plan.precision,
        "builder_settings": {"command": info.command} if info.command else {},
        "hardware_compatibility": HARDWARE_COMPATIBLE if plan.build_config.get("hardware_compatible") else "none",
        "gpu": info.gpu,
        "compute_capability": info.compute_capability,
        "built_on": plan.instance_type,
        "builder": info.builder,
        "training_job": plan.job_name,
        "training_image": plan.image_uri,
        "onnx_sha256": artifact.sha256,
        "profile_shapes": plan.build_config["shapes"],
        "task": artifact.manifest.details.task,
        "axes_max": artifact.manifest.details.axes_max,
    })


def write_tensorrt_artifact(plan: CompilePlan, artifact: OnnxArtifact, output: JobOutput, job: Mapping[str, Any]) -> Path:
    """``plan.out_dir``, laid out as 'mme package' lays out an artifact and swapped in atomically."""
    onnx_manifest = artifact.manifest
    name = artifact.model
    config = tensorrt_config(read_config(artifact.config), plan.max_batch_size, output.info.io_dtypes)
    # The plan's I/O is the ONNX artifact's, already in the config and its manifest.
    exported = ExportedModel(format=FORMAT, files={PLAN_FILE: output.plan_file}, inputs=(), outputs=())
    with staged_directory(plan.out_dir) as staging:
        layout.write_model_directory(staging, name, exported, config)
        sample = onnx_manifest.sample_request
        for sample_file in (sample.json_file, sample.binary_file):
            if (artifact.directory / sample_file).is_file():
                layout.place_file(artifact.directory / sample_file, staging / sample_file)
        tarball = layout.write_tarball(staging, name)
        triton = TritonSettings(
            platform=PLATFORM, backend=None, max_batch_size=plan.max_batch_size, instance_kind=INSTANCE_KIND,
            dynamic_batching=onnx_manifest.triton.dynamic_batching,
            target=TritonTarget.from_release(triton_release(plan.release)),
        )
        versions = dict(onnx_manifest.versions) | {"mme-toolkit": __version__, "python": platform.python_version(),
                                                   "tensorrt": output.info.tensorrt}
        seconds = job.get("TrainingTimeInSeconds") or job.get("BillableTimeInSeconds")
        manifest = Manifest(
            model=name, requested_name=onnx_manifest.requested_name, format=FORMAT, source=onnx_manifest.source,
            triton=triton, tarball=tarball.name, files=layout.file_entries(staging), parameters=onnx_manifest.parameters,
            inputs=onnx_manifest.inputs, outputs=onnx_manifest.outputs, sample_request=sample, versions=versions,
            validation=Validation(passed=None, skipped=f"built remotely by SageMaker training job {plan.job_name}; "
                                  "not compared with PyTorch here (run the model on the endpoint to check it)"),
            timings_s={"compile_job": float(seconds)} if seconds else {},
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            details=build_details(plan, artifact, output),
        )
        manifest.write(staging)
    return plan.out_dir
