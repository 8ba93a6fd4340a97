"""The HTTP edge: the only package that imports FastAPI."""
