"""Simulated LMCache install on a simulated node (fxpilot simnode): versions only, simulated: true."""
__version__ = "0.3.15.dev12"
__commit__ = "4f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39"
SIMULATED = True
