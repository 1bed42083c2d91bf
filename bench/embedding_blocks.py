#!/usr/bin/env python3
# Why incremental checkpoints reference whole chunks, not blocks (docs/incremental.md): the
# share of 1 MiB checksum blocks an embedding table's sparse updates touch per save interval.
#   python bench/embedding_blocks.py
# Fraction of 1 MiB blocks of an embedding table [151936, 2048] bf16 touched by the rows of
# the tokens one save interval trains (sparse updates, no weight decay: the only case where
# rows stay unchanged), for token ids drawn uniformly and by a Zipf law over frequency-ordered
# ids (BPE vocabularies number frequent tokens first).
import numpy as np
V, H = 151936, 2048
rows_per_block = (1 << 20) // (H * 2)
blocks = (V + rows_per_block - 1) // rows_per_block
rng = np.random.default_rng(0)
p = 1.0 / np.arange(1, V + 1); p /= p.sum()
print(f"table {V}x{H} bf16 = {V*H*2/2**20:.0f} MiB, {blocks} blocks of {rows_per_block} rows")
for tokens in (4096, 65536, 1 << 20, 8 << 20):
    for name in ("uniform", "zipf"):
        ids = rng.integers(0, V, tokens) if name == "uniform" else rng.choice(V, tokens, p=p)
        rows = np.unique(ids)
        touched = np.unique(rows // rows_per_block).size
        print(f"{tokens:>8} tokens {name:>7}: rows changed {rows.size/V:6.1%}, "
              f"blocks changed {touched/blocks:6.1%}")
