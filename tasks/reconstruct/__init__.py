"""Reconstruct stage: exact training ids (input_ids, loss_mask) for each generated reply."""
