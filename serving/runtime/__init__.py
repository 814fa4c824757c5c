"""The endpoint SageMaker Runtime clients call: the HTTP ``front``, the multi-model ``endpoint``
(``admission``, ``forward``, ``recovery``, its ``container_port``) and the ``realtime`` one,
their typed ``outcomes`` and SageMaker's replies (``errors_sagemaker``, ``reply_headers``,
``sigv4_verify``), ``metrics``, the ``startup_checks``, ``exposure``, and the whole local
endpoint (``local_endpoint``) or a fleet of them (``fleet_router``)."""
