"""mme: package, serve locally, size and load-test models for GPU multi-model endpoints.

This package holds the command line and what every stage shares (errors, atomic file
writes, progress output). The stages live in ``packager``, ``serving`` and ``bench``.
"""

__version__ = "0.1.0"
