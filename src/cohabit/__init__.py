"""cohabit: estimate each LLM deployment's memory, reserve it on a GPU, MIG slice or memory
pool, and serve many models side by side without out-of-memory surprises."""

__version__ = "0.1.0"
