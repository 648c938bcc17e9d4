"""test/test_docs.py - the docs kept true to the code (group `docs`): checks of text against the
tree, no build needed.

1. Every section and key of the config schema (config/config_schema.cu: the KEY(section, key)
   lines and sections()) has its heading and its table row in docs/CONFIG.md, and every key
   row there is in the schema; the README's Configuration section names every section and
   points to docs/CONFIG.md; every "[section] key" written in README.md and docs/*.md is a key.
2. Every file the README's reader's tour and its layout table name exists (a bare name in the
   layout table is taken in the row's folder, in the tour in the folder of a path before it in
   the same item), and every parallel/*.cu is in the layout table.
3. The README's sentence on `make test` gives the number of groups test/run_all.sh runs (its
   `run NAME` lines) and the time docs/PERF.md records ("How long the tests take"); every test
   group the Status section names is one.
4. Every file the README and docs name as `tools/...`, `bench/...`, `test/...`, `configs/...`
   exists.
Exit status 1 on any failure."""
import glob
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "test"))
from checks import Checks  # noqa: E402

checks = Checks("test_docs")
FILE_EXT = r"(?:cu|cuh|h|cpp|py|sh|md|toml|mk|txt|json)"
NOT_KEYS = {"bandwidths"}  # "[plan] bandwidths": the planner's words in its printed output
NOT_FILES = {"tokenizer.json"}  # a Hugging Face file format, not a file of ours


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def section(text, heading):
    """The text under a markdown heading line, up to the next heading of its level or above."""
    lines = text.splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    start = lines.index(heading) + 1
    end = start
    while end < len(lines):
        m = re.match(r"^(#+) ", lines[end])
        if m and len(m.group(1)) <= level:
            break
        end += 1
    return "\n".join(lines[start:end])


def schema():
    """{section: [keys]} in the schema's order, from config/config_schema.cu."""
    src = read("config/config_schema.cu")
    sections = re.findall(r'"(\w+)"', re.search(r"sections\(\) \{(.*?)\};", src, re.S).group(1))
    keys = {s: [] for s in sections}
    for sec, key in re.findall(r"\bKEY\((\w+), (\w+)", src):
        if sec != "sec":  # the macro's own definition
            keys.setdefault(sec, []).append(key)
    return keys


# --- 1. the config schema against docs/CONFIG.md and the README ---------------------------------
def test_config_doc(keys):
    doc = read("docs/CONFIG.md")
    for sec, names in keys.items():
        heading = f"### [{sec}]"
        if heading not in doc.splitlines():
            checks.check(f"CONFIG.md has [{sec}]", False, f"no heading '{heading}'")
            continue
        rows = {k for line in section(doc, heading).splitlines() if line.startswith("|")
                for k in re.findall(r"`(\w+)`", line.split("|")[1])}
        missing = [k for k in names if k not in rows]
        extra = sorted(rows - set(names))
        checks.check(f"CONFIG.md [{sec}] documents every key of the schema", not missing,
                     f"{len(names)} keys; missing: {missing}")
        checks.check(f"CONFIG.md [{sec}] documents no key the schema lacks", not extra,
                     f"not in the schema: {extra}")


def test_readme_config(keys):
    readme = read("README.md")
    summary = section(readme, "## Configuration")
    checks.check("README's Configuration points to docs/CONFIG.md", "docs/CONFIG.md" in summary,
                 "")
    missing = [s for s in keys if f"`[{s}]`" not in summary]
    checks.check("README's Configuration names every section", not missing, f"missing {missing}")
    all_keys = {(s, k) for s, ks in keys.items() for k in ks}
    for rel in ["README.md"] + sorted(os.path.relpath(p, ROOT)
                                      for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        named = set(re.findall(r"\[(\w+)\] (\w+)", read(rel)))
        bad = sorted(f"[{s}] {k}" for s, k in named if s in keys and (s, k) not in all_keys
                     and k not in NOT_KEYS)
        checks.check(f"{rel}: every '[section] key' it writes is a key", not bad, f"unknown: {bad}")
    table = section(readme, "## Running")
    rows = [ln for ln in table.splitlines() if ln.startswith("| `")]
    named = {k for ln in rows for k in re.findall(r"`(\w+)`", ln.split("|")[1])}
    bad = sorted(named - set(keys["parallel"]))
    checks.check("README's [parallel] table names only [parallel] keys", rows and not bad,
                 f"{len(named)} keys; unknown: {bad}")


# --- 2. the tour and the layout table name files that exist -------------------------------------
def path_tokens(text):
    """Backticked paths and file names: `parallel/zero.cu`, `mesh.cu`, `kernels/cpu/*.cpp`,
    `config/`."""
    out = []
    for tok in re.findall(r"`([^`\s]+)`", text):
        if re.fullmatch(r"[\w./*-]+\." + FILE_EXT, tok) or re.fullmatch(r"[\w./-]+/", tok):
            out.append(tok)
    return out


def exists(rel):
    return bool(glob.glob(os.path.join(ROOT, rel)))


def test_layout_table():
    rows = [ln for ln in section(read("README.md"), "## Layout").splitlines()
            if ln.startswith("| `")]
    named_parallel = set()
    for row in rows:
        cells = row.split("|")
        folders = path_tokens(cells[1])
        for tok in path_tokens(cells[2]):
            if tok in NOT_FILES:
                continue
            where = [f + tok for f in folders if f.endswith("/")] + [tok]
            checks.check(f"layout table: {tok} ({cells[1].strip()}) exists",
                         any(exists(w) for w in where), f"looked for {where}")
            if folders == ["parallel/"]:
                named_parallel.add(tok)
        for f in folders:
            checks.check(f"layout table: {f} exists", exists(f), "")
    unnamed = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "parallel", "*.cu"))
                     if os.path.basename(p) not in named_parallel)
    checks.check("layout table names every parallel/*.cu", not unnamed, f"not named: {unnamed}")


def test_tour():
    tour = section(read("README.md"), "## A reader's tour")
    items = re.split(r"\n(?=\s*\d+\. )", tour)
    count = 0
    for item in items:
        folders = []
        for tok in path_tokens(item):
            count += 1
            if "/" in tok:
                where = [tok]
                folders.append(os.path.dirname(tok.rstrip("/")) + "/")
            else:
                where = [f + tok for f in folders] or [tok]
            checks.check(f"tour: {tok} exists", any(exists(w) for w in where),
                         f"looked for {where}")
    checks.check("the tour names files", count >= 20, f"{count} paths")


# --- 3. the test suite's numbers and the Status section -----------------------------------------
def run_groups():
    return [m for m in re.findall(r"^\s*(?:run|run_alone|\$emu_run) ([\w-]+)", read("test/run_all.sh"), re.M)]


def test_suite_sentences():
    groups = run_groups()
    readme = read("README.md")
    quick = section(readme, "## Quick start (fresh Debian 12 machine)")
    m = re.search(r"runs all (\d+)\s+test\s+groups", quick)
    checks.check("README's group count is test/run_all.sh's", m and int(m.group(1)) == len(groups),
                 f"README: {m.group(1) if m else 'no sentence'}, run_all.sh: {len(groups)}")
    said = re.search(r"takes (\d+) to (\d+)\s+minutes\s+on 2 cores", quick)
    perf = section(read("docs/PERF.md"), "## How long the tests take")
    recorded = re.search(r"(\d+) to (\d+)\s+minutes", perf)
    checks.check("README's test time is the one docs/PERF.md records",
                 said and recorded and said.groups() == recorded.groups(),
                 f"README {said.groups() if said else None}, "
                 f"PERF.md {recorded.groups() if recorded else None}")
    status = section(readme, "## Status")
    named = re.findall(r"`([\w-]+)`", status.split("\n\n")[0])
    bad = [g for g in named if g not in groups]
    checks.check("every test group the Status section names runs", named and not bad,
                 f"{len(named)} named; not groups of test/run_all.sh: {bad}")


# --- 4. scripts and configs the docs name -------------------------------------------------------
def test_named_files():
    docs = ["README.md", "test/README.md"] + sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    for rel in docs:
        text = read(rel)
        named = set(re.findall(r"\b((?:tools|bench|test|configs|docs)/[\w./-]+\." + FILE_EXT +
                               r")\b", text))
        missing = sorted(p for p in named if not exists(p))
        checks.check(f"{rel}: every tools/, bench/, test/, configs/, docs/ file it names exists",
                     not missing, f"{len(named)} named; missing: {missing}")


def main():
    keys = schema()
    checks.check("the schema was read", len(keys) >= 10 and sum(map(len, keys.values())) >= 90,
                 f"{len(keys)} sections, {sum(map(len, keys.values()))} keys")
    checks.run_each(lambda: test_config_doc(keys), lambda: test_readme_config(keys),
                    test_layout_table, test_tour, test_suite_sentences, test_named_files)
    checks.report()


if __name__ == "__main__":
    main()
