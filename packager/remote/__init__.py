"""Packaging steps that run in the cloud: ``mme compile --on sagemaker`` builds a TensorRT
plan in a SageMaker training job on the target GPU and lays out its artifact with the
packager's own layout code.

``compile`` runs the steps (and is what callers import); ``plan`` works out the job from the
request and the ONNX artifact, ``job`` uploads its inputs, follows it and reads its output,
``artifact`` writes the tensorrt artifact, and ``trt_build_entry`` is the script the job runs.
"""
