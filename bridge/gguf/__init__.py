"""GGUF files without llama.cpp: the header reader, the writer, llama.cpp's `clef` format, split/join, projector headers. May import: head, host."""
