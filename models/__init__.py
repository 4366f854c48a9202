"""Model code: attention, masks and (in later issues) the two model families.

Imports only torch, so every module can be used on its own, in a notebook or another project.
"""
