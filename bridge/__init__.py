"""llama.cpp side of clef-bridge: the backbone, GGUF reading, the model registry and the pipeline."""
