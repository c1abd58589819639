"""llama.cpp side of clef-bridge, in rooms that import downwards only:
host < gguf < media < llama < model < server < scale (each room's docstring says what it may import)."""
