"""Data: prompt/response templates, packing, synthetic tasks, sources."""
