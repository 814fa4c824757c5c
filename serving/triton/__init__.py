"""Triton servers that speak the SageMaker multi-model contract, one kind per row of
:data:`serving.triton.factory.SERVER_KINDS`: from the nvidia-pytriton wheel
(:mod:`serving.triton.local`, no GPU needed), NVIDIA's container (:mod:`serving.triton.docker`,
GPU hosts) or the tritonserver of this image (:mod:`serving.triton.system`);
:func:`create_server` picks one. :mod:`serving.triton.container` is the one client of their
SageMaker port (``/ping``, ``/models``, invocations)."""
