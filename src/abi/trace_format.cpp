// SPDX-License-Identifier: Apache-2.0
// Encoding and decoding of the trace format (trace_format.h). One table says which keys a
// call carries; the encoder and the decoder both walk it, so they cannot drift apart.
#include "trace_format.h"

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

namespace mesh {
namespace trace {
namespace {

const char* const kCallNames[] = {
    "init",  "finalize", "devices", "props", "listen",     "connect",    "accept",
    "regmr", "deregmr",  "isend",   "irecv", "iflush",     "test",       "close-send",
    "close-recv", "close-listen", "getdevicemr", "irecvconsumed", "setnetattr",
};
constexpr int kCalls = static_cast<int>(sizeof(kCallNames) / sizeof(kCallNames[0]));
static_assert(kCalls == static_cast<int>(Call::SetNetAttr) + 1, "a name per call");

// What a key fills in a Record.
enum class Field : uint8_t {
  Api, Result, Ctx, CommId, Tc, Dev, N, Handle, Comm, Obj, Mh, Off, Size, Tag, Type, Dmabuf, Done,
  Sizes, Repeats, Ndev, MaxRecvs, Ptr, Speed, Name,
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

struct Key {
  std::string name;
  Field field;
  bool required;
};

struct CallSpec {
  std::vector<Key> keys;  // in the order they are written
  bool singleBuffer;      // isend/regmr: one buffer, no n=
};

// Per call: its keys in order ('?': optional, written when not the default, read as the
// default when absent), and which key names the object the call returned or is about
// (Record::obj; the other comm keys s=, c=, l=, comm= are the comm argument).
struct CallKeys {
  const char* keys;
  const char* obj;
};
const CallKeys kCallKeys[] = {
    {"v ctx? commid? tc? r", ""},                      // init
    {"v ctx? r", ""},                                   // finalize
    {"v r ndev", ""},                                   // devices
    {"v dev r maxrecvs? ptr? speed? name?", ""},        // props
    {"v ctx? dev r l h?", "l"},                         // listen
    {"v ctx? dev h tc? r s nulls?", "s"},               // connect
    {"v l r c nulls?", "c"},                            // accept
    {"v comm size type dmabuf? r m", "m"},              // regmr
    {"v comm m r", "m"},                                // deregmr
    {"v s m off size tag r req nulls?", "req"},         // isend
    {"v c n m off size tag r req nulls?", "req"},       // irecv
    {"v c n m off size r req", "req"},                  // iflush
    {"v req r done sizes? polls?", "req"},              // test
    {"v s r", ""},                                      // close-send
    {"v c r", ""},                                      // close-recv
    {"v l r", ""},                                      // close-listen
    {"v comm m r", "m"},                                // getdevicemr
    {"v c n req r", "req"},                             // irecvconsumed
    {"v ctx? r again?", ""},                            // setnetattr
};
static_assert(sizeof(kCallKeys) / sizeof(kCallKeys[0]) == kCalls, "keys for every call");

Field fieldOf(const std::string& key, const std::string& obj) {
  static const std::map<std::string, Field> kFields = {
      {"v", Field::Api},        {"r", Field::Result},         {"ctx", Field::Ctx},     {"commid", Field::CommId},
      {"tc", Field::Tc},        {"dev", Field::Dev},          {"n", Field::N},         {"h", Field::Handle},
      {"s", Field::Comm},       {"c", Field::Comm},           {"l", Field::Comm},      {"comm", Field::Comm},
      {"m", Field::Mh},         {"off", Field::Off},          {"size", Field::Size},   {"tag", Field::Tag},
      {"type", Field::Type},    {"dmabuf", Field::Dmabuf},    {"done", Field::Done},   {"sizes", Field::Sizes},
      {"nulls", Field::Repeats}, {"polls", Field::Repeats},   {"ndev", Field::Ndev},   {"maxrecvs", Field::MaxRecvs},
      {"ptr", Field::Ptr},      {"speed", Field::Speed},      {"name", Field::Name},   {"req", Field::Obj},
      {"again", Field::Repeats},
  };
  return key == obj ? Field::Obj : kFields.at(key);
}

const std::vector<CallSpec>& specs() {
  static const std::vector<CallSpec> kSpecs = [] {
    std::vector<CallSpec> out;
    for (int c = 0; c < kCalls; ++c) {
      CallSpec spec;
      std::string obj = kCallKeys[c].obj;
      for (std::string k : split(kCallKeys[c].keys, ' ')) {
        bool optional = k.back() == '?';
        if (optional) k.pop_back();
        spec.keys.push_back(Key{k, fieldOf(k, obj), !optional});
      }
      spec.singleBuffer = c == static_cast<int>(Call::Isend) || c == static_cast<int>(Call::RegMr);
      out.push_back(spec);
    }
    return out;
  }();
  return kSpecs;
}

// --- encoding -------------------------------------------------------------------------------

class LineWriter {
 public:
  LineWriter(char* buf, size_t cap) : buf_(buf), cap_(cap) {}
  void text(const char* s) {
    for (; *s != '\0'; ++s) put(*s);
  }
  void printf(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    if (!ok_) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf_ + len_, cap_ - len_, fmt, ap);
    va_end(ap);
    if (n < 0 || static_cast<size_t>(n) >= cap_ - len_) {
      ok_ = false;
      return;
    }
    len_ += static_cast<size_t>(n);
  }
  void put(char c) {
    if (!ok_ || len_ + 1 >= cap_) {
      ok_ = false;
      return;
    }
    buf_[len_++] = c;
  }
  size_t finish() {
    put('\n');
    return ok_ ? len_ : 0;
  }

 private:
  char* buf_;
  size_t cap_;
  size_t len_ = 0;
  bool ok_ = true;
};

bool isDefault(const Record& r, Field f) {
  switch (f) {
    case Field::Ctx: return r.ctx == 0;
    case Field::CommId: return r.commId == 0;
    case Field::Tc: return r.trafficClass == -1;
    case Field::Handle: return !r.hasHandle;
    case Field::Dmabuf: return !r.dmabuf;
    case Field::Sizes: return r.nsizes == 0;
    case Field::Repeats: return r.repeats == 0;
    case Field::MaxRecvs: return r.maxRecvs == 0;
    case Field::Ptr: return r.ptrSupport == 0;
    case Field::Speed: return r.speed == 0;
    case Field::Name: return r.name.empty();
    default: return false;
  }
}

bool needsEscape(char c) {
  auto u = static_cast<unsigned char>(c);
  return u < 0x21 || u > 0x7e || c == '%' || c == '=' || c == ',';
}

void writeValue(LineWriter& w, const Record& r, Field f, int n) {
  switch (f) {
    case Field::Api: w.printf("%d", r.api); break;
    case Field::Result: w.printf("%d", r.result); break;
    case Field::Ctx: w.printf("%" PRIu64, r.ctx); break;
    case Field::CommId: w.printf("%" PRIx64, r.commId); break;
    case Field::Tc: w.printf("%d", r.trafficClass); break;
    case Field::Dev: w.printf("%d", r.dev); break;
    case Field::N: w.printf("%d", r.n); break;
    case Field::Handle: w.printf("%016" PRIx64, r.handle); break;
    case Field::Comm: w.printf("%" PRIu64, r.comm); break;
    case Field::Obj: w.printf("%" PRIu64, r.obj); break;
    case Field::Type: w.printf("%d", r.type); break;
    case Field::Dmabuf: w.printf("%d", r.dmabuf ? 1 : 0); break;
    case Field::Done: w.printf("%d", r.done); break;
    case Field::Repeats: w.printf("%" PRIu64, r.repeats); break;
    case Field::Ndev: w.printf("%d", r.ndev); break;
    case Field::MaxRecvs: w.printf("%d", r.maxRecvs); break;
    case Field::Ptr: w.printf("%d", r.ptrSupport); break;
    case Field::Speed: w.printf("%d", r.speed); break;
    case Field::Name: w.text(escape(r.name).c_str()); break;
    case Field::Mh:
    case Field::Off:
    case Field::Size:
    case Field::Tag:
    case Field::Sizes:
      for (int i = 0; i < n; ++i) {
        if (i > 0) w.put(',');
        if (f == Field::Mh) w.printf("%" PRIu64, r.mh[i]);
        if (f == Field::Off) w.printf("%" PRId64, r.off[i]);
        if (f == Field::Size) w.printf("%" PRIu64, r.size[i]);
        if (f == Field::Tag) w.printf("%d", r.tag[i]);
        if (f == Field::Sizes) w.printf("%" PRId64, r.sizes[i]);
      }
      break;
  }
}

// --- decoding -------------------------------------------------------------------------------

bool parseU64(const std::string& s, int base, uint64_t* out) {
  if (s.empty() || s.size() > 20 || s[0] == '-' || s[0] == '+' || s[0] == ' ') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(s.c_str(), &end, base);
  if (errno != 0 || end == nullptr || *end != '\0') return false;
  *out = v;
  return true;
}

bool parseI64(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 21 || s[0] == '+' || s[0] == ' ') return false;
  errno = 0;
  char* end = nullptr;
  long long v = strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == nullptr || *end != '\0') return false;
  *out = v;
  return true;
}

bool parseInt(const std::string& s, int* out) {
  int64_t v = 0;
  if (!parseI64(s, &v) || v < INT32_MIN || v > INT32_MAX) return false;
  *out = static_cast<int>(v);
  return true;
}

// A comma list of at most kMaxBuffers numbers into one of the Record's arrays.
bool readList(const std::string& value, Field f, Record* r, int* count) {
  std::vector<std::string> items = split(value, ',');
  if (items.size() > static_cast<size_t>(kMaxBuffers)) return false;
  for (size_t i = 0; i < items.size(); ++i) {
    int64_t v = 0;
    if (!parseI64(items[i], &v)) return false;
    if (f == Field::Mh || f == Field::Size) {
      if (v < 0) return false;
      (f == Field::Mh ? r->mh : r->size)[i] = static_cast<uint64_t>(v);
    } else if (f == Field::Off) {
      r->off[i] = v;
    } else if (f == Field::Tag) {
      if (v < INT32_MIN || v > INT32_MAX) return false;
      r->tag[i] = static_cast<int>(v);
    } else {
      r->sizes[i] = v;
    }
  }
  *count = static_cast<int>(items.size());
  return true;
}

bool readValue(const std::string& value, Field f, Record* r, int* listCount) {
  uint64_t u = 0;
  switch (f) {
    case Field::Api: return parseInt(value, &r->api) && r->api >= 8 && r->api <= 12;
    case Field::Result: return parseInt(value, &r->result);
    case Field::Ctx: return parseU64(value, 10, &r->ctx);
    case Field::CommId: return parseU64(value, 16, &r->commId);
    case Field::Tc: return parseInt(value, &r->trafficClass);
    case Field::Dev: return parseInt(value, &r->dev);
    case Field::N: return parseInt(value, &r->n) && r->n >= 0 && r->n <= kMaxBuffers;
    case Field::Handle:
      r->hasHandle = true;
      return parseU64(value, 16, &r->handle);
    case Field::Comm: return parseU64(value, 10, &r->comm);
    case Field::Obj: return parseU64(value, 10, &r->obj);
    case Field::Type: return parseInt(value, &r->type);
    case Field::Dmabuf:
      if (!parseU64(value, 10, &u) || u > 1) return false;
      r->dmabuf = u == 1;
      return true;
    case Field::Done: return parseInt(value, &r->done) && (r->done == 0 || r->done == 1);
    case Field::Repeats: return parseU64(value, 10, &r->repeats);
    case Field::Ndev: return parseInt(value, &r->ndev);
    case Field::MaxRecvs: return parseInt(value, &r->maxRecvs);
    case Field::Ptr: return parseInt(value, &r->ptrSupport);
    case Field::Speed: return parseInt(value, &r->speed);
    case Field::Name: return unescape(value, &r->name);
    case Field::Sizes: return readList(value, f, r, &r->nsizes);
    case Field::Mh:
    case Field::Off:
    case Field::Size:
    case Field::Tag: return readList(value, f, r, listCount);
  }
  return false;
}

}  // namespace

const char* callName(Call call) {
  int i = static_cast<int>(call);
  return i >= 0 && i < kCalls ? kCallNames[i] : "?";
}

bool callFromName(const std::string& name, Call* out) {
  for (int i = 0; i < kCalls; ++i) {
    if (name == kCallNames[i]) {
      *out = static_cast<Call>(i);
      return true;
    }
  }
  return false;
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (!needsEscape(c)) {
      out.push_back(c);
      continue;
    }
    char hex[4];
    snprintf(hex, sizeof(hex), "%%%02X", static_cast<unsigned char>(c));
    out += hex;
  }
  return out;
}

bool unescape(const std::string& text, std::string* out) {
  std::string s;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      s.push_back(text[i]);
      continue;
    }
    uint64_t v = 0;
    if (i + 2 >= text.size() || !parseU64(text.substr(i + 1, 2), 16, &v)) return false;
    s.push_back(static_cast<char>(v));
    i += 2;
  }
  *out = s;
  return true;
}

std::string encodeHeader(const Header& h) {
  std::string out = "nccl-mesh-trace " + std::to_string(kFormatVersion) + "\n";
  out += "host " + escape(h.host) + "\n";
  out += "pid " + std::to_string(h.pid) + "\n";
  out += "t0 " + std::to_string(h.t0Ns) + "\n";
  out += "plugin " + escape(h.plugin) + "\n";
  if (!h.nccl.empty()) out += "nccl " + escape(h.nccl) + "\n";
  out += "addr";
  for (const std::string& a : h.addrs) out += " " + escape(a);
  out += "\n";
  // NAME=VALUE with the value escaped: '=' in a value stays unambiguous.
  auto assignment = [](const std::string& kv) {
    size_t eq = kv.find('=');
    return eq == std::string::npos ? escape(kv) : escape(kv.substr(0, eq)) + "=" + escape(kv.substr(eq + 1));
  };
  for (const std::string& s : h.settings) out += "setting " + assignment(s) + "\n";
  for (const std::string& e : h.env) out += "env " + assignment(e) + "\n";
  out += "records\n";
  return out;
}

size_t encodeRecord(const Record& r, char* buf, size_t cap) {
  int ci = static_cast<int>(r.call);
  if (ci < 0 || ci >= kCalls || r.n < 0 || r.n > kMaxBuffers || r.nsizes < 0 || r.nsizes > kMaxBuffers) {
    return 0;
  }
  const CallSpec& spec = specs()[static_cast<size_t>(ci)];
  int n = spec.singleBuffer ? 1 : r.n;
  LineWriter w(buf, cap);
  w.printf("%" PRIu64 " %" PRIu64 " %u %s", r.seq, r.tUs, r.thread, kCallNames[ci]);
  for (const Key& k : spec.keys) {
    if (!k.required && isDefault(r, k.field)) continue;
    w.printf(" %s=", k.name.c_str());
    writeValue(w, r, k.field, k.field == Field::Sizes ? r.nsizes : n);
  }
  return w.finish();
}

bool decodeRecord(const std::string& line, Record* out, std::string* error) {
  std::vector<std::string> tok = split(line, ' ');
  Record r;
  if (tok.size() < 4) {
    *error = "a record has at least 4 fields (seq, time, thread, call)";
    return false;
  }
  uint64_t thread = 0;
  if (!parseU64(tok[0], 10, &r.seq) || !parseU64(tok[1], 10, &r.tUs) || !parseU64(tok[2], 10, &thread) ||
      thread == 0 || thread > UINT32_MAX) {
    *error = "bad sequence number, time or thread id in '" + tok[0] + " " + tok[1] + " " + tok[2] + "'";
    return false;
  }
  r.thread = static_cast<uint32_t>(thread);
  if (!callFromName(tok[3], &r.call)) {
    *error = "unknown call '" + tok[3] + "'";
    return false;
  }
  const CallSpec& spec = specs()[static_cast<size_t>(r.call)];
  std::vector<bool> seen(spec.keys.size(), false);
  int listCount = -1;
  for (size_t i = 4; i < tok.size(); ++i) {
    size_t eq = tok[i].find('=');
    if (eq == std::string::npos || eq == 0) {
      *error = "'" + tok[i] + "' is not key=value";
      return false;
    }
    std::string key = tok[i].substr(0, eq);
    std::string value = tok[i].substr(eq + 1);
    for (size_t k = 0; k < spec.keys.size(); ++k) {
      if (key != spec.keys[k].name) continue;  // keys a later version adds are skipped
      int count = -1;
      if (seen[k] || !readValue(value, spec.keys[k].field, &r, &count)) {
        *error = std::string(seen[k] ? "repeated " : "bad value of ") + key + " in " + tok[3];
        return false;
      }
      seen[k] = true;
      if (count >= 0 && listCount >= 0 && count != listCount) {
        *error = "the lists of " + tok[3] + " have different lengths";
        return false;
      }
      if (count >= 0) listCount = count;
    }
  }
  for (size_t k = 0; k < spec.keys.size(); ++k) {
    if (spec.keys[k].required && !seen[k]) {
      *error = std::string(tok[3]) + " without " + spec.keys[k].name + "=";
      return false;
    }
  }
  if (spec.singleBuffer) r.n = 1;
  if (listCount >= 0 && listCount != r.n) {
    *error = tok[3] + ": n=" + std::to_string(r.n) + " but " + std::to_string(listCount) + " buffers listed";
    return false;
  }
  *out = r;
  return true;
}

namespace {

bool parseHeaderLine(const std::string& key, const std::string& rest, Header* h, std::string* error) {
  std::string value;
  if (key == "addr") {
    for (const std::string& a : split(rest, ' ')) {
      if (a.empty()) continue;
      if (!unescape(a, &value)) return (*error = "bad address '" + a + "'", false);
      h->addrs.push_back(value);
    }
    return true;
  }
  if (!unescape(rest, &value)) return (*error = "bad escape in the " + key + " line", false);
  uint64_t u = 0;
  if (key == "host") {
    h->host = value;
  } else if (key == "pid") {
    if (!parseU64(value, 10, &u)) return (*error = "bad pid '" + value + "'", false);
    h->pid = static_cast<long>(u);
  } else if (key == "t0") {
    if (!parseU64(value, 10, &h->t0Ns)) return (*error = "bad t0 '" + value + "'", false);
  } else if (key == "plugin") {
    h->plugin = value;
  } else if (key == "nccl") {
    h->nccl = value;
  } else if (key == "setting" || key == "env") {
    if (value.find('=') == std::string::npos) return (*error = key + " without NAME=VALUE", false);
    (key == "setting" ? h->settings : h->env).push_back(value);
  }  // other header keys (from a later version) are skipped
  return true;
}

}  // namespace

bool parseTrace(const std::string& text, Trace* out, std::string* error) {
  Trace t;
  std::vector<std::string> lines = split(text, '\n');
  // The magic first: a file that is not a trace says so, whatever else is wrong with it.
  const std::string magic = "nccl-mesh-trace " + std::to_string(kFormatVersion);
  if (text.empty()) return (*error = "empty file (not a trace)", false);
  if (lines[0] != magic) {
    *error = lines[0].rfind("nccl-mesh-trace ", 0) == 0
                 ? "line 1: format '" + lines[0].substr(0, 40) + "' is not version " + std::to_string(kFormatVersion) +
                       " (this build reads version " + std::to_string(kFormatVersion) + ")"
                 : "line 1: not an nccl-mesh trace (no 'nccl-mesh-trace' magic)";
    return false;
  }
  // A complete file ends with '\n': split() then leaves one empty string at the end.
  if (lines.back() != "") {
    *error = "line " + std::to_string(lines.size()) +
             ": truncated (the file does not end with a newline: the recording process died while writing it?)";
    return false;
  }
  lines.pop_back();
  size_t i = 1;
  bool inRecords = false;
  for (; i < lines.size() && !inRecords; ++i) {
    const std::string& l = lines[i];
    size_t sp = l.find(' ');
    std::string key = l.substr(0, sp);
    if (key == "records") {
      inRecords = true;
      continue;
    }
    if (!parseHeaderLine(key, sp == std::string::npos ? "" : l.substr(sp + 1), &t.header, error)) {
      *error = "line " + std::to_string(i + 1) + ": " + *error;
      return false;
    }
  }
  if (!inRecords) {
    *error = "line " + std::to_string(lines.size()) + ": the header never ends (no 'records' line): truncated";
    return false;
  }
  bool ended = false;
  for (; i < lines.size(); ++i) {
    if (lines[i].rfind("end", 0) == 0 && (lines[i].size() == 3 || lines[i][3] == ' ')) {
      t.endReason = lines[i].size() > 4 ? lines[i].substr(4) : "end";
      if (t.endReason == "exit") t.endReason.clear();  // the recording ran to the end
      if (i + 1 != lines.size()) return (*error = "line " + std::to_string(i + 2) + ": data after 'end'", false);
      ended = true;
      break;
    }
    Record r;
    std::string why;
    if (!decodeRecord(lines[i], &r, &why)) {
      *error = "line " + std::to_string(i + 1) + ": " + why;
      return false;
    }
    // The recorder numbers records as it writes them, 1, 2, 3...: a gap is a lost or edited
    // line, which would otherwise replay clean.
    uint64_t expected = t.records.empty() ? 1 : t.records.back().seq + 1;
    if (r.seq != expected) {
      *error = "line " + std::to_string(i + 1) + ": sequence number " + std::to_string(r.seq) + " where " +
               std::to_string(expected) + " belongs (a line lost or edited)";
      return false;
    }
    r.line = i + 1;
    t.records.push_back(std::move(r));
  }
  t.cut = !ended;
  *out = std::move(t);
  return true;
}

uint64_t handleKey(const void* handle, size_t size) {
  const auto* b = static_cast<const uint8_t*>(handle);
  // A mesh handle (handle_codec.h): magic "MESH" at 0, a random 64-bit token at 8.
  if (size >= 16 && b[0] == 'M' && b[1] == 'E' && b[2] == 'S' && b[3] == 'H') {
    uint64_t token = 0;
    memcpy(&token, b + 8, sizeof(token));
    return token;
  }
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < size; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

}  // namespace trace
}  // namespace mesh
