#!/usr/bin/python3
"""test/test_tokenizer_json.py - checks `tokenize encode --tokenizer tokenizer.json` (Hugging Face
byte-level BPE) against an independent Python byte-level BPE.

The tokenizer.json files are made here: a small BPE is trained on sample text (pre-tokenized by
the real split pattern through python3-regex), its ids are shuffled (no id equals its rank), and
it is written in Hugging Face's format in three flavours:
  gpt2     GPT-2's pattern through a ByteLevel pre-tokenizer, merges as "a b" strings,
           <|endoftext|> in the vocabulary and in added_tokens: uint16 shards.
  llama3   Llama-3's pattern through Sequence[Split, ByteLevel], merges as [a, b] pairs,
           ignore_merges, whole words in the vocabulary that no merge reaches,
           <|begin_of_text|> and reserved special tokens past id 65535: uint32 shards.
  llama3m  Llama-3's pattern without ignore_merges, small vocabulary: uint16 shards.
The reference encoder (below) reads the same JSON, splits with `regex.findall` on the file's own
pattern string and merges by rank. Checked: the ids of every document (fixed awkward samples:
Unicode letters, digit runs longer than 3, upper-case and long-s contractions, \\r\\n runs,
whitespace runs, special tokens' text; and fresh random strings), the shard header and width,
encode -> decode round trip through tokenizer.bin, and that ignore_merges changed some pieces
(so its check can fail). Bad tokenizer.json files: each a non-zero exit, a message naming the
problem, no shard written.
Needs python3-regex (CI installs it); skips with a message otherwise.
Run: /usr/bin/python3 test/test_tokenizer_json.py   (BUILD=build by default; SEED=n reproduces)
"""
import collections
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

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


# ------------------------------------------------------------------ samples

SAMPLES = [
    "Hello world! It's 2024, we'll see. I'M SURE YOU'RE RIGHT; THEY'VE gone, she'D know.",
    "O'Neil's rock'n'roll 'll 're 'd 'm 't 'S 'LL 'Re 'ſ Wait'ſt it'ſter 'ﬆ",
    "Digits: 123456789 3.14159 1,000,000 2024-11-22 x86_64 abc1234567def ½²³ ３４５６７ ٣٤٥٦٧ Ⅻ ①②③④",
    "café naïve Ελληνικά Русский язык 日本語のテキスト 한국어 עברית العربية कुछ शब्द שָׁלוֹם",
    "a  b   c    d     e\t\tf \t g\u00a0\u00a0h",
    "   leading and trailing   ",
    "\n\n\nthree newlines\r\nwindows\r\n\r\nline\n \n  \n\t\n x\r \r\n",
    "punct!!!\n\n... ---\r\n?! (parens)\n[x] {y} <tags> @user #hash $5 100% a&b .Hello ,world",
    "emoji 😀🎉 ok, math 𝔸𝕓 𝟙𝟚, combining e\u0301 and a\u0308, ideographic\u3000space",
    "special text inside: <|begin_of_text|> <|end_of_text|> <|endoftext|>",
    "    def f(x):\n        return x  # comment\n\n",
    " ",
    "\n",
    "x",
]

TRICKY = ["a", "b", "Z", "é", "Ω", "ж", "日", "한", "1", "7", "0", "½", "²", "٣", "３", " ", " ",
          " ", "\n", "\r", "\r\n", "\t", "\u00a0", "\u3000", "'", "'s", "'S", "'ll", "'LL", "'t",
          "'re", "'ſ", ".", ",", "!", "-", "😀", "“", "—", "\u0301", "$", "%", "\u202f", "\u2028",
          "\u0085", "\x1c", "कुछ", "\u0941", "שָׁלוֹם", "the", "The", " the", "ing", "123", "4567"]


def random_samples(rng, count):
    return ["".join(rng.choice(TRICKY) for _ in range(rng.randint(1, 40))) for _ in range(count)]


# ------------------------------------------------------------------ byte-level BPE, in Python

# GPT-2's byte <-> printable character map (the same in every byte-level BPE): test_tokenize's.
from test_tokenize import bytes_to_unicode  # noqa: E402

BYTE_CHAR = bytes_to_unicode()


def spell(data):
    """Bytes in the byte-to-unicode alphabet of vocabulary files."""
    return "".join(BYTE_CHAR[b] for b in data)


def apply_merges(word, ranks):
    word = list(word)
    while len(word) > 1:
        pairs = [(ranks[p], p) for p in zip(word, word[1:]) if p in ranks]
        if not pairs:
            break
        first, second = min(pairs)[1]
        out, i = [], 0
        while i < len(word):
            if i + 1 < len(word) and word[i] == first and word[i + 1] == second:
                out.append(first + second)
                i += 2
            else:
                out.append(word[i])
                i += 1
        word = out
    return word


def train_merges(regex, pattern, corpus, count):
    """A plain BPE trainer: the most frequent adjacent pair of the corpus' pieces, `count` times."""
    words = collections.Counter(spell(p.encode("utf-8")) for t in corpus for p in regex.findall(pattern, t))
    split = {w: list(w) for w in words}
    merges = []
    for _ in range(count):
        pairs = collections.Counter()
        for w, n in words.items():
            for p in zip(split[w], split[w][1:]):
                pairs[p] += n
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        rank = {best: 0}
        for w in split:
            split[w] = apply_merges(split[w], rank)
    return merges


class Reference:
    """Encodes text the way the tokenizer.json `spec` says, independently of the tool."""

    def __init__(self, regex, spec):
        model = spec["model"]
        self.regex = regex
        pre = spec["pre_tokenizer"]
        self.pattern = GPT2_PATTERN if pre["type"] == "ByteLevel" else pre["pretokenizers"][0]["pattern"]["Regex"]
        self.vocab = model["vocab"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.ignore_merges = model.get("ignore_merges", False)
        specials = {t["content"] for t in spec["added_tokens"]}
        self.vocab = {k: v for k, v in self.vocab.items() if k not in specials}

    def encode(self, text):
        ids = []
        for piece in self.regex.findall(self.pattern, text):
            word = spell(piece.encode("utf-8"))
            if self.ignore_merges and word in self.vocab:
                ids.append(self.vocab[word])
                continue
            ids.extend(self.vocab[t] for t in apply_merges(word, self.ranks))
        return ids

    def merges_alone(self, text):
        """The ids without ignore_merges (to show that it matters)."""
        saved, self.ignore_merges = self.ignore_merges, False
        ids = self.encode(text)
        self.ignore_merges = saved
        return ids


def make_spec(regex, flavour, rng):
    pattern = GPT2_PATTERN if flavour == "gpt2" else LLAMA3_PATTERN
    # words with "ſt" inside, so that a merge joins the two and a wrong split of "'ſt" shows
    corpus = SAMPLES + random_samples(rng, 60) + ["Haſte ſtill ſtay moſt "] * 20
    merges = train_merges(regex, pattern, corpus, 250 if flavour != "llama3m" else 120)
    strings = [BYTE_CHAR[b] for b in range(256)] + [a + b for a, b in merges]
    if flavour == "llama3":  # whole words no merge reaches: only ignore_merges produces them
        strings += [spell(w.encode()) for w in ["Hello", " world", "Digits", " Ελληνικά", "123"]]
    strings = list(dict.fromkeys(strings))
    ids = list(range(len(strings)))
    rng.shuffle(ids)
    vocab = dict(zip(strings, ids))
    n = len(strings)
    if flavour == "gpt2":
        vocab["<|endoftext|>"] = n
        added = [{"id": n, "content": "<|endoftext|>", "special": True}]
    elif flavour == "llama3":  # Llama-3's layout: specials after the vocabulary, past 65535
        names = ["<|begin_of_text|>", "<|end_of_text|>"] + \
            ["<|reserved_special_token_%d|>" % k for k in range(70001 - n - 2)]
        added = [{"id": n + k, "content": c, "special": True} for k, c in enumerate(names)]
    else:
        added = [{"id": n, "content": "<|end_of_text|>", "special": True},
                 {"id": n + 1, "content": "<|begin_of_text|>", "special": True}]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab}
    if flavour == "gpt2":
        model["merges"] = ["%s %s" % m for m in merges]
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    else:
        model["merges"] = [list(m) for m in merges]
        model["ignore_merges"] = flavour == "llama3"
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": pre, "post_processor": None,
            "decoder": {"type": "ByteLevel"}, "model": model}


# ------------------------------------------------------------------ running the tool

def run_tool(args):
    return subprocess.run([TOKENIZE] + args, capture_output=True)


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, ntok = struct.unpack("<3i", data[:12])
    width = 4 if (magic, version) == (20240801, 7) else 2
    tokens = list(struct.unpack("<%d%s" % (ntok, "I" if width == 4 else "H"), data[1024:1024 + ntok * width]))
    return (magic, version, ntok, len(data)), tokens


def encode_docs(tmp, spec_path, docs):
    out = tempfile.mkdtemp(dir=tmp)
    files = []
    for i, doc in enumerate(docs):
        files.append(os.path.join(out, "doc%04d.txt" % i))
        with open(files[-1], "wb") as f:
            f.write(doc.encode("utf-8"))
    shards = os.path.join(out, "shards")
    p = run_tool(["encode", "--tokenizer", spec_path, "--out", shards, "--doc-sep", "none"] + files)
    if p.returncode != 0:
        sys.exit("tokenize failed:\n" + p.stderr.decode(errors="replace"))
    return shards, p.stdout.decode()


def doc_token_of(spec):
    names = {t["content"]: t["id"] for t in spec["added_tokens"]}
    for name in ["<|begin_of_text|>", "<|endoftext|>", "<|end_of_text|>"]:
        if name in names:
            return name, names[name]


def test_flavour(tmp, regex, flavour, rng):
    spec = make_spec(regex, flavour, rng)
    path = os.path.join(tmp, flavour + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=flavour == "gpt2")
    ref = Reference(regex, spec)
    docs = SAMPLES + random_samples(rng, 300)
    shards, _ = encode_docs(tmp, path, docs)
    header, tokens = read_shard(os.path.join(shards, "fortunes_train_000000.bin"))
    doc_name, doc_id = doc_token_of(spec)
    expect = []
    for d in docs:
        expect += [doc_id] + ref.encode(d)
    vocab = max(t["id"] for t in spec["added_tokens"]) + 1
    wide = vocab > 65536
    magic, version, ntok, size = header
    check((magic, version) == ((20240801, 7) if wide else (20240520, 1)) and
          size == 1024 + ntok * (4 if wide else 2),
          "%s: vocabulary %d -> %s shard (magic %d, version %d, %d bytes for %d tokens)"
          % (flavour, vocab, "uint32" if wide else "uint16", magic, version, size, ntok))
    bad = [i for i in range(min(len(tokens), len(expect))) if tokens[i] != expect[i]]
    if bad or len(tokens) != len(expect):
        i = bad[0] if bad else min(len(tokens), len(expect))
        print("  first difference at token %d: tool %s ref %s" % (i, tokens[i:i + 8], expect[i:i + 8]))
    check(tokens == expect, "%s: ids equal the Python reference on %d fixed + 300 random documents "
          "(%d tokens, document token %s = %d)" % (flavour, len(SAMPLES), len(expect), doc_name, doc_id))
    if flavour == "llama3":
        changed = sum(ref.encode(d) != ref.merges_alone(d) for d in docs)
        check(changed > 0, "llama3: ignore_merges changes the ids of %d documents" % changed)
    p = run_tool(["decode", "--tokenizer", os.path.join(shards, "tokenizer.bin"),
                  os.path.join(shards, "fortunes_train_000000.bin")])
    want = "".join(doc_name + d for d in docs).encode("utf-8")
    check(p.returncode == 0 and p.stdout == want, "%s: encode + decode round-trips %d bytes exactly"
          % (flavour, len(want)))
    with open(os.path.join(shards, "vocab_size")) as f:
        check(int(f.read()) == vocab, "%s: vocab_size file says %d" % (flavour, vocab))
    return spec


# ------------------------------------------------------------------ bad input

def bad_cases(spec):
    """(name, tokenizer.json text, words the error must contain)."""
    def edited(edit):
        s = json.loads(json.dumps(spec))
        edit(s)
        return json.dumps(s)

    other = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}{1,4}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    first_merge = spec["model"]["merges"][0]
    return [
        ("another split pattern", edited(lambda s: s["pre_tokenizer"]["pretokenizers"][0]["pattern"]
                                         .update(Regex=other)), ["not supported", r"\p{N}{1,4}"]),
        ("a normalizer", edited(lambda s: s.update(normalizer={"type": "NFC"})), ["normalizer", "NFC"]),
        ("a WordPiece model", edited(lambda s: s["model"].update(type="WordPiece")), ["WordPiece"]),
        ("byte_fallback", edited(lambda s: s["model"].update(byte_fallback=True)), ["byte_fallback"]),
        ("a missing id", edited(lambda s: s["added_tokens"].pop(0)), ["no token has id"]),
        ("a duplicated id", edited(lambda s: s["added_tokens"].append(dict(s["added_tokens"][0], content="<|x|>"))),
         ["given twice"]),
        ("a merge outside the vocabulary", edited(lambda s: s["model"]["merges"].insert(0, ["\u0100\u0101", "zz"])),
         ["merge 0", "not in the vocabulary"]),
        ("a non-special added token", edited(lambda s: s["added_tokens"][0].update(special=False)),
         ["not special"]),
        ("no document token", edited(lambda s: [t.update(content="<|t%d|>" % i) for i, t in enumerate(s["added_tokens"])]),
         ["--doc-token"]),
        ("truncated JSON", json.dumps(spec)[:-40], ["byte"]),
        ("a character outside the byte alphabet", edited(lambda s: s["model"]["vocab"].update({"\u4e00": 999999})),
         ["byte-to-unicode"]),
        ("merges as a string", edited(lambda s: s["model"].update(merges=" ".join(first_merge))), ["merges"]),
    ]


def test_bad_input(tmp, spec):
    doc = os.path.join(tmp, "doc.txt")
    with open(doc, "w") as f:
        f.write("some text\n")
    for name, text, words in bad_cases(spec):
        path = os.path.join(tmp, "bad.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        out = tempfile.mkdtemp(dir=tmp) + "/shards"
        p = run_tool(["encode", "--tokenizer", path, "--out", out, "--doc-sep", "none", doc])
        err = p.stderr.decode(errors="replace").strip()
        written = os.path.exists(out) and os.listdir(out)
        check(p.returncode != 0 and all(w in err for w in words) and not written,
              "bad tokenizer.json, %s: refused (%s)" % (name, err.splitlines()[-1] if err else "no message"))


def main():
    if not os.access(TOKENIZE, os.X_OK):
        sys.exit("FAIL: %s not found; build it with `make %s`" % (TOKENIZE, os.path.relpath(TOKENIZE, ROOT)))
    try:
        import regex
    except ImportError:
        print("SKIP tokenizer.json tests: python3-regex is not installed (apt-get install python3-regex)")
        return
    seed = int(os.environ.get("SEED", random.randrange(1 << 30)))
    print("seed %d (SEED=%d reproduces)" % (seed, seed))
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        for flavour in ["gpt2", "llama3", "llama3m"]:
            spec = test_flavour(tmp, regex, flavour, rng)
        test_bad_input(tmp, spec)
    if failures:
        sys.exit("%d check(s) failed" % len(failures))
    print("all tokenizer.json checks passed")


if __name__ == "__main__":
    main()
