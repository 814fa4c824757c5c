"""Where a target's model comes from and where it is unpacked: sources (``store``: a local
directory or an S3 prefix; ``copies``: ``--copies`` names), the checked extraction of a tarball
(``extract``, over :mod:`mme.archive`), the model cache on disk (``cache``, ``cache_entries``)
and a real-time endpoint's one model (``repository``)."""
