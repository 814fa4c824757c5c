"""serving: a local SageMaker multi-model (or real-time) endpoint in front of a real Triton
server, and the SageMaker lifecycle of a real one. Its folders follow the data flow:

* ``models/``: where a target's model comes from and where it is unpacked (sources, the safe
  extraction of a tarball, the model cache, copies, a real-time endpoint's repository);
* ``triton/``: the Triton server that loads them (its kinds, one table in ``factory``; its
  process lifecycle; the container API client of its SageMaker port);
* ``stack``: the two assembled as the endpoint runs them (also for ``mme capacity`` and the GPU check);
* ``monitor/``: what the instance holds (memory meters, CPU/GPU/disk readings);
* ``runtime/``: the endpoint SageMaker Runtime clients call (front, admission, forwarding,
  recovery, outcomes and replies, metrics, the local endpoint and a fleet of them);
* ``deploy/``: push, deploy, delete, metrics and compile against AWS;
* ``cli``: ``mme serve`` and ``mme capacity``; ``metrics_model/``: the gpu-metrics model.
"""
