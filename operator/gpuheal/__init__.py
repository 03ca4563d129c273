"""gpuheal: keeps GPU training clusters healthy."""
