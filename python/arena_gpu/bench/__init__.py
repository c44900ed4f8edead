"""python -m arena_gpu.bench: the README's table for this card (see __main__)."""
