"""Deploy: push artifacts to S3 (``s3push``), create SageMaker endpoints (``endpoint``) and
delete them (``delete``), both driven by one table of the three SageMaker resources
(``resources``), fetch their CloudWatch metrics (``cloudwatch``); ``cli`` registers
``mme push | deploy | delete | metrics | compile``.

Each command is safe to run twice (what already matches is skipped) and safe to interrupt
(no half object in S3; a deployment's state file lists what was created, for ``mme delete``).
boto3 is imported only when a command runs.
"""
