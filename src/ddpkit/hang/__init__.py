"""Hang forensics: the collective tracer, the watchdog that reports a stuck rank, and torch's flight recorder."""
