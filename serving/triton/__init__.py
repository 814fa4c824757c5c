"""Triton servers that speak the SageMaker multi-model contract: from the nvidia-pytriton
wheel (:mod:`serving.triton.local`, no GPU needed) or NVIDIA's container
(:mod:`serving.triton.docker`, GPU hosts); :func:`create_server` picks one."""

from serving.triton.base import TritonServer
from serving.triton.config import TritonServerConfig, TritonServerError, TritonStartupError
from serving.triton.factory import create_server

__all__ = ["TritonServer", "TritonServerConfig", "TritonServerError", "TritonStartupError", "create_server"]
