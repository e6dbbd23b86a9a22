"""Running what the store reserved: engine launch specs (vLLM, llama.cpp, MLX), the local
process supervisor, readiness probes and failure classification."""
