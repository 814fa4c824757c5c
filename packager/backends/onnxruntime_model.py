"""Triton python-backend model that runs ``model.onnx`` (next to this file) with ONNX Runtime.

Written by ``mme package`` as ``<model>/1/model.py`` for the cpu-local format, so the
Triton server that runs without a GPU (python backend only) serves the same ONNX file,
with the same input and output names, as the onnxruntime backend would. Input and
output names and the thread count come from config.pbtxt; nothing here is generated.
Requests queued together by Triton's dynamic batcher run as one ONNX Runtime call.
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(params.get("intra_op_num_threads", "0") or 0)
        options.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], params.get("onnx_file", "model.onnx"))
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        self.input_names = [i["name"] for i in config["input"]]
        self.output_names = [o["name"] for o in config["output"]]
        self.output_dtypes = {
            o["name"]: pb_utils.triton_string_to_numpy(o["data_type"]) for o in config["output"]
        }

    def execute(self, requests):
        arrays = [
            [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in self.input_names] for r in requests
        ]
        responses = [None] * len(requests)
        # Group requests whose non-batch shapes agree, run each group as one batch.
        groups = {}
        for index, inputs in enumerate(arrays):
            key = tuple(a.shape[1:] for a in inputs)
            groups.setdefault(key, []).append(index)
        for indices in groups.values():
            feeds = {
                name: np.concatenate([arrays[i][k] for i in indices]) if len(indices) > 1 else arrays[indices[0]][k]
                for k, name in enumerate(self.input_names)
            }
            try:
                outputs = self.session.run(self.output_names, feeds)
            except Exception as exc:  # one bad request must not fail the others' groups
                for i in indices:
                    responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
                continue
            offset = 0
            for i in indices:
                size = arrays[i][0].shape[0]
                tensors = [
                    pb_utils.Tensor(name, out[offset:offset + size].astype(self.output_dtypes[name], copy=False))
                    for name, out in zip(self.output_names, outputs)
                ]
                responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)
                offset += size
        return responses

    def finalize(self):
        self.session = None
