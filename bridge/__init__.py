"""llama.cpp side of clef-bridge, in rooms that import downwards only: catalogue < host < gguf < demo < media <
llama < config < model < service < server < scale (each room's docstring says what it may import)."""
