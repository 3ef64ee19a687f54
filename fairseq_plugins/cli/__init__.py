"""Command-line tools of the suite (installed as console scripts, mirrored under scripts/)."""
