"""Image algorithms on the one NumPy/CuPy seam (plexgpu.xp): illumination (BaSiC, shading),
stitching, deconvolution and PSFs, extended depth of field, registration, synthetic data."""
