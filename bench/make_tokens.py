"""bench/make_tokens.py - a synthetic llm.c token shard for the end-to-end benchmark.

    python3 bench/make_tokens.py OUT.bin [--tokens N] [--vocab V] [--seed S]

Writes an llm.c GPT-2 shard (llm.c's format: 256 int32 header words, magic 20240520,
version 1, token count; then uint16 tokens) of N tokens drawn uniformly from [0, V). Throughput
does not depend on what the tokens mean, only on their number (and, slightly, on how many distinct
ones a batch holds: uniform draws are the worst case for the embedding's backward). Standard
library only, so that it runs on any Python of a GPU node.
"""
import argparse
import random
import struct
from array import array


def write_shard(path, tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        data = array("H", tokens)
        if data.itemsize != 2:
            raise SystemExit("make_tokens: this Python's array('H') is not 16-bit")
        if struct.pack("=H", 1) != struct.pack("<H", 1):
            data.byteswap()  # shards are little-endian
        data.tofile(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=1 << 21)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    write_shard(a.out, [rng.randrange(a.vocab) for _ in range(a.tokens)])
    print(f"make_tokens: {a.tokens} tokens in [0, {a.vocab}) -> {a.out}")


if __name__ == "__main__":
    main()
