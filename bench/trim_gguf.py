"""Write a GGUF that keeps only the first N decoder blocks of a model (for the GPU machine,
whose transfers are capped at 64 MiB; the full SmolLM2 GGUF is 94 MiB).

    .venv/bin/python -P bench/trim_gguf.py [SRC.gguf] DST.gguf N

A causal stack's first N blocks compute exactly what they compute in the full model, so
calibration statistics for those layers are the real ones; logits are not meaningful.
"""

from __future__ import annotations

import re
import sys


def trim(src: str, dst: str, n: int) -> None:
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for f in reader.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = n if f.name == f"{arch}.block_count" else f.contents()
        writer.add_key_value(f.name, value, vtype, sub_type=sub)
    keep = [t for t in reader.tensors
            if not (m := re.match(r"blk\.(\d+)\.", t.name)) or int(m.group(1)) < n]
    for t in keep:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in keep:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 2:
        from oscar_zoo.calibrate.loading import builtin_gguf

        args = [str(builtin_gguf("smollm2-135m")), *args]
    trim(args[0], args[1], int(args[2]))
