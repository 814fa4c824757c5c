"""Files copied verbatim into Triton model directories (not imported by the toolkit)."""
