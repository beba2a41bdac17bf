"""A run's own state in its workdir: Orbax checkpoints that verify themselves (``manager``,
``checksum``), the workdir read back and a resume checked against it (``workdir``), and one run
per workdir (``lock``)."""
