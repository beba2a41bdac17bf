"""A run's checkpoints and the release files: ``manager`` (Orbax run state, saved with
checksums, restored and verified), ``release`` (the release .npz format), ``checksum``."""
