"""Evaluate a draft: greedy chain speculative decoding against the target, acceptance length."""
