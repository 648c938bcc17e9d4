#!/usr/bin/python3
"""test/test_tokenize.py - checks tools/tokenize (build/tokenize) against references.

1. GPT-2 BPE token ids equal those of OpenAI's encoder.py, re-implemented below
   (bytes_to_unicode + the pre-tokenization regex via the `regex` module + BPE by merge rank),
   on fixed samples (contractions, digits, letters of several scripts, runs of spaces, newlines)
   and on fresh random strings drawn from an alphabet of the tricky characters.
2. Encode then decode gives back the exact bytes (BPE and byte-level), invalid UTF-8 included.
3. Shard and tokenizer headers, the val/train split, fortune-format document splitting,
   even shard cutting with --shard-tokens, and refusal to overwrite existing shards.
4. If tools/prepare_fortunes.sh has run ($BUILD/data/fortunes), its shards equal the reference
   encoding of /usr/share/games/fortunes, overstrike removed by an independent implementation.

BPE parts need $BUILD/data/gpt2-bpe/{encoder.json,vocab.bpe} (tools/prepare_fortunes.sh fetches
them) and are skipped with a message otherwise; the id comparison also needs python3-regex.
Run: /usr/bin/python3 test/test_tokenize.py   (BUILD=build by default; TOKENIZE overrides the tool)
"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
TOKENIZE = os.environ.get("TOKENIZE", os.path.join(BUILD, "tokenize"))
BPE_DIR = os.environ.get("GPT2_BPE_DIR", os.path.join(BUILD, "data", "gpt2-bpe"))
EOT_TEXT = b"<|endoftext|>"

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


# ------------------------------------------------------------------ reference GPT-2 encoder

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class ReferenceEncoder:
    """OpenAI's gpt-2/src/encoder.py, without the error handling."""

    def __init__(self, encoder, merges, regex):
        self.encoder = encoder
        self.byte_encoder = bytes_to_unicode()
        self.bpe_ranks = dict(zip(merges, range(len(merges))))
        self.cache = {}
        self.pat = regex.compile(
            r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
        self.regex = regex

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        while len(word) > 1:
            pairs = set(zip(word, word[1:]))
            bigram = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
        self.cache[token] = word
        return word

    def encode(self, text):
        ids = []
        for token in self.regex.findall(self.pat, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(token))
        return ids


def load_reference(regex):
    with open(os.path.join(BPE_DIR, "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    with open(os.path.join(BPE_DIR, "vocab.bpe"), encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().split("\n")[1:-1]]
    return ReferenceEncoder(encoder, merges, regex)


# ------------------------------------------------------------------ running the tool

def run_tool(args, expect_ok=True):
    p = subprocess.run([TOKENIZE] + args, capture_output=True)
    if expect_ok and p.returncode != 0:
        sys.exit("tokenize %s failed:\n%s" % (" ".join(args), p.stderr.decode(errors="replace")))
    return p


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, ntok = struct.unpack("<3i", data[:12])
    width = {20240520: 2, 20240801: 4}.get(magic, 2)
    tokens = list(struct.unpack("<%d%s" % (ntok, "H" if width == 2 else "I"), data[1024:1024 + ntok * width]))
    return (magic, version, ntok, len(data)), tokens


def encode_files(tmp, docs, mode_args, extra=()):
    """Writes each document (bytes) to its own file, encodes them with --doc-sep none."""
    out = tempfile.mkdtemp(dir=tmp)
    files = []
    for i, doc in enumerate(docs):
        path = os.path.join(out, "doc%04d.txt" % i)
        with open(path, "wb") as f:
            f.write(doc)
        files.append(path)
    shards = os.path.join(out, "shards")
    run_tool(["encode"] + mode_args + ["--out", shards, "--doc-sep", "none"] + list(extra) + files)
    return shards


def split_at(tokens, eot):
    docs = []
    for t in tokens:
        if t == eot:
            docs.append([])
        else:
            docs[-1].append(t)
    return docs


# ------------------------------------------------------------------ samples

SAMPLES = [
    "Hello world! It's 2024, we'll see. I'm sure you're right; they've gone, she'd know.",
    "DON'T SHOUT'S 'quoted' ''s O'Neil's rock'n'roll 'll 're 'd 'm 't",
    "Digits: 123456 3.14159 1,000,000 2024-11-22 x86_64 abc123def 42abc ½ ² ３ ٣٤ Ⅻ ①",
    "café naïve Ελληνικά Русский язык 日本語のテキスト 한국어 עברית العربية Ünïcödé कुछ שָׁלוֹם",
    "a  b   c    d     e\t\tf \t g",
    "   leading spaces and trailing spaces   ",
    "\n\n\nthree newlines first\r\nwindows line\n \n  \n",
    "nbsp\u00a0here, ideographic\u3000space, em\u2003space, thin\u2009space",
    "punctuation!!! ... --- ?! (parens) [brackets] {braces} <tags> @user #hash $5 100% a&b",
    "emoji 😀🎉 ok, math 𝔸𝕓 𝟙𝟚, combining e\u0301 and a\u0308",
    "“curly quotes” ‘single’ — em dash – en dash … ellipsis",
    "    def f(x):\n        return x  # comment\n\n",
    " ",
    "\n",
    "x",
]

TRICKY = ["a", "b", "Z", "é", "Ω", "ж", "日", "한", "1", "7", "½", "²", "٣", " ", " ", " ", "\n",
          "\t", "\r", "\u00a0", "\u3000", "'", "'s", "'ll", "'t", "'re", ".", ",", "!", "-", "😀",
          "“", "—", "\u0301", "$", "%", "\u202f", "\u2028", "\u0085", "\x1c", "कुछ", "\u0941", "שָׁלוֹם"]


def random_samples(rng, count):
    return ["".join(rng.choice(TRICKY) for _ in range(rng.randint(1, 40))) for _ in range(count)]


# ------------------------------------------------------------------ tests

def test_bpe_ids(tmp, mode, rng, ref):
    if ref is None:
        print("SKIP BPE id comparison: python3-regex is not installed (apt-get install python3-regex)")
        return
    samples = SAMPLES + random_samples(rng, 300)
    fortunes = "/usr/share/games/fortunes/fortunes"
    if os.path.exists(fortunes):
        with open(fortunes, encoding="utf-8", errors="replace") as f:
            samples.append(f.read())
    shards = encode_files(tmp, [s.encode("utf-8") for s in samples], mode)
    _, tokens = read_shard(os.path.join(shards, "fortunes_train_000000.bin"))
    got = split_at(tokens, 50256)
    check(len(got) == len(samples), "BPE: one document per sample (%d)" % len(samples))
    bad = [i for i, s in enumerate(samples) if i >= len(got) or got[i] != ref.encode(s)]
    for i in bad[:5]:
        print("  mismatch on %r:\n    tool %s\n    ref  %s" % (samples[i][:80], got[i][:30] if i < len(got) else None,
                                                            ref.encode(samples[i])[:30]))
    check(not bad, "BPE ids equal encoder.py on %d fixed + 300 random samples (+ a fortune file, "
          "%d tokens in all): %d mismatches" % (len(SAMPLES), len(tokens), len(bad)))


def test_round_trip(tmp, mode, name, rng):
    docs = [s.encode("utf-8") for s in SAMPLES + random_samples(rng, 50)]
    docs.append(b"invalid utf-8: \xff\xfe \xc3 \xed\xa0\x80 \xf0\x9f\x98 end")
    docs.append(bytes(rng.randrange(256) for _ in range(300)))
    shards = encode_files(tmp, docs, mode)
    shard = os.path.join(shards, "fortunes_train_000000.bin")
    p = run_tool(["decode", "--tokenizer", os.path.join(shards, "tokenizer.bin"), shard])
    expect = b"".join(EOT_TEXT + d for d in docs)
    check(p.stdout == expect, "%s: encode+decode round-trips %d documents (%d bytes) exactly"
          % (name, len(docs), len(expect)))
    return shards, docs


def test_headers(shards, vocab, eot, name):
    header, tokens = read_shard(os.path.join(shards, "fortunes_train_000000.bin"))
    magic, version, ntok, size = header
    check(magic == 20240520 and version == 1 and size == 1024 + 2 * ntok and ntok == len(tokens),
          "%s: shard header magic %d version %d, %d tokens, %d bytes" % (name, magic, version, ntok, size))
    check(tokens[0] == eot and max(tokens) < vocab, "%s: stream starts with end-of-text, ids < %d" % (name, vocab))
    with open(os.path.join(shards, "tokenizer.bin"), "rb") as f:
        tok = f.read()
    tmagic, tversion, tvocab, teot = struct.unpack("<4i", tok[:16])
    pieces, at = [], 1024
    while at < len(tok):
        pieces.append(tok[at + 1:at + 1 + tok[at]])
        at += 1 + tok[at]
    check((tmagic, tversion, tvocab, teot) == (20240328, 2, vocab, eot) and len(pieces) == vocab and
          pieces[eot] == EOT_TEXT and at == len(tok),
          "%s: tokenizer.bin header (%d, %d, %d, %d), %d pieces" % (name, tmagic, tversion, tvocab, teot, len(pieces)))
    with open(os.path.join(shards, "vocab_size")) as f:
        check(f.read().strip() == str(vocab), "%s: vocab_size file says %d" % (name, vocab))


def test_byte_level_ids(docs, shards):
    _, tokens = read_shard(os.path.join(shards, "fortunes_train_000000.bin"))
    expect = []
    for d in docs:
        expect += [256] + list(d)
    check(tokens == expect, "byte-level: ids are the bytes, 256 before each document")


def test_fortune_split(tmp):
    text = b"first\n%\nsecond\nline\n%\n%\n  \n\t\n%\nthird\r\n%\r\nfourth, no newline"
    path = os.path.join(tmp, "fortune.txt")
    with open(path, "wb") as f:
        f.write(text)
    out = os.path.join(tmp, "fortune_out")
    run_tool(["encode", "--byte-level", "--out", out, "--val-docs", "1", "--name", "f", path])
    _, val = read_shard(os.path.join(out, "f_val_000000.bin"))
    _, train = read_shard(os.path.join(out, "f_train_000000.bin"))
    docs = [b"first\n", b"second\nline\n", b"third\r\n", b"fourth, no newline"]
    check(val == [256] + list(docs[0]), "fortune format: the first document is the val split")
    check(train == [t for d in docs[1:] for t in [256] + list(d)],
          "fortune format: '%' lines split documents, whitespace-only entries dropped")
    p = run_tool(["encode", "--byte-level", "--out", out, "--name", "f", path], expect_ok=False)
    check(p.returncode != 0 and b"already holds" in p.stderr, "refuses to write over existing shards")


def test_shard_cutting(tmp, rng):
    docs = [bytes(rng.randrange(32, 127) for _ in range(rng.randint(1, 200))) for _ in range(40)]
    whole = encode_files(tmp, docs, ["--byte-level"])
    cut = encode_files(tmp, docs, ["--byte-level"], ["--shard-tokens", "1000", "--val-docs", "3"])
    _, all_tokens = read_shard(os.path.join(whole, "fortunes_train_000000.bin"))
    val_len = sum(len(d) + 1 for d in docs[:3])
    parts = sorted(f for f in os.listdir(cut) if f.startswith("fortunes_train_"))
    sizes, train = [], []
    for f in parts:
        _, t = read_shard(os.path.join(cut, f))
        sizes.append(len(t))
        train += t
    n = len(all_tokens) - val_len
    check(train == all_tokens[val_len:] and len(parts) == -(-n // 1000) and max(sizes) - min(sizes) <= 1
          and max(sizes) <= 1000, "--shard-tokens 1000: %d train tokens cut into %s" % (n, sizes))


FORTUNES_SRC = "/usr/share/games/fortunes"


def without_overstrike(text):
    """Backspace erases the character before it (never a newline); stray backspaces vanish."""
    out = []
    for c in text:
        if c == "\b" and out and out[-1] not in "\b\n":
            out.pop()
        else:
            out.append(c)
    return "".join(c for c in out if c != "\b")


def fortune_documents():
    docs = []
    for name in sorted(os.listdir(FORTUNES_SRC)):
        path = os.path.join(FORTUNES_SRC, name)
        if name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = without_overstrike(f.read())
        doc = ""
        lines = [line + "\n" for line in text.split("\n")]
        lines[-1] = lines[-1][:-1]  # the text after the last newline
        for line in lines + ["%"]:
            if line in ("%", "%\n", "%\r\n"):
                if doc.strip(" \t\r\n\v\f"):
                    docs.append(doc)
                doc = ""
            else:
                doc += line
    return docs


def test_prepared_dataset(ref):
    out = os.path.join(BUILD, "data", "fortunes")
    if not os.path.exists(os.path.join(out, "vocab_size")) or not os.path.isdir(FORTUNES_SRC):
        print("SKIP prepared dataset check: no %s (run tools/prepare_fortunes.sh)" % out)
        return
    with open(os.path.join(out, "vocab_size")) as f:
        vocab = int(f.read())
    if vocab == 50257 and ref is None:
        print("SKIP prepared dataset check: it is GPT-2 BPE and the reference encoder cannot run "
              "(no BPE files or no python3-regex)")
        return
    docs = fortune_documents()
    eot = vocab - 1
    stream = []
    for d in docs:
        stream += [eot] + (ref.encode(d) if vocab == 50257 else list(d.encode("utf-8")))
    _, val = read_shard(os.path.join(out, "fortunes_val_000000.bin"))
    train = []
    for name in sorted(os.listdir(out)):
        if name.startswith("fortunes_train_"):
            train += read_shard(os.path.join(out, name))[1]
    nval = sum(1 for t in val if t == eot)
    check(val + train == stream and nval == min(1000, len(docs)),
          "prepared fortunes (vocab %d): %d documents, val %d tokens (%d documents) + train %d tokens "
          "equal the reference encoding (%d tokens)" % (vocab, len(docs), len(val), nval, len(train), len(stream)))


def main():
    if not os.access(TOKENIZE, os.X_OK):
        sys.exit("FAIL: %s not found; build it with `make %s`" % (TOKENIZE, os.path.relpath(TOKENIZE, ROOT)))
    seed = int(os.environ.get("SEED", random.randrange(1 << 30)))
    print("seed %d (SEED=%d reproduces)" % (seed, seed))
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        shards, docs = test_round_trip(tmp, ["--byte-level"], "byte-level", rng)
        test_headers(shards, 257, 256, "byte-level")
        test_byte_level_ids(docs, shards)
        test_fortune_split(tmp)
        test_shard_cutting(tmp, rng)
        bpe = [os.path.join(BPE_DIR, "encoder.json"), os.path.join(BPE_DIR, "vocab.bpe")]
        ref = None
        if all(os.path.exists(p) for p in bpe):
            mode = ["--encoder", bpe[0], "--bpe", bpe[1]]
            shards, _ = test_round_trip(tmp, mode, "BPE", rng)
            test_headers(shards, 50257, 50256, "BPE")
            try:
                import regex
                ref = load_reference(regex)
            except ImportError:
                pass
            test_bpe_ids(tmp, mode, rng, ref)
        else:
            print("SKIP BPE tests: no %s (run tools/prepare_fortunes.sh)" % BPE_DIR)
        test_prepared_dataset(ref)
    if failures:
        sys.exit("%d check(s) failed" % len(failures))
    print("all tokenize checks passed")


if __name__ == "__main__":
    main()
