"""A run's own state in its workdir: Orbax checkpoints that verify themselves (``manager``,
``checksum``), the workdir read back (``workdir``; ``record``: what needs no jax, a resume
checked against the run among it), and one run per workdir (``lock``)."""
