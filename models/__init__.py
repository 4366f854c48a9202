"""Model code: masks, attention, the two model families, search.

Imports only torch, so every module can be used on its own, in a notebook or another project.
"""
