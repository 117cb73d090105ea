"""plexgpu: GPU-only processing of multiplexed-imaging cycles (CODEX/PhenoCycler).

The library behind the Snakemake workflow: raw discovery, BaSiC, stitching,
deconvolution, EDF, registration on one NumPy/CuPy seam (`plexgpu.xp`), cycle
assignment to GPU accounts, the GPU guard and accounting.
"""

__version__ = "0.1.0"
