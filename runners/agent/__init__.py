"""The site agent: the one fxpilot process on a customer's jump host (issue 29; docs/architecture.md).

It dials out to the control plane over HTTPS with its site's bearer token, long-polls for its site's calls
("run this command", "write this file", "read this file", "open a connection" on node N), performs them over SSH
with the node's host key pinned and the site's SSH keys sealed to its own X25519 key, streams the output back and
reports each result until the control plane has it.

Django-free on purpose: it runs where there is no database, no settings and no ``SECRET_KEY``. It imports the
standard library, paramiko, cryptography, PyNaCl and ``runners.sealing`` — never ``runners.ssh``,
``runners.models``, ``runners.credentials`` or anything else that imports Django
(tests/agent/test_agent_process.py checks it in a fresh interpreter).

    FXPILOT_AGENT_URL=https://fxpilot.example FXPILOT_AGENT_TOKEN=fxa_… FXPILOT_AGENT_STATE=/var/lib/fxpilot-agent \\
        python -m runners.agent            # run;   --check: reach /hello once, print the site and the key
"""

VERSION = "1"
