"""This machine: cache folders, progress bars, the GPU (CuPy, NVML).

May import: head, catalogue.
"""
