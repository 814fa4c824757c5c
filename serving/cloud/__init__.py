"""A local SageMaker: the hosting control plane, the runtime of the endpoints it creates, S3 and
CloudWatch on one address (``mme cloud``). ``server`` assembles it; ``api`` is SageMaker's wire
format, ``control_plane`` its hosting resources, ``hosting`` the endpoints' local runtimes and
``cloudwatch`` what they publish."""
