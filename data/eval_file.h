// data/eval_file.h - multiple-choice evaluation sets in llm.c's file format (the one llm.c's
// dev/data/hellaswag.py writes for HellaSwag; docs/CONFIG.md "[eval]" describes it), read and
// checked whole before any training.
//
// The file: a header of 256 little-endian int32 (magic 20240522, version 1 (uint16 tokens, GPT-2)
// or 2 (uint32 tokens, Llama 3), the number of examples, the longest example in bytes), then the
// examples, each a stream of uint16 (version 1) or uint32 (version 2) values:
//   START (65535, version 2: 2^32-1)  BYTES (the example's size, these fields included)
//   INDEX (its number, from 0)  LABEL (the right ending)  ENDINGS (how many, usually 4)
//   then the context: COUNT, COUNT tokens; then per ending: COUNT, COUNT tokens.
// An example is scored by running each ending after the context and taking the mean loss of
// the ending's tokens; the ending with the lowest is the model's choice (training/eval.h).
//
// Every record is checked (the marker, its size against the bytes it holds, its index, the
// label against the endings, token ids against the vocabulary, context + ending within the
// model's window); a bad one is refused with the file, the record's number and its byte offset.
#pragma once
#include <string>
#include <vector>

struct ChoiceExample {
  int label = 0;
  std::vector<int> context;
  std::vector<std::vector<int>> endings;
};

// The examples of `path` (at most max_examples when > 0). `what` names the key in messages
// ("[eval] file"); V: the vocabulary; T: the model's window (context + ending - 1 must fit).
std::vector<ChoiceExample> eval_file_read(const std::string& path, const std::string& what,
                                          int V, int T, int max_examples);
