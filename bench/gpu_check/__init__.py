"""The GPU check (``mme gpu-check``): what a GPU host has, and measurements on it.

``detect`` says what the host offers (PyTorch and CUDA, NVML, TensorRT, nvidia-pytriton,
Docker); ``run`` packages a model with ``mme package`` and measures TorchScript (and
TensorRT) latency on CUDA, GPU memory per loaded copy with the project's NVML meter, the
copies that fit as ``mme capacity`` predicts them, a Hugging Face encoder traced on the CPU
and run on CUDA, and ``mme capacity``'s GPU path against the nvidia-pytriton wheel's Triton.
``--device cpu`` runs every step's code on the CPU (CI does). tests/gpu/gpu_check.sh runs it
on a bare GPU host. Modules: detect (host facts), runners (TorchScript/TensorRT on CUDA),
copies (memory per copy), triton (the python-backend copy served by Triton), steps (the
budgeted run), report (gpu_check.json/.md), cli (the subcommand).
"""

EXIT_NO_GPU = 4  # `mme gpu-check run` on a host without a usable GPU (with --device cuda)
