"""Observing compiles: compile events by source, phase, metrics, the post-import finder, doctor."""
