"""The embedded demo model: a small Qwen3-Next trained on Python sources, its data, vocabulary, training and export."""
