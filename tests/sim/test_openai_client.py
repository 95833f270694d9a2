"""The official openai client talks to the simulated server as to vLLM."""
from openai import OpenAI

from tests.sim.conftest import MODEL


def test_the_openai_client_streams_a_completion_with_usage(node, servers):
    server = servers(node, "fx")
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    stream = client.completions.create(model=MODEL, prompt="Explain KV cache tiering in one line.", max_tokens=5,
                                       temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text.strip()
    assert usage.completion_tokens == 5 and usage.prompt_tokens > 0
    assert usage.prompt_tokens_details is None  # vLLM 0.20.1: no details at all when nothing was cached
    assert all(c.model_extra.get("simulated") is True for c in chunks)


def test_the_openai_client_streams_a_chat(node, servers):
    server = servers(node, "recompute")
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello there"}],
                                            max_tokens=3, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(content.split()) == 3
    assert chunks[-1].usage.completion_tokens == 3


def test_a_non_streamed_completion_says_it_is_simulated(node, servers):
    server = servers(node, "recompute")
    response = OpenAI(base_url=server.url + "/v1", api_key="unused").completions.with_raw_response.create(
        model=MODEL, prompt=[1001, 1002, 1003], max_tokens=2, temperature=0)
    assert response.headers["x-fxpilot-simulated"] == "1"
    completion = response.parse()
    assert completion.usage.completion_tokens == 2 and completion.model_extra["simulated"] is True


def test_an_unknown_model_is_a_404_like_vllm(node, servers):
    server = servers(node, "recompute")
    status, headers, body = server.post("/v1/completions", {"model": "other", "prompt": "x"})
    assert status == 404 and b"does not exist" in body and headers["X-Fxpilot-Simulated"] == "1"


def test_models_and_metrics_say_the_server_is_simulated(node, servers):
    server = servers(node, "fx", args=("--sim-time-scale", "0.002"))
    models = OpenAI(base_url=server.url + "/v1", api_key="unused").models.list()
    assert models.data[0].id == MODEL and models.model_extra["simulated"] is True
    metrics = server.metrics()
    assert metrics["fxpilot_simulated"] == 1 and metrics["fxpilot_sim_time_scale"] == 0.002


def test_a_prompt_longer_than_the_model_allows_is_a_400(node, servers):
    server = servers(node, "recompute", args=("--max-model-len", "100"))
    status, _, body = server.post("/v1/completions", {"model": MODEL, "prompt": list(range(1000, 1100))})
    assert status == 400 and b"maximum context length is 100 tokens" in body and b'"simulated": true' in body
