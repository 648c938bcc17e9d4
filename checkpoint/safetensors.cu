// checkpoint/safetensors.cu - reading and writing safetensors files (checkpoint/safetensors.h):
// the header checked entry by entry, tensors read with pread on demand.
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "config/json.h"
#include "kernels/common.h"

namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // the format's own limit: 100 MB of JSON

// Bytes per element of each dtype the format defines (0: unknown).
size_t st_dtype_bytes(const std::string& d) {
  static const std::map<std::string, size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
      {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2},  {"U8", 1},  {"BOOL", 1},
      {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

std::string at(const std::string& path, size_t offset) {
  char buf[48];
  std::snprintf(buf, sizeof buf, ": byte %zu: ", offset);
  return path + buf;
}

// A non-negative integer array of JSON (shape, data_offsets) into *out; "" or what is wrong.
std::string int_array(const JsonValue& v, const char* what, std::vector<int64_t>* out) {
  if (v.kind != JsonValue::Array) return std::string(what) + " is " + v.kind_name() + ", not an array";
  for (const JsonValue& d : v.items) {
    if (d.kind != JsonValue::Number || !d.is_integer || d.integer < 0)
      return std::string(what) + " holds something other than a non-negative integer";
    out->push_back(d.integer);
  }
  return "";
}

// One header entry -> *t; "" or what is wrong with it (the caller adds file and offset).
std::string parse_entry(const JsonValue& e, uint64_t data_bytes, SafetensorsTensor* t) {
  if (e.kind != JsonValue::Object) return std::string("the entry is ") + e.kind_name();
  for (const auto& m : e.members)
    if (m.first != "dtype" && m.first != "shape" && m.first != "data_offsets")
      return "unknown key \"" + m.first + "\" (expected dtype, shape, data_offsets)";
  const JsonValue *dtype = e.find("dtype"), *shape = e.find("shape"), *offs = e.find("data_offsets");
  if (!dtype || !shape || !offs) return "the entry needs dtype, shape and data_offsets";
  if (dtype->kind != JsonValue::String || st_dtype_bytes(dtype->text) == 0)
    return "unknown dtype" + (dtype->kind == JsonValue::String ? " \"" + dtype->text + "\"" : "");
  t->dtype = dtype->text;
  std::string err = int_array(*shape, "shape", &t->shape);
  std::vector<int64_t> o;
  if (err.empty()) err = int_array(*offs, "data_offsets", &o);
  if (!err.empty()) return err;
  if (o.size() != 2 || o[0] > o[1] || (uint64_t)o[1] > data_bytes)
    return "data_offsets must be [begin, end] with begin <= end <= the data's " +
           std::to_string(data_bytes) + " bytes";
  unsigned __int128 bytes = st_dtype_bytes(t->dtype);
  for (int64_t d : t->shape) bytes = bytes * (uint64_t)d > data_bytes ? data_bytes + 1 : bytes * d;
  if (bytes != (unsigned __int128)(o[1] - o[0]))
    return "data_offsets span " + std::to_string(o[1] - o[0]) + " bytes, but the dtype and " +
           "shape need " + (bytes > data_bytes ? std::string("more than the file holds")
                                               : std::to_string((uint64_t)bytes));
  t->begin = (uint64_t)o[0], t->end = (uint64_t)o[1];
  return "";
}

// The header's JSON text of an open file; "" or what is wrong.
std::string read_header(int fd, const std::string& path, std::string* text, uint64_t* size) {
  struct stat st;
  if (fstat(fd, &st) != 0) return path + ": " + std::strerror(errno);
  *size = (uint64_t)st.st_size;
  uint64_t n = 0;
  if (*size < 8 || pread(fd, &n, 8, 0) != 8)
    return at(path, 0) + "shorter than the 8-byte header length: not a safetensors file";
  if (n > kMaxHeader || n > *size - 8)
    return at(path, 0) + "header length " + std::to_string(n) + " is larger than " +
           (n > kMaxHeader ? "the format's 100 MB limit" : "the file") +
           ": not a safetensors file, or a damaged one";
  text->resize(n);
  if (n > 0 && pread(fd, &(*text)[0], n, 8) != (ssize_t)n) return path + ": short read";
  return "";
}

}  // namespace

size_t SafetensorsTensor::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= (size_t)d;
  return n;
}

std::string safetensors_open_file(const std::string& path, SafetensorsSet* set) {
  struct stat st;  // before opening: a FIFO would block the open
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    return path + ": a directory, not a file (a safetensors file was expected)";
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return path + ": not a regular file (a device, FIFO or socket), not a safetensors file";
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return path + ": cannot open: " + std::strerror(errno);
  set->files.push_back({path, fd});
  const int file = (int)set->files.size() - 1;
  std::string text;
  uint64_t size = 0;
  std::string err = read_header(fd, path, &text, &size);
  if (!err.empty()) return err;
  JsonValue header;
  err = json_parse(text, &header, 8);
  if (!err.empty()) return path + ": malformed header: " + err;
  if (header.kind != JsonValue::Object)
    return at(path, 8) + "the header is " + header.kind_name() + ", expected an object";
  const uint64_t data_start = 8 + text.size(), data_bytes = size - data_start;
  for (const auto& [name, e] : header.members) {
    if (name == "__metadata__") {
      bool strings = e.kind == JsonValue::Object;
      for (const auto& m : e.members) strings &= m.second.kind == JsonValue::String;
      if (!strings) return at(path, e.offset) + "__metadata__ must be an object of strings";
      continue;
    }
    SafetensorsTensor t;
    err = parse_entry(e, data_bytes, &t);
    if (!err.empty()) return at(path, e.offset) + "tensor \"" + name + "\": " + err;
    if (set->tensors.count(name))
      return at(path, e.offset) + "tensor \"" + name + "\" is also in " +
             set->files[set->tensors[name].file].path;
    t.file = file, t.begin += data_start, t.end += data_start;
    set->tensors[name] = t;
  }
  return "";
}

// The shards of an index: every file once, every tensor found where the weight map says.
static std::string open_index(const std::string& dir, const std::string& index,
                              SafetensorsSet* set) {
  JsonValue json;
  std::string err = json_parse_file(index, &json);
  if (!err.empty()) return err;
  const JsonValue* map = json.kind == JsonValue::Object ? json.find("weight_map") : nullptr;
  if (!map || map->kind != JsonValue::Object)
    return index + ": expected an object with a \"weight_map\" object";
  std::map<std::string, std::string> where;  // tensor -> file
  std::vector<std::string> files;
  for (const auto& [name, file] : map->members) {
    if (file.kind != JsonValue::String || file.text.empty() ||
        file.text.find('/') != std::string::npos || file.text[0] == '.')
      return at(index, file.offset) + "weight_map[\"" + name + "\"] must be a file name in " +
             "the directory (no '/', not starting with '.')";
    where[name] = file.text;
    if (std::find(files.begin(), files.end(), file.text) == files.end()) files.push_back(file.text);
  }
  for (const std::string& f : files) {
    const size_t before = set->files.size();
    err = safetensors_open_file(dir + "/" + f, set);
    if (!err.empty()) return err;
    for (const auto& [name, t] : set->tensors)
      if (t.file >= (int)before && where[name] != f)
        return dir + "/" + f + ": holds tensor \"" + name + "\", which " + index +
               (where.count(name) ? " places in " + where[name] : std::string(" does not list"));
  }
  for (const auto& [name, f] : where)
    if (!set->tensors.count(name))
      return index + ": tensor \"" + name + "\" is listed in " + f + ", which does not hold it";
  return "";
}

std::string safetensors_open_dir(const std::string& dir, SafetensorsSet* set) {
  const std::string index = dir + "/model.safetensors.index.json";
  struct stat st;
  if (stat(index.c_str(), &st) == 0) return open_index(dir, index, set);
  const std::string single = dir + "/model.safetensors";
  if (stat(single.c_str(), &st) != 0)
    return dir + " holds neither model.safetensors nor model.safetensors.index.json";
  return safetensors_open_file(single, set);
}

void safetensors_close(SafetensorsSet& set) {
  for (SafetensorsFile& f : set.files)
    if (f.fd >= 0) close(f.fd), f.fd = -1;
}

std::string safetensors_read(const SafetensorsSet& set, const std::string& name, size_t first,
                             size_t count, float* dst) {
  auto it = set.tensors.find(name);
  if (it == set.tensors.end()) return "no tensor \"" + name + "\"";
  const SafetensorsTensor& t = it->second;
  const SafetensorsFile& f = set.files[t.file];
  if (first + count > t.numel()) BUG("read past the end of %s", name.c_str());
  const size_t elem = t.dtype == "F32" ? 4 : t.dtype == "BF16" ? 2 : 0;
  if (elem == 0) return f.path + ": tensor \"" + name + "\" is " + t.dtype + ", not F32 or BF16";
  // BF16 is read into the upper half of dst's bytes and widened forward in place: float i ends
  // at byte 4i + 4 <= 2 count + 2i + 2, where bf16 value i + 1 starts, so nothing unread is
  // overwritten, and no second buffer is needed however large the tensor.
  char* buf = (char*)dst + (elem == 2 ? 2 * count : 0);
  const size_t bytes = count * elem;
  for (size_t done = 0; done < bytes;) {  // pread may return less than asked for
    const ssize_t got = pread(f.fd, buf + done, bytes - done, (off_t)(t.begin + first * elem + done));
    if (got <= 0) return f.path + ": short read of tensor \"" + name + "\"";
    done += (size_t)got;
  }
  for (size_t i = 0; elem == 2 && i < count; i++) {
    uint16_t h;
    std::memcpy(&h, buf + 2 * i, 2);
    const float v = bf16_to_f32(h);
    std::memcpy((char*)dst + 4 * i, &v, 4);
  }
  return "";
}

std::string safetensors_write(const std::string& path, const std::vector<SafetensorsOut>& tensors) {
  std::string header = "{", data;
  for (const SafetensorsOut& t : tensors) {
    const size_t begin = data.size();
    for (float v : t.values) {
      if (t.dtype == "BF16") {
        const uint16_t h = f32_to_bf16(v);
        data.append((const char*)&h, 2);
      } else {
        data.append((const char*)&v, 4);
      }
    }
    std::string shape;
    for (int64_t d : t.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    header += (header.size() > 1 ? "," : "") + std::string("\"") + t.name + "\":{\"dtype\":\"" +
              t.dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(begin) + "," + std::to_string(data.size()) + "]}";
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return path + ": cannot create: " + std::strerror(errno);
  const uint64_t n = header.size();
  bool ok = std::fwrite(&n, 8, 1, f) == 1 && std::fwrite(header.data(), 1, n, f) == n &&
            std::fwrite(data.data(), 1, data.size(), f) == data.size();
  ok &= std::fclose(f) == 0;
  return ok ? "" : path + ": write failed";
}
