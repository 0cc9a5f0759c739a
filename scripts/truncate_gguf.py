"""Write a smaller GGUF holding some of the transformer blocks of a llama-architecture GGUF.

Used to send the packaged SmolLM2-135M-Instruct (98 MB) to a GPU machine whose transfer limit is
64 MiB: the kept blocks, norms and tokenizer are copied byte for byte (real weights, same
quantization); only ``llama.block_count`` changes, and optionally the token embedding is
re-quantized (Q8_0 -> Q4_1 halves its 30 MB). The result is a different, weaker model: use it to
check that code paths run and agree across devices, not for answer quality.

    python scripts/truncate_gguf.py SRC.gguf OUT.gguf --blocks 0-3,26-29 --embedding q4_1
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path


def parse_blocks(spec: str) -> list[int]:
    """``"6"`` = the first six blocks; ``"0-3,26-29"`` = those blocks, in that order."""
    if spec.isdigit():
        return list(range(int(spec)))
    kept: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        kept.extend(range(int(lo), int(hi or lo) + 1))
    return kept


def truncate(src: Path, out: Path, blocks: list[int], embedding: str | None = None) -> None:
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize, quantize

    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    total = int(reader.fields[f"{arch}.block_count"].contents())
    if not blocks or len(set(blocks)) != len(blocks) or not all(0 <= b < total for b in blocks):
        raise SystemExit(f"--blocks must name distinct blocks in 0..{total - 1}")
    renumber = {old: new for new, old in enumerate(blocks)}
    writer = GGUFWriter(out, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = len(blocks) if key == f"{arch}.block_count" else field.contents()
        writer.add_key_value(key, value, vtype, sub_type=sub)
    tensors = []
    for tensor in reader.tensors:
        match = re.match(r"blk\.(\d+)\.(.*)", tensor.name)
        if match is None:
            tensors.append((tensor.name, tensor))
        elif int(match.group(1)) in renumber:
            tensors.append((f"blk.{renumber[int(match.group(1))]}.{match.group(2)}", tensor))
    # token_embd first, then the blocks in their new order, then output_norm (a stable sort).
    tensors.sort(key=lambda item: (0, int(item[0].split(".")[1])) if item[0].startswith("blk.")
                 else (-1 if item[0] == "token_embd.weight" else 1, 0))
    for name, tensor in tensors:
        qtype = tensor.tensor_type
        data = tensor.data
        if name == "token_embd.weight" and embedding:
            target = GGMLQuantizationType[embedding.upper()]
            if target != qtype:
                data = quantize(dequantize(data, qtype).astype(np.float32), target)
                qtype = target
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            writer.add_tensor(name, np.array(data))
        else:
            writer.add_tensor(name, np.array(data), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--blocks", required=True, help="blocks to keep: N (the first N) or a list such as 0-3,26-29")
    parser.add_argument("--embedding", default=None, help="re-quantize token_embd.weight to this type (e.g. q4_1)")
    args = parser.parse_args()
    truncate(args.src, args.out, parse_blocks(args.blocks), args.embedding)
    print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
