"""The embedded target server: the configured target behind an OpenAI-compatible endpoint on 127.0.0.1."""
