"""``python -m runners.agent`` (``--check``: reach the control plane once and say who this agent is)."""
import logging
import os
import sys

from runners.agent.main import main

code = main()
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
# Not sys.exit: a call still running after the grace must not hold the process up (its pool thread is not a daemon).
os._exit(code)
