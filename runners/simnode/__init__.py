"""The simulated GPU node: an SSH server on loopback whose PATH holds simulated node tools (simulated: true)."""
