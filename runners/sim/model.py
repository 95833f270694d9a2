"""Physical quantities of the simulated stack: the model, the GPUs, the links and disks.

Every number here is a physical quantity with its source in docs/simulator.md; nothing is a table of
answers. The simulator derives step times, read-back times and tier capacities from them.
Pure Python, no I/O: the engine and the calibration import it.
"""
from __future__ import annotations

from dataclasses import dataclass

GB = 1e9                      # storage and link figures are decimal (10^9 bytes)
GIB = 1024 ** 3


@dataclass(frozen=True)
class ModelSpec:
    """Qwen3-Coder-480B-A35B-Instruct-FP8 (Hugging Face config.json)."""
    name: str = "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8"
    layers: int = 62
    hidden: int = 6144
    q_heads: int = 96
    kv_heads: int = 8
    head_dim: int = 128
    experts: int = 160
    experts_per_token: int = 8
    expert_ffn: int = 2560        # moe_intermediate_size
    vocab: int = 151936
    weight_bytes: float = 1.0     # FP8 weights (block-scaled; scales are < 0.1 % and ignored)
    kv_cache_bytes: float = 1.0   # --kv-cache-dtype fp8 (fp8_e4m3), the usual setting on MI300-class GPUs

    @property
    def attention_params(self) -> float:
        q = self.hidden * self.q_heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.q_heads * self.head_dim * self.hidden
        return float(self.layers * (q + kv + o))

    @property
    def expert_params(self) -> float:
        """One expert of one layer (gate, up, down projections)."""
        return 3.0 * self.hidden * self.expert_ffn

    @property
    def embedding_params(self) -> float:
        return float(self.vocab * self.hidden)

    @property
    def total_params(self) -> float:
        return self.attention_params + self.layers * self.experts * self.expert_params + 2 * self.embedding_params

    @property
    def active_params(self) -> float:
        """Parameters one token multiplies through (attention, 8 experts per layer, the LM head)."""
        return self.attention_params + self.layers * self.experts_per_token * self.expert_params \
            + self.embedding_params

    def kv_bytes_per_token(self) -> float:
        """K and V, every layer, every KV head: 2 x 62 x 8 x 128 x 1 B = 126,976 B at FP8."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.kv_cache_bytes

    def attention_flops(self, start: int, length: int) -> float:
        """FLOPs of QK^T and AV for ``length`` new tokens after ``start`` cached ones (causal)."""
        per_position = 4.0 * self.layers * self.q_heads * self.head_dim
        return per_position * (length * start + length * (length + 1) / 2.0)

    def weight_bytes_touched(self, tokens: int) -> float:
        """Weight bytes one forward pass reads: dense parts always, experts that at least one token routes to."""
        share = 1.0 - (1.0 - self.experts_per_token / self.experts) ** max(tokens, 1)
        experts = self.layers * self.experts * share * self.expert_params
        return (self.attention_params + experts + self.embedding_params) * self.weight_bytes


@dataclass(frozen=True)
class Hardware:
    """One node: 8 x AMD Instinct MI308X (192 GB HBM3 each), tensor parallel 8."""
    gpus: int = 8
    hbm_bytes_per_gpu: float = 192 * GB
    hbm_bandwidth: float = 5.3e12            # B/s per GPU (HBM3, 8 stacks, as MI300X)
    hbm_efficiency: float = 0.6              # achieved share of HBM bandwidth by decode kernels
    prefill_flops: float = 54e12             # effective FLOP/s per GPU in prefill (calibrated, docs/simulator.md)
    step_overhead: float = 0.0155            # s per engine step: launches, 124 all-reduces, sampling, scheduler
    gpu_memory_utilization: float = 0.90     # vLLM default
    activation_reserve: float = 12 * GB      # per GPU: activations, graphs, RCCL buffers at 8192 batched tokens
    h2d_bandwidth: float = 25 * GB           # host -> GPU copies per GPU (PCIe Gen5 x16, pinned, achieved)
    cold_read_patched: float = 5.23 * GIB    # per-GPU cold read with the parallel-read patch (R1; LMCache prints GiB/s)
    cold_read_unpatched: float = 0.98 * GIB  # the same without the patch (R1)
    chunk_overhead: float = 20e-6            # s per chunk per rank in a retrieval (copy launch, event sync)


@dataclass(frozen=True)
class StartupSpec:
    """A cold start of `vllm serve` (first start, compile caches empty), the parts that take the time. No published
    figure is calibrated here: these are the usual orders of magnitude for a 480 B FP8 checkpoint on eight GPUs."""
    weight_load_rate: float = 2.5 * GB       # B/s: safetensors from the node's disk, sharded to 8 GPUs
    compile_seconds: float = 150.0           # torch.compile (Dynamo + Inductor) and Triton kernels, from empty caches
    graph_capture_seconds: float = 45.0      # HIP graphs for the batch sizes vLLM captures

    def load_seconds(self, model: ModelSpec) -> float:
        return model.total_params * model.weight_bytes / self.weight_load_rate

    def cold_seconds(self, model: ModelSpec) -> float:
        """Model seconds from launch to /health with empty compile caches: 192 + 150 + 45 ≈ 387 s."""
        return self.load_seconds(model) + self.compile_seconds + self.graph_capture_seconds


QWEN3_CODER_480B = ModelSpec()
MI308X_NODE = Hardware()
COLD_START = StartupSpec()


def hbm_kv_capacity_tokens(model: ModelSpec = QWEN3_CODER_480B, hw: Hardware = MI308X_NODE) -> int:
    """Tokens of KV cache vLLM can keep in HBM: usable HBM minus weights minus activations."""
    usable = hw.gpus * (hw.hbm_bytes_per_gpu * hw.gpu_memory_utilization - hw.activation_reserve)
    free = usable - model.total_params * model.weight_bytes
    return max(int(free // model.kv_bytes_per_token()), 0)


def step_seconds(model: ModelSpec, hw: Hardware, prefill: list[tuple[int, int]], decode_contexts: list[int]) -> float:
    """One engine step: ``prefill`` = [(cached_before, new_tokens)], ``decode_contexts`` = context per decode.

    Roofline: the step takes the longer of its compute time and its HBM traffic time, plus a fixed
    per-step cost. Prefill chunks are compute-bound, decode batches memory-bound.
    """
    tokens = sum(n for _, n in prefill) + len(decode_contexts)
    if tokens == 0:
        return 0.0
    flops = 2.0 * model.active_params * tokens
    flops += sum(model.attention_flops(start, n) for start, n in prefill)
    flops += sum(model.attention_flops(ctx, 1) for ctx in decode_contexts)
    compute = flops / (hw.gpus * hw.prefill_flops)
    traffic = model.weight_bytes_touched(tokens) + model.kv_bytes_per_token() * sum(decode_contexts)
    memory = traffic / (hw.gpus * hw.hbm_bandwidth * hw.hbm_efficiency)
    return hw.step_overhead + max(compute, memory)
