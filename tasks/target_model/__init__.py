"""The target model: packaged assets, loading, and the tokenizer preflight."""
