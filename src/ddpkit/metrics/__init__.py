"""Rank-0 reporting: the metrics log, progress bars and print0, experiment trackers, and plots."""
