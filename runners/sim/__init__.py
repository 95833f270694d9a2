"""The simulated vLLM + LMCache + FX server (docs/simulator.md). Everything it produces is simulated: true."""
