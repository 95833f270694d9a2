"""The simulated server's fast paths write exactly what its general encoder writes: the token events of a streamed
completion from parts made once per request, and the first event's echo of a token-id prompt from the request's
own JSON text (only when that text is already compact JSON)."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from runners.sim import server


@pytest.mark.parametrize("want_ids", [True, False])
@pytest.mark.parametrize("name", ["Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", 'odd "model"/ü'])
def test_token_events_are_byte_for_byte_what_the_encoder_writes(want_ids, name):
    events = server.CompletionEvents("cmpl-0123abcd", name, 1796171168, want_ids)
    rng = random.Random(7)
    for token in [server.TOKEN_BASE + rng.randrange(server.TOKEN_SPAN) for _ in range(300)]:
        for finish in (None, "length"):
            assert events.token(token, finish) == server._chunk("cmpl-0123abcd", name, 1796171168, False, token, finish,
                                                                want_ids=want_ids)


def test_the_prompt_echo_reuses_the_requests_json_only_when_it_is_compact():
    body = server.parse_body(b'{"model":"m","prompt":[5,10,1234,99999],"max_tokens":3,"return_token_ids":true}', True)
    assert body[server.PROMPT_JSON] == b"[5,10,1234,99999]"
    assert isinstance(body["prompt"], np.ndarray) and body["prompt"].tolist() == [5, 10, 1234, 99999]
    fast = server.CompletionEvents("r", "m", 1, True).token(1234, None, body[server.PROMPT_JSON])
    assert fast == server._chunk("r", "m", 1, False, 1234, None, want_ids=True, prompt_ids=body["prompt"])
    assert json.loads(fast[len(b"data: "):])["choices"][0]["prompt_token_ids"] == [5, 10, 1234, 99999]
    # spaces, a leading zero, a token id 0: parsed as before, echoed by the encoder
    for raw in (b'[5, 10]', b'[05,10]', b'[5,0,10]', b'[0,5]'):
        body = server.parse_body(b'{"model":"m","prompt":' + raw + b',"max_tokens":3}', True)
        assert server.PROMPT_JSON not in body and body["prompt"].tolist() == json.loads(raw.replace(b"05", b"5"))
