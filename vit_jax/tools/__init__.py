"""Read-only tools over a finished run or a release file: ``aot`` (plan a TPU run),
``export``, ``predict``, ``inspect`` and ``analysis``. Nothing in training imports them."""
