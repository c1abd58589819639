"""Clef's joint schema head in numpy: weights, forward, prompt encoder, answers. No llama.cpp, no HTTP."""
