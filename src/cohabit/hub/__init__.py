"""The Hugging Face Hub: search, file listings with the hashes the Hub publishes, verified and
resumable downloads into the model store, and GGUF variant choice."""
