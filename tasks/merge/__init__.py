"""Merge stage: reconstructed sources into one deduplicated, mixed, split training set."""
