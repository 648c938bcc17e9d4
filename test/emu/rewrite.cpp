// test/emu/rewrite.cpp - the emulated tier's source rewriter: turns the CUDA-only syntax of a
// preprocessed .cu file into C++ that g++ compiles against test/emu/include/emu_cuda.h.
//
//   build/emu/rewrite IN.ii OUT.ii
//
// It runs on the output of `g++ -E` (so #ifdef branches are already resolved, macros expanded,
// and every line carries its original file and line through the preprocessor's line markers),
// and it edits only the lines that come from the project's own files (relative paths, except the
// emulator's headers in test/emu/include/): system and CUDA headers pass through untouched.
// Four rewrites:
//
//   kernel<T><<<grid, block, smem, stream>>>(a, b)
//       -> ::emu::launch(::emu::Site{"file", line, "kernel<T>", __func__}, ::emu::launch_dims(grid, block,
//          smem, stream), kernel<T>, a, b)
//   __shared__ T name[N][M];   (emu_cuda.h turns __shared__ into the marker __emu_shared__)
//       -> static const char key = 0;
//          T (&name)[N][M] = *static_cast<T (*)[N][M]>(::emu::static_shared(&key, sizeof(T[N][M]),
//          alignment, "name", "file", line));
//   extern __shared__ __align__(A) T name[];
//       -> T* name = static_cast<T*>(::emu::dynamic_shared(A, "name", "file", line));
//   __global__ void __launch_bounds__(N) kernel(...) { ...
//       -> __global__ void kernel(...) { ::emu::check_launch_bounds(N, "file", line); ...
//
// and every inline asm statement becomes a static_assert naming its first PTX instruction, so an
// instruction the emulator does not model fails the build instead of being skipped. A replacement
// that spans several lines is followed by a line marker, so compiler messages and
// __builtin_LINE() keep pointing at the original source.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Edit {
  size_t start, end;  // replaced span [start, end)
  std::string text;
};

struct Rewriter {
  std::string src;
  std::vector<char> code;  // 1 where src[i] is code (not in a literal or comment)
  struct LineInfo {
    size_t offset;      // where the output line starts in src
    int file;           // index into files
    int line;           // its line in that file
  };
  std::vector<LineInfo> lines;
  std::vector<std::string> files;     // as the line markers spell them, minus a leading "./"
  std::vector<std::string> spelling;  // exactly as the line markers spell them
  std::vector<char> project;          // per file: rewrite it?
  std::vector<Edit> edits;
  int keys = 0;

  [[noreturn]] void die(size_t pos, const std::string& what) {
    std::fprintf(stderr, "%s:%d: emu rewrite: %s\n", file_at(pos).c_str(), line_at(pos),
                 what.c_str());
    std::exit(1);
  }
  const LineInfo& info(size_t pos) const {
    auto it = std::upper_bound(lines.begin(), lines.end(), pos,
                               [](size_t p, const LineInfo& l) { return p < l.offset; });
    return *(it - 1);
  }
  std::string file_at(size_t pos) const { return files[info(pos).file]; }
  int line_at(size_t pos) const { return info(pos).line; }
  bool in_project(size_t pos) const { return project[info(pos).file]; }

  void classify();
  void read_line_markers();
  void find_edits();
  std::string apply() const;

  // Scanning helpers over code characters.
  bool digit_separator(size_t i) const {  // the ' of 1'000'000
    return i > 0 && i + 1 < src.size() && std::isxdigit((unsigned char)src[i - 1]) &&
           std::isxdigit((unsigned char)src[i + 1]);
  }
  static bool ident_char(char c) { return std::isalnum((unsigned char)c) || c == '_'; }
  bool is_space(size_t i) const { return i < src.size() && std::isspace((unsigned char)src[i]); }
  size_t skip_space(size_t i) const {
    while (i < src.size() && (std::isspace((unsigned char)src[i]) || !code[i])) i++;
    return i;
  }
  size_t match_close(size_t open) const;  // src[open] is ( [ { <: position after its partner
  size_t find_code(size_t from, const std::string& what, size_t stop = std::string::npos) const;
  bool word_at(size_t i, const std::string& w) const {
    return src.compare(i, w.size(), w) == 0 && code[i] && (i == 0 || !ident_char(src[i - 1])) &&
           (i + w.size() >= src.size() || !ident_char(src[i + w.size()]));
  }

  void rewrite_launch(size_t at);
  void rewrite_shared(size_t at);
  void rewrite_launch_bounds(size_t at);
  void rewrite_asm(size_t at);
  size_t kernel_start(size_t end) const;
  std::string quoted_site(size_t pos) const {
    std::string f = file_at(pos);
    return "\"" + f + "\", " + std::to_string(line_at(pos));
  }
  void add(size_t start, size_t end, std::string text);
  std::string without_markers(size_t a, size_t b) const;
};

// Marks literals and comments (not code) so that the scans below never look inside them.
void Rewriter::classify() {
  code.assign(src.size(), 1);
  size_t i = 0;
  while (i < src.size()) {
    const char c = src[i];
    if (c == '/' && i + 1 < src.size() && src[i + 1] == '/') {
      while (i < src.size() && src[i] != '\n') code[i++] = 0;
    } else if (c == '/' && i + 1 < src.size() && src[i + 1] == '*') {
      size_t e = src.find("*/", i + 2);
      e = e == std::string::npos ? src.size() : e + 2;
      while (i < e) code[i++] = 0;
    } else if (c == 'R' && i + 1 < src.size() && src[i + 1] == '"' &&
               (i == 0 || !ident_char(src[i - 1]))) {
      const size_t paren = src.find('(', i + 2);
      const std::string close = ")" + src.substr(i + 2, paren - i - 2) + "\"";
      size_t e = src.find(close, paren);
      e = e == std::string::npos ? src.size() : e + close.size();
      while (i < e) code[i++] = 0;
    } else if (c == '"' || (c == '\'' && !digit_separator(i))) {
      code[i++] = 0;
      while (i < src.size() && src[i] != c && src[i] != '\n') {
        if (src[i] == '\\') code[i++] = 0;
        code[i++] = 0;
      }
      if (i < src.size()) code[i++] = 0;
    } else {
      i++;
    }
  }
}

// Line markers of g++ -E: `# 42 "kernels/cuda/reduce.cu" 2` at the start of a line.
void Rewriter::read_line_markers() {
  files.push_back("<unknown>");
  spelling.push_back("<unknown>");
  project.push_back(0);
  int file = 0, line = 1;
  size_t pos = 0;
  while (pos < src.size()) {
    const size_t eol = std::min(src.find('\n', pos), src.size());
    if (src[pos] == '#' && pos + 1 < src.size() && src[pos + 1] == ' ' &&
        std::isdigit((unsigned char)src[pos + 2])) {
      const int number = std::atoi(src.c_str() + pos + 2);
      const size_t q1 = src.find('"', pos);
      const size_t q2 = q1 == std::string::npos ? q1 : src.find('"', q1 + 1);
      if (q2 != std::string::npos && q2 < eol) {
        const std::string spelled = src.substr(q1 + 1, q2 - q1 - 1);
        std::string name = spelled.rfind("./", 0) == 0 ? spelled.substr(2) : spelled;
        auto it = std::find(files.begin(), files.end(), name);
        file = (int)(it - files.begin());
        if (it == files.end()) {
          files.push_back(name);
          spelling.push_back(spelled);
          const bool ours = !name.empty() && name[0] != '/' && name[0] != '<' &&
                            name.rfind("test/emu/include/", 0) != 0;
          project.push_back(ours);
        }
      }
      lines.push_back({pos, file, number - 1});  // the marker line itself
      line = number;
    } else {
      lines.push_back({pos, file, line++});
    }
    pos = eol + 1;
  }
  if (lines.empty()) lines.push_back({0, 0, 1});
}

size_t Rewriter::match_close(size_t open) const {
  const char o = src[open];
  const char c = o == '(' ? ')' : o == '[' ? ']' : o == '{' ? '}' : '>';
  int depth = 0;
  for (size_t i = open; i < src.size(); i++) {
    if (!code[i]) continue;
    if (src[i] == o) depth++;
    if (src[i] == c && --depth == 0) return i + 1;
  }
  return std::string::npos;
}

size_t Rewriter::find_code(size_t from, const std::string& what, size_t stop) const {
  for (size_t i = from; i + what.size() <= src.size() && i < stop; i++)
    if (code[i] && src.compare(i, what.size(), what) == 0) return i;
  return std::string::npos;
}

// Replaces [start, end) by text. When the span covered several lines (maybe with line markers
// of macros from system headers inside), a line marker after the replacement says where the
// rest of the original line is, so that later lines keep their numbers.
void Rewriter::add(size_t start, size_t end, std::string text) {
  if (std::count(src.begin() + start, src.begin() + end, '\n') > 0) {
    const LineInfo& l = info(end);
    text += "\n# " + std::to_string(l.line) + " \"" + spelling[l.file] + "\"\n";
  }
  edits.push_back({start, end, std::move(text)});
}

// src[a, b) without the line markers the preprocessor put inside it.
std::string Rewriter::without_markers(size_t a, size_t b) const {
  std::string out;
  size_t i = a;
  while (i < b) {
    size_t eol = src.find('\n', i);
    eol = eol == std::string::npos || eol >= b ? b : eol + 1;
    const bool marker = (i == 0 || src[i - 1] == '\n') && src[i] == '#';
    if (!marker) out.append(src, i, eol - i);
    i = eol;
  }
  return out;
}

// The start of the kernel expression that ends at `end`: identifiers, ::, template arguments.
size_t Rewriter::kernel_start(size_t end) const {
  size_t i = end;
  while (i > 0 && is_space(i - 1)) i--;
  for (;;) {
    if (i > 0 && src[i - 1] == '>') {  // template arguments: back to the matching <
      int depth = 0;
      size_t j = i;
      while (j > 0) {
        j--;
        if (!code[j]) continue;
        if (src[j] == '>') depth++;
        if (src[j] == '<' && --depth == 0) break;
      }
      i = j;
      while (i > 0 && is_space(i - 1)) i--;
    }
    size_t j = i;
    while (j > 0 && ident_char(src[j - 1])) j--;
    if (j == i) return i;
    i = j;
    size_t k = i;
    while (k > 0 && is_space(k - 1)) k--;
    if (k >= 2 && src[k - 1] == ':' && src[k - 2] == ':') {
      const size_t colons = k - 2;
      i = colons;
      while (i > 0 && is_space(i - 1)) i--;
      if (i == 0 || !(ident_char(src[i - 1]) || src[i - 1] == '>')) return colons;  // ::kernel
      continue;
    }
    return i;
  }
}

void Rewriter::rewrite_launch(size_t at) {
  const size_t kstart = kernel_start(at);
  size_t kend = at;
  while (kend > kstart && is_space(kend - 1)) kend--;
  if (kstart == kend) die(at, "<<< without a kernel before it");
  const size_t cfg_end = find_code(at + 3, ">>>");
  if (cfg_end == std::string::npos) die(at, "<<< without >>>");
  const size_t open = skip_space(cfg_end + 3);
  if (open >= src.size() || src[open] != '(') die(at, ">>> not followed by (arguments)");
  const size_t close = match_close(open);
  if (close == std::string::npos) die(at, "unbalanced launch arguments");
  const std::string kernel = without_markers(kstart, kend);
  std::string name;  // the kernel expression on one line, for messages
  for (char c : kernel) {
    if (std::isspace((unsigned char)c)) c = ' ';
    if (c != ' ' || (!name.empty() && name.back() != ' ')) name += c;
  }
  const std::string cfg = src.substr(at + 3, cfg_end - at - 3);
  std::string args = src.substr(open + 1, close - open - 2);
  const bool no_args = args.find_first_not_of(" \t\n") == std::string::npos;
  add(kstart, close,
      "::emu::launch(::emu::Site{" + quoted_site(at) + ", \"" + name + "\", __func__}, ::emu::launch_dims(" +
          cfg + "), " + kernel + (no_args ? std::string() : ", " + args) + ")");
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\n"), b = s.find_last_not_of(" \t\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// Removes `__attribute__((aligned(X)))` and `alignas(X)` from decl; returns X or "".
std::string take_alignment(std::string& decl) {
  static const char* const heads[] = {"__attribute__((aligned(", "__attribute__((__aligned__(",
                                      "alignas("};
  for (const std::string head : heads) {
    const size_t at = decl.find(head);
    if (at == std::string::npos) continue;
    size_t i = at + head.size();
    int depth = 1;
    while (i < decl.size() && depth > 0) {
      if (decl[i] == '(') depth++;
      if (decl[i] == ')') depth--;
      i++;
    }
    const std::string expr = decl.substr(at + head.size(), i - 1 - at - head.size());
    size_t end = i;
    while (end < decl.size() && decl[end] == ')') end++;  // the attribute's closing parentheses
    if (head == "alignas(") end = i;
    decl.erase(at, end - at);
    return expr;
  }
  return "";
}

// Top-level comma-separated parts of s (nesting in () [] {} <>).
std::vector<std::string> split_declarators(const std::string& s) {
  std::vector<std::string> parts(1);
  int depth = 0;
  for (char c : s) {
    if (c == '(' || c == '[' || c == '{' || c == '<') depth++;
    if (c == ')' || c == ']' || c == '}' || c == '>') depth--;
    if (c == ',' && depth == 0) {
      parts.emplace_back();
      continue;
    }
    parts.back() += c;
  }
  return parts;
}

void Rewriter::rewrite_shared(size_t at) {
  size_t start = at, k = at;
  while (k > 0 && is_space(k - 1)) k--;
  const bool is_extern = k >= 6 && word_at(k - 6, "extern");
  if (is_extern) start = k - 6;
  const size_t semi = find_code(at, ";");
  if (semi == std::string::npos) die(at, "__shared__ declaration without ;");
  std::string decl = without_markers(at + 14, semi);  // after "__emu_shared__"
  const std::string align = trim(take_alignment(decl));
  std::vector<std::string> parts = split_declarators(decl);
  std::string type, out;
  for (size_t p = 0; p < parts.size(); p++) {
    const std::string d = trim(parts[p]);
    const size_t bracket = std::min(d.find('['), d.size());
    size_t name_end = bracket;
    while (name_end > 0 && std::isspace((unsigned char)d[name_end - 1])) name_end--;
    size_t name_start = name_end;
    while (name_start > 0 && ident_char(d[name_start - 1])) name_start--;
    const std::string name = d.substr(name_start, name_end - name_start);
    if (name.empty() || d.find('=') != std::string::npos)
      die(at, "cannot read the __shared__ declaration '" + d + "'");
    if (p == 0) type = trim(d.substr(0, name_start));
    else if (!trim(d.substr(0, name_start)).empty())
      die(at, "unsupported __shared__ declarator '" + d + "'");
    const std::string dims = trim(d.substr(bracket));
    const std::string full = type + " " + dims;  // the variable's type, e.g. "float [32]"
    const std::string natural = "alignof(" + full + ")";
    const std::string alignment = align.empty() ? natural
        : "((size_t)(" + align + ") > " + natural + " ? (size_t)(" + align + ") : " + natural + ")";
    const std::string where = "\"" + name + "\", " + quoted_site(at);
    if (is_extern) {
      if (dims.rfind("[]", 0) != 0) die(at, "extern __shared__ " + name + " must be an array []");
      const std::string rest = dims.substr(2);
      const std::string ptr = rest.empty() ? type + "*" : type + " (*)" + rest;
      const std::string var = rest.empty() ? type + "* " + name : type + " (*" + name + ")" + rest;
      const std::string natural_elem = "alignof(" + type + ")";
      const std::string a = align.empty() ? natural_elem : "(size_t)(" + align + ")";
      out += var + " = static_cast<" + ptr + ">(::emu::dynamic_shared(" + a + ", " + where + "));";
    } else {
      const std::string key = "emu_shared_key_" + std::to_string(keys++);
      const std::string ref = dims.empty() ? type + "& " + name : type + " (&" + name + ")" + dims;
      const std::string ptr = dims.empty() ? type + "*" : type + " (*)" + dims;
      out += "static const char " + key + " = 0; " + ref + " = *static_cast<" + ptr +
             ">(::emu::static_shared(&" + key + ", sizeof(" + full + "), " + alignment + ", " +
             where + "));";
    }
    out += p + 1 < parts.size() ? " " : "";
  }
  add(start, semi + 1, out);
}

void Rewriter::rewrite_launch_bounds(size_t at) {
  const size_t open = skip_space(at + 21);  // after "__emu_launch_bounds__"
  if (open >= src.size() || src[open] != '(') die(at, "__launch_bounds__ without (arguments)");
  const size_t close = match_close(open);
  std::string bound = without_markers(open + 1, close - 1);
  const std::vector<std::string> args = split_declarators(bound);
  bound = trim(args[0]);
  add(at, close, "");
  // The function's parameter list, then its body (or ; for a declaration).
  const size_t params = find_code(close, "(");
  const size_t after = params == std::string::npos ? params : match_close(params);
  if (after == std::string::npos) die(at, "cannot find the kernel after __launch_bounds__");
  for (size_t i = after; i < src.size(); i++) {
    if (!code[i]) continue;
    if (src[i] == ';') return;
    if (src[i] == '{') {
      edits.push_back({i + 1, i + 1, " ::emu::check_launch_bounds((long)(" + bound + "), " +
                                         quoted_site(at) + ");"});
      return;
    }
  }
}

void Rewriter::rewrite_asm(size_t at) {
  size_t i = at;
  while (i < src.size() && ident_char(src[i])) i++;
  for (;;) {
    i = skip_space(i);
    bool qualifier = false;
    for (const char* q : {"volatile", "__volatile__", "inline", "goto"})
      if (word_at(i, q)) {
        i += std::string(q).size();
        qualifier = true;
      }
    if (!qualifier) break;
  }
  if (i >= src.size() || src[i] != '(') die(at, "asm without (...)");
  const size_t close = match_close(i);
  const size_t q1 = src.find('"', i);
  std::string instr = "(no string)";
  if (q1 != std::string::npos && q1 < close) {
    const size_t q2 = src.find('"', q1 + 1);
    instr = trim(src.substr(q1 + 1, q2 - q1 - 1));
    const size_t brace = instr.find_first_not_of("{ \t");
    instr = instr.substr(brace == std::string::npos ? 0 : brace);
    instr = instr.substr(0, instr.find_first_of(" \t\\;"));
  }
  add(at, close,
      "static_assert(sizeof(char) == 0, \"unsupported inline PTX in the emulated build: " + instr +
          " (model it in test/emu/ptx.cpp and call it from the wrapper's GPT5D_EMULATED_CUDA "
          "branch)\")");
}

void Rewriter::find_edits() {
  for (size_t i = 0; i < src.size(); i++) {
    if (!code[i]) continue;
    const char c = src[i];
    if (c != '<' && c != '_' && c != 'a') continue;
    if (!in_project(i)) continue;
    if (c == '<' && src.compare(i, 3, "<<<") == 0) {
      rewrite_launch(i);
      i = edits.back().end - 1;
    } else if (word_at(i, "__emu_shared__")) {
      rewrite_shared(i);
      i = edits.back().end - 1;
    } else if (word_at(i, "__emu_launch_bounds__")) {
      rewrite_launch_bounds(i);
      i += 20;
    } else if (word_at(i, "asm") || word_at(i, "__asm__") || word_at(i, "__asm")) {
      rewrite_asm(i);
      i = edits.back().end - 1;
    }
  }
}

std::string Rewriter::apply() const {
  std::vector<Edit> sorted = edits;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const Edit& a, const Edit& b) { return a.start < b.start; });
  std::string out;
  size_t pos = 0;
  for (const Edit& e : sorted) {
    if (e.start < pos) {
      std::fprintf(stderr, "emu rewrite: internal error: overlapping edits\n");
      std::exit(1);
    }
    out.append(src, pos, e.start - pos);
    out += e.text;
    pos = e.end;
  }
  out.append(src, pos, std::string::npos);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN.ii OUT.ii\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "emu rewrite: cannot read %s\n", argv[1]);
    return 1;
  }
  std::stringstream buf;
  buf << in.rdbuf();
  Rewriter r;
  r.src = buf.str();
  r.classify();
  r.read_line_markers();
  r.find_edits();
  std::ofstream out(argv[2], std::ios::binary);
  out << r.apply();
  return out ? 0 : 1;
}
