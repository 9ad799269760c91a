"""EAGLE-3 draft: model, draft vocabulary, training with the training-time test, export."""
