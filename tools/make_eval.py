#!/usr/bin/env python3
"""tools/make_eval.py - a small multiple-choice eval set from a token shard, in llm.c's eval file
format (the one llm.c's dev/data/hellaswag.py writes for HellaSwag; data/eval_file.h reads it,
docs/CONFIG.md "[eval]" describes it). No download: the text is whatever the shard holds (the
bundled fortunes, tools/prepare_fortunes.sh).

    tools/make_eval.py SHARD OUT [--eot ID] [--examples N] [--seed S]

The shard's documents are the runs of tokens between end-of-text tokens (--eot, default: the
last id of the vocabulary file beside the shard, vocab_size - 1: GPT-2's 50256, the byte-level
tokenizer's 256). Each example takes a document of at least 12 tokens: its first tokens (up to
32, about half of it) are the context, the next ones (up to 12) the right ending, and three
other documents' runs of the same length the wrong ones, at a random label. A model that has
learnt the text scores above chance (25%); a good model of fortunes well above.

write_eval_file(path, examples) is what the tests use: examples are dicts with "label",
"context" (token ids) and "endings" (lists of token ids).
"""
import argparse
import os
import random
import struct
import sys

MAGIC = 20240522


def write_eval_file(path, examples):
    """llm.c's eval file: version 1 (uint16 values) when every id fits below 65535, else 2."""
    ids = [t for ex in examples for part in [ex["context"], *ex["endings"]] for t in part]
    version = 1 if max(ids, default=0) < 65535 else 2
    fmt, start = ("<H", 0xFFFF) if version == 1 else ("<I", 0xFFFFFFFF)
    width = struct.calcsize(fmt)
    records, longest = [], 0
    for i, ex in enumerate(examples):
        values = [start, 0, i, ex["label"], len(ex["endings"]), len(ex["context"]), *ex["context"]]
        for end in ex["endings"]:
            values += [len(end), *end]
        values[1] = len(values) * width
        longest = max(longest, values[1])
        records.append(b"".join(struct.pack(fmt, v) for v in values))
    header = struct.pack("<256i", MAGIC, version, len(examples), longest, *([0] * 252))
    with open(path, "wb") as f:
        f.write(header)
        for r in records:
            f.write(r)


def read_shard(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        data = f.read()
    width = 2 if header[1] == 1 else 4
    return list(struct.unpack(f"<{len(data) // width}{'H' if width == 2 else 'I'}", data))


def documents(tokens, eot):
    docs, cur = [], []
    for t in tokens:
        if t == eot:
            if cur:
                docs.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        docs.append(cur)
    return docs


def make_examples(docs, n, rng):
    usable = [d for d in docs if len(d) >= 12]
    if len(usable) < 4:
        sys.exit(f"make_eval: {len(usable)} documents of 12 tokens or more, 4 are needed")
    examples = []
    for _ in range(n):
        doc = rng.choice(usable)
        c = min(32, len(doc) // 2)
        m = min(12, len(doc) - c)
        endings = [doc[c:c + m]]
        while len(endings) < 4:
            other = rng.choice(docs)
            if other is doc or len(other) < m:
                continue
            at = rng.randrange(len(other) - m + 1)
            endings.append(other[at:at + m])
        label = rng.randrange(4)
        endings[0], endings[label] = endings[label], endings[0]
        examples.append({"label": label, "context": doc[:c], "endings": endings})
    return examples


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shard")
    ap.add_argument("out")
    ap.add_argument("--eot", type=int, default=-1)
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    eot = a.eot
    if eot < 0:
        with open(os.path.join(os.path.dirname(a.shard), "vocab_size")) as f:
            eot = int(f.read().split()[0]) - 1
    examples = make_examples(documents(read_shard(a.shard), eot), a.examples,
                             random.Random(a.seed))
    write_eval_file(a.out, examples)
    print(f"make_eval: {len(examples)} examples (4 endings each) from {a.shard} -> {a.out}")


if __name__ == "__main__":
    main()
