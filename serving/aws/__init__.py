"""Cloud commands: push artifacts to S3, deploy and delete SageMaker endpoints, fetch their
CloudWatch metrics, and build TensorRT plans in a SageMaker training job.

Each command is safe to run twice (what already matches is skipped) and safe to interrupt
(no half object in S3; a deployment's state file lists what was created, for ``mme delete``).
boto3 is imported only when a command runs.
"""
