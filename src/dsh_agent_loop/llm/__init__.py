"""Model adapters: the seam (``base``), the router, SSE parsing, and the providers.

``openai`` (OpenAI-compatible chat completions: DeepSeek, OpenAI, vLLM, Ollama, llama.cpp),
``anthropic`` (Messages API) and ``scripted`` (``ScriptedModel``: tests and simulations).
"""
