"""Model sources: one module per family (timm, Hugging Face transformers)."""
