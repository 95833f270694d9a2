"""Simulated build of lmcache.c_ops: stands for the extension built for HIP, linked against libamdhip64.so.6."""
SIMULATED = True
