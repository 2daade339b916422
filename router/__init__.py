"""OpenAI-compatible router and the model-server simulator."""
