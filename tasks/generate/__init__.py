"""Generate stage: prompts in, the target's replies out, over any OpenAI-compatible chat API."""
