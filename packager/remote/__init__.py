"""Packaging steps that run in the cloud: ``mme compile --on sagemaker`` builds a TensorRT
plan in a SageMaker training job on the target GPU and lays out its artifact with the
packager's own layout code."""
