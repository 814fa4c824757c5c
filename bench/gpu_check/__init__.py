"""The GPU check (``mme gpu-check``): what a GPU host has, and measurements on it.

``detect`` says what the host offers (PyTorch and CUDA, the driver, NVML, TensorRT,
nvidia-pytriton, gRPC and protobuf, ISA-L, libpython, network namespaces, Docker); ``run``
prints that preflight first, then packages a model with ``mme package`` and measures: the
wheel's Triton serving python-backend copies on the GPU (``mme capacity``'s GPU path, to the
real threshold of a limit), TorchScript latency with TF32 off and on, copies in this process
to the real threshold (first copy apart), TensorRT where installed (NOT MEASURED where not)
and a Hugging Face encoder traced on the CPU and run on CUDA. ``--device cpu`` runs every
step's code on the CPU (CI does). tests/gpu/gpu_check.sh runs it on a bare GPU host; its
wheels are tests/gpu/wheels.txt. Modules: detect (host facts, preflight), runners
(TorchScript/TensorRT on CUDA, timing), copies (memory per copy), triton (the python-backend
copy served by Triton), steps (the budgeted run), report (gpu_check.json/.md), cli.
"""

EXIT_FAILED = 1  # a step failed
EXIT_PARTIAL = 3  # every step that ran passed, but a figure is missing (TensorRT absent, the budget spent)
EXIT_NO_GPU = 4  # no usable GPU: nothing measured on one (the CPU dry run too, unless --allow-no-gpu)
