"""qsapp: a Flower / PyTorch app."""
