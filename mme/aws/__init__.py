"""The AWS kernel shared by the cloud steps: sessions and clients, S3 URIs and transfers,
error wording, state files and the SageMaker Triton image URIs.

Used by ``packager.remote`` (TensorRT compile in a SageMaker training job),
``serving.deploy`` (push, deploy, delete, CloudWatch metrics) and
``sizing.capacity_remote``. boto3 is imported only when a command runs.
"""
