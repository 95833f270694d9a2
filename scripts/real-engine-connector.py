"""Make vLLM 0.20.1's ExampleConnector work on the CPU build (run by scripts/real-engine on the installed file).

Two things in that version assume a GPU: the KV it loads is moved with `.cuda()` ("Found no NVIDIA driver"),
and it indexes the paged KV as [2, blocks, block_size, …] while the CPU attention backend lays it out as
[2, blocks, heads, block_size, head] (saving a prompt past the first pages fails with an IndexError). The
loaded KV goes to the KV cache's own device, and on the CPU the slots are addressed as (block, offset) in
the CPU layout, both when saving and when loading. Each change must find the line it replaces.
"""
import sys

path = sys.argv[1]
text = open(path).read()
CPU = "  # CPU layout: [2, num_blocks, num_kv_heads, block_size, head_size]"
changes = [
    ('safetensors.torch.load_file(filename)["kv_cache"].cuda()',
     'safetensors.torch.load_file(filename)["kv_cache"].to(kv_cache_layer.device)'),
    ("            else:\n                num_pages = dst_kv_cache_layer_shape[1]\n",
     "            elif dst_kv_cache_layer.device.type == \"cpu\":" + CPU + "\n"
     "                dst_kv_cache_layer[:, slot_mapping // self._block_size, :, slot_mapping % self._block_size] = (\n"
     "                    src_kv_cache)\n"
     "            else:\n                num_pages = dst_kv_cache_layer_shape[1]\n"),
    ("            num_pages, page_size = layer.shape[1], layer.shape[2]\n",
     "            if layer.device.type == \"cpu\":" + CPU + "\n"
     "                return layer[:, slot_mapping // self._block_size, :, slot_mapping % self._block_size]\n"
     "            num_pages, page_size = layer.shape[1], layer.shape[2]\n"),
]
for old, new in changes:
    if new in text:
        continue
    if text.count(old) != 1:
        sys.exit(f"{path}: expected one {old.strip()[:60]!r}; this vLLM's ExampleConnector changed")
    text = text.replace(old, new)
open(path, "w").write(text)
