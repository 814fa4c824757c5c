"""Triton python-backend model that runs ``model.pt`` (TorchScript, next to this file) on the
GPU with PyTorch. The GPU check serves copies of it from the nvidia-pytriton wheel's
tritonserver (python backend only), so `mme capacity`'s GPU path runs against a real Triton
on a GPU host that has neither Docker nor Triton's libtorch backend. Input and output names
come from config.pbtxt (INPUT__0... / OUTPUT__0..., Triton's libtorch convention)."""

import json
import os

import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.device = params.get("device") or "cuda"  # "cpu": the GPU check's dry run on a CPU host
        if params.get("tf32") == "false":  # fp32 as PyTorch on the CPU computes it: compared like for like
            # (packager.formats.torchscript.fp32_math does this for the project; this file runs in Triton alone)
            if hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(torch.backends.cudnn, "conv"):
                torch.backends.cuda.matmul.fp32_precision = "ieee"
                torch.backends.cudnn.conv.fp32_precision = "ieee"
                torch.backends.cudnn.rnn.fp32_precision = "ieee"
            else:
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
        path = os.path.join(args["model_repository"], args["model_version"], "model.pt")
        self.module = torch.jit.load(path, map_location=self.device).eval()
        self.input_names = [i["name"] for i in config["input"]]
        self.output_names = [o["name"] for o in config["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tensors = [torch.from_numpy(pb_utils.get_input_tensor_by_name(request, name).as_numpy()).to(self.device)
                           for name in self.input_names]
                with torch.inference_mode():
                    out = self.module(*tensors)
                out = out if isinstance(out, (tuple, list)) else (out,)
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor(name, o.float().cpu().numpy()) for name, o in zip(self.output_names, out)]))
            except Exception as exc:  # one bad request must not fail the others
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses
