"""Let LMCache 0.5.6 serve vLLM 0.20.1's CPU build (run by scripts/real-engine on the installed package).

    python real-engine-lmcache.py SITE_PACKAGES

LMCache moves KV between vLLM's paged cache and its own chunks through a "GPU connector". Its factory,
`lmcache.v1.gpu_connector.CreateGPUConnector`, has branches for cuda, xpu, musa and hpu only, so on the CPU
it raises "No supported cpu connector found." and LMCache runs degraded (recompute, nothing stored). Its
CUDA connector cannot stand in: it makes CUDA streams, asserts a CUDA device, and its torch fallback refuses
the HND layout of vLLM's CPU attention.

This patch adds one module of its own, `lmcache/v1/gpu_connector/fxpilot_cpu_connector.py`: a connector
that copies a chunk's KV between LMCache's chunk tensor (`KV_2LTD`: [2, layers, tokens, heads × head_size])
and vLLM's CPU KV cache ([2, blocks, kv_heads, block_size, head_size] per layer, or the NHD order
[2, blocks, block_size, kv_heads, head_size]) by plain tensor indexing: slot s is (block s // block_size,
offset s % block_size). And one branch in the factory: device `cpu` with vLLM → that connector. Nothing
else of LMCache changes: its token database, hashing, storage backends (local_disk with O_DIRECT), lookup
and log lines are LMCache's own. Layer-wise transfer, blending and MLA are refused with a clear error.

Each change must find the text it replaces exactly once, or the build stops naming it; running the patch
again on a patched package changes nothing.
"""
import os
import sys

CONNECTOR = '''"""A CPU connector for vLLM's paged KV cache (added by fxpilot's scripts/real-engine-lmcache.py)."""
from typing import List, Optional

import torch

from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface
from lmcache.v1.memory_management import MemoryFormat, MemoryObj


class FxpilotCPUPagedConnector(GPUConnectorInterface):
    """Copies chunks between LMCache's KV_2LTD tensors and vLLM's CPU KV cache by indexing (no kernels)."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_size: int, layout: str = "HND"):
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.hidden_dim_size = num_kv_heads * head_size
        self.layout = layout
        self.kvcaches: Optional[List[torch.Tensor]] = None

    @classmethod
    def from_metadata(cls, metadata, layout_hints=None) -> "FxpilotCPUPagedConnector":
        if metadata.use_mla:
            raise RuntimeError("fxpilot's CPU connector does not handle MLA KV caches")
        num_layers, _, _, num_kv_heads, head_size = metadata.kv_shape
        layout = (layout_hints or {}).get("kv_layout") or "HND"
        return cls(num_layers, num_kv_heads, head_size, "NHD" if layout == "NHD" else "HND")

    def _slots_view(self, layer: torch.Tensor) -> torch.Tensor:
        """The layer as [2, blocks, block_size, heads, head_size]: a view, so writes reach vLLM's cache."""
        if layer.dim() != 5 or layer.shape[0] != 2 or layer.shape[4] != self.head_size:
            raise RuntimeError(f"fxpilot's CPU connector expects [2, blocks, ..., {self.head_size}] KV layers, "
                               f"got {tuple(layer.shape)}")
        heads_then_block = layer.shape[2] == self.num_kv_heads and (
            layer.shape[3] != self.num_kv_heads or self.layout == "HND")
        return layer.permute(0, 1, 3, 2, 4) if heads_then_block else layer

    def _slots(self, kwargs, start: int, end: int):
        if "slot_mapping" not in kwargs:
            raise ValueError("'slot_mapping' should be provided in kwargs.")
        slots = kwargs["slot_mapping"][start:end].to(device="cpu", dtype=torch.long)
        return slots

    def _layers(self, kwargs) -> List[torch.Tensor]:
        self.initialize_kvcaches_ptr(**kwargs)
        if not self.kvcaches:
            raise ValueError("kvcaches should be provided in kwargs or initialized beforehand.")
        return [self._slots_view(layer) for layer in self.kvcaches]

    def to_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs):
        """Chunk → vLLM's cache; the prefix vLLM already holds (vllm_cached_tokens) is left alone."""
        if memory_obj.metadata.fmt != MemoryFormat.KV_2LTD:
            raise ValueError("fxpilot's CPU connector reads KV_2LTD memory objects")
        layers = self._layers(kwargs)
        slots = self._slots(kwargs, start, end)
        skip = min(end - start, max(0, int(kwargs.get("vllm_cached_tokens", 0)) - start))
        slots = slots[skip:]
        if len(slots) == 0:
            return
        data = memory_obj.tensor[:, :, skip:end - start, :]
        for index, view in enumerate(layers):
            block_size = view.shape[2]
            chunk = data[:, index].reshape(2, len(slots), self.num_kv_heads, self.head_size)
            view[:, slots // block_size, slots % block_size] = chunk.to(view.dtype)

    def from_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs):
        """vLLM's cache → chunk."""
        layers = self._layers(kwargs)
        slots = self._slots(kwargs, start, end)
        for index, view in enumerate(layers):
            block_size = view.shape[2]
            rows = view[:, slots // block_size, slots % block_size]
            memory_obj.tensor[:, index, : end - start, :] = rows.reshape(2, len(slots), self.hidden_dim_size).to(
                memory_obj.tensor.dtype)
        memory_obj.metadata.fmt = MemoryFormat.KV_2LTD

    def batched_to_gpu(self, memory_objs, starts, ends, **kwargs):
        for memory_obj, start, end in zip(memory_objs, starts, ends):
            self.to_gpu(memory_obj, start, end, **kwargs)

    def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
        for memory_obj, start, end in zip(memory_objs, starts, ends):
            self.from_gpu(memory_obj, start, end, **kwargs)

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.num_layers, num_tokens, self.hidden_dim_size])
'''

FACTORY_OLD = '''        else:
            raise RuntimeError(f"No supported {torch_device_type} connector found.")
'''
FACTORY_NEW = '''        elif torch_device_type == "cpu":
            # fxpilot: vLLM's CPU build (scripts/real-engine-lmcache.py)
            from lmcache.v1.gpu_connector.fxpilot_cpu_connector import (
                FxpilotCPUPagedConnector,
            )

            if config.use_layerwise or config.enable_blending:
                raise RuntimeError(
                    "fxpilot's CPU connector does not do layer-wise transfer or blending"
                )
            return FxpilotCPUPagedConnector.from_metadata(metadata, layout_hints)
''' + FACTORY_OLD


def main(site: str) -> None:
    package = os.path.join(site, "lmcache", "v1", "gpu_connector")
    factory = os.path.join(package, "__init__.py")
    with open(factory, encoding="utf-8") as handle:
        text = handle.read()
    if FACTORY_NEW not in text:
        if text.count(FACTORY_OLD) != 1:
            sys.exit(f"{factory}: expected one 'No supported ... connector found' branch; this LMCache changed")
        text = text.replace(FACTORY_OLD, FACTORY_NEW)
        with open(factory, "w", encoding="utf-8") as handle:
            handle.write(text)
    with open(os.path.join(package, "fxpilot_cpu_connector.py"), "w", encoding="utf-8") as handle:
        handle.write(CONNECTOR)


if __name__ == "__main__":
    main(sys.argv[1])
