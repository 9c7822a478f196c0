"""An OpenAI-compatible server as the engine: llama.cpp's llama-server, vLLM, SGLang or
`specscope serve`. Its stream and its counters become the same Rounds the local engines yield,
at the granularity the server reports; what it does not report stays unknown (None)."""
