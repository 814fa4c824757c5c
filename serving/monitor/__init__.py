"""What the instance holds while it serves: memory meters (``memory``: the GPU through NVML, or
the RSS of Triton's process tree) and CPU, GPU and disk readings (``instance_metrics``)."""
