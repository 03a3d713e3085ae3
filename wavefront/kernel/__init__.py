"""The cuTile kernels and their host side (needs cuda-tile and CuPy: the `gpu` extra)."""
