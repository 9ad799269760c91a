"""Validate stage: how far the rebuilt ids can be trusted, per row and per source."""
