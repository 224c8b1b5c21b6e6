/* A race-detecting stand-in for libcudart: the CUDA runtime of backend `sim`, and of the CPU tests
 * of the ctypes layer (runtime/cudart.py) and of fdac_d2h_batch (copy_batch.cc). Written for this
 * project's tests from the CUDA runtime's documented semantics; not NVIDIA code.
 *
 * Device memory is host memory and the device never runs on its own:
 * - a device-to-host cudaMemcpyAsync (or a copy of cudaMemcpyBatchAsync) snapshots its source when
 *   issued (stream order: the replica's device ops run when called), fills the destination with
 *   poison (per fake_set_kind: a bool inverted, a float NaN, an integer -7777; else 0xA5 bytes) and
 *   is *pending*; it lands (the snapshot is written) only when a wait covers it:
 *   cudaEventSynchronize of an event recorded after it on its stream, cudaStreamSynchronize of that
 *   stream, cudaDeviceSynchronize - or, with fake_random_landing set, a random prefix of each
 *   stream's pending copies lands at every later call (a device that ran ahead);
 * - cudaEventQuery reports the truth (600 while a copy it covers is pending) and lands nothing;
 * - a host-to-device copy lands at once (the next device op, run when called, sees it).
 * It reports, with an error code the Python layer turns into an exception (fake_error_text says what;
 * fake_errors counts them, also those a caller swallowed):
 * - 9001: a host read (fake_check_read, called by the backend's one read accessor) of bytes a
 *   pending copy still writes - a read before its covering event completed;
 * - 9002: a copy into bytes a pending copy on another stream still writes, with no ordering
 *   between the two (a wait covering the first) - which lands last is then up to the hardware;
 * - 9003: cudaFreeHost of an allocation a pending copy still writes (a free with a copy in flight);
 * - 9004: fake_report_reuse: a copy set about to overwrite a destination its reader still holds
 *   (reference counts are Python's: the ring reports it here, so every race lands in one place).
 * cudaStreamWaitEvent orders, as on a device: the stream's later copies and records run after the
 * event's work (transitively), so a copy it orders is no 9002, a wait covering the later work lands
 * the earlier first, and nothing lands when it is called.
 * Current stream: fake_current_stream() answers kStreamA, or stream number fake_stream_index (a
 * test moves it between steps: FD 2.5 may change streams under a stream guard); with
 * fake_stream_switch set it alternates between kStreamA and kStreamB from one call to the next.
 * fake_immediate set: every copy lands when issued and nothing is checked (a runtime whose calls cost
 * nothing, for benchmarks/host_cost_local.py).
 * Every copy, record and batch call is logged (fake_log) and a call can be made to fail
 * (fake_fail_*). Compiled with -DFAKE_BATCH_ABI=13 or 12 it has cudaMemcpyBatchAsync with CUDA 13's
 * or 12.8's signature (and reports that runtime version); without, none (as CUDA before 12.8).
 * Thread-safe: ctypes drops the GIL around every call, so FD's output thread calls in concurrently. */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <unordered_map>
#include <vector>

namespace {
struct Alloc { uintptr_t ptr; size_t nbytes; int itemsize; char kind; };
struct Pending { uintptr_t dst; size_t nbytes; uintptr_t stream; uint64_t seq; std::vector<unsigned char> data; };
/* A cudaStreamWaitEvent: the stream's work after position `at` runs after `other`'s up to `upto`. */
struct Wait { uint64_t at; uintptr_t other; uint64_t upto; };
struct Stream { uintptr_t handle; uint64_t issued; std::vector<Wait> waits; };
struct Event { uintptr_t stream; uint64_t seq; bool recorded; };
typedef std::unordered_map<uintptr_t, uint64_t> Reach;  /* stream -> its work up to this position */
std::recursive_mutex mu;
std::vector<Alloc> allocs;
std::vector<Pending> pending;  // in issue order
std::vector<Stream> streams;
std::unordered_map<uintptr_t, Event> events;  // by handle (a handle never created is made on first record)
uintptr_t next_event = 0;
std::mt19937_64 rng;
const uintptr_t kStreamA = 0x5100, kStreamB = 0x5200;
const int kRead = 9001, kUnordered = 9002, kFreeInFlight = 9003, kReuse = 9004;
}  // namespace

extern "C" {
#define FAKE_LOG 256
/* kind 1: copy (dst, src, nbytes, stream), kind 2: record (event, stream), kind 3: a batch call
 * (count, 0, 0, stream), logged before its copies */
struct fake_entry { int kind; uintptr_t a, b, c, stream; };
struct fake_entry fake_log[FAKE_LOG];
int fake_log_size = 0;
int fake_fail_copy = -1;   /* fail the copy with this index in the log's order of copies (-1: none) */
int fake_fail_record = 0;  /* fail every record */
int fake_copies = 0;
int fake_errors = 0;       /* races reported so far (9001-9004) */
int fake_allocations = 0, fake_frees = 0;
int fake_events = 0, fake_blocking_events = 0;  /* events created; those with cudaEventBlockingSync */
int fake_stream_switch = 0;
int fake_stream_index = 0;  /* the current stream when fake_stream_switch is 0: kStreamA + 0x100 * index */
int fake_stream_waits = 0;  /* cudaStreamWaitEvent calls that ordered something */
int fake_random_landing = 0;
int fake_immediate = 0;  /* 1: a D2H copy lands when issued (no checks; benchmarks/host_cost_local.py) */
char fake_error_text[1024] = "";

static void note(int kind, uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t stream) {
  if (fake_log_size < FAKE_LOG) {
    struct fake_entry e = {kind, a, b, c, stream};
    fake_log[fake_log_size++] = e;
  }
}

static int report(int code, const char* what, uintptr_t ptr, size_t nbytes, uintptr_t stream) {
  std::snprintf(fake_error_text, sizeof fake_error_text, "%s [%#lx, +%zu) (stream %#lx)", what,
                (unsigned long)ptr, nbytes, (unsigned long)stream);
  ++fake_errors;
  return code;
}

static bool overlaps(const Pending& p, uintptr_t ptr, size_t nbytes) {
  return p.dst < ptr + nbytes && ptr < p.dst + p.nbytes;
}

static Stream& stream_of(uintptr_t handle) {
  for (auto& s : streams)
    if (s.handle == handle) return s;
  streams.push_back({handle, 0, {}});
  return streams.back();
}

/* `stream`'s work up to `upto` and, through the cudaStreamWaitEvent calls it is ordered after
 * (transitively), the other streams' work it runs after. */
static Reach reach(uintptr_t stream, uint64_t upto) {
  Reach r{{stream, upto}};
  for (bool grew = true; grew;) {
    grew = false;
    for (auto& s : streams) {
      auto it = r.find(s.handle);
      if (it == r.end()) continue;
      for (auto& w : s.waits) {
        if (w.at > it->second) continue;
        uint64_t& have = r[w.other];
        if (w.upto > have) { have = w.upto; grew = true; }
        it = r.find(s.handle);  /* (r may have rehashed) */
      }
    }
  }
  return r;
}

static bool within(const Reach& r, const Pending& p) {
  auto it = r.find(p.stream);
  return it != r.end() && p.seq <= it->second;
}

/* Lands, in issue order, the pending copies of `stream` (all streams: any_stream) up to `upto`,
 * and first those of other streams that work runs after (cudaStreamWaitEvent). */
static void land(uintptr_t stream, uint64_t upto, bool any_stream) {
  Reach r = any_stream ? Reach{} : reach(stream, upto);
  std::vector<Pending> left;
  for (auto& p : pending) {
    if (any_stream || within(r, p))
      std::memcpy(reinterpret_cast<void*>(p.dst), p.data.data(), p.nbytes);
    else
      left.push_back(std::move(p));
  }
  pending.swap(left);
  if (pending.empty())
    for (auto& s : streams) s.waits.clear();  /* nothing left to order */
}

static void maybe_run_ahead() {
  if (!fake_random_landing) return;
  for (auto& s : streams) {
    uint64_t oldest = UINT64_MAX, newest = 0;
    for (auto& p : pending)
      if (p.stream == s.handle) {
        if (p.seq < oldest) oldest = p.seq;
        if (p.seq > newest) newest = p.seq;
      }
    if (newest) land(s.handle, oldest + rng() % (newest - oldest + 2) - 1, false);
  }
}

static const Alloc* alloc_of(uintptr_t ptr) {
  for (auto& a : allocs)
    if (a.ptr <= ptr && ptr < a.ptr + a.nbytes) return &a;
  return nullptr;
}

/* What a destination holds until its copy lands, computed from the bytes that will land. */
static void poison(uintptr_t dst, const unsigned char* src, size_t nbytes) {
  unsigned char* out = reinterpret_cast<unsigned char*>(dst);
  const Alloc* a = alloc_of(dst);
  int size = a ? a->itemsize : 1;
  char kind = a ? a->kind : 'x';
  for (size_t i = 0; i + size <= nbytes; i += size) {
    if (kind == 'b') {
      out[i] = src[i] ? 0 : 1;
    } else if (kind == 'f') {
      uint64_t nan = size == 2 ? 0x7E00u : size == 4 ? 0x7FC00000u : 0x7FF8000000000000ull;
      std::memcpy(out + i, &nan, size);
    } else if (kind == 'i' || kind == 'u') {
      int64_t v = -7777;
      std::memcpy(out + i, &v, size);
    } else {
      out[i] = 0xA5;
    }
  }
}

static int issue_d2h(void* dst, const void* src, size_t nbytes, void* stream) {
  if (fake_immediate) {
    std::memmove(dst, src, nbytes);
    return 0;
  }
  std::lock_guard<std::recursive_mutex> lock(mu);
  maybe_run_ahead();
  uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(stream);
  Reach before = reach(s, UINT64_MAX);  /* what this copy runs after */
  for (auto& p : pending)
    if (p.stream != s && overlaps(p, d, nbytes) && !within(before, p))
      return report(kUnordered, "a copy into bytes a pending copy on another stream still writes, with no wait "
                    "between them (which one lands last is up to the device)", d, nbytes, s);
  Pending p{d, nbytes, s, ++stream_of(s).issued, {}};
  p.data.assign(static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + nbytes);
  poison(d, p.data.data(), nbytes);
  pending.push_back(std::move(p));
  return 0;
}

int cudaHostAlloc(void** ptr, size_t nbytes, unsigned flags) {
  *ptr = std::malloc(nbytes);
  if (!*ptr) return 2;
  std::memset(*ptr, 0xA5, nbytes);
  std::lock_guard<std::recursive_mutex> lock(mu);
  allocs.push_back({reinterpret_cast<uintptr_t>(*ptr), nbytes, 1, 'x'});
  ++fake_allocations;
  return 0;
}

int cudaFreeHost(void* ptr) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  for (size_t i = 0; i < allocs.size(); ++i) {
    if (allocs[i].ptr != p) continue;
    for (auto& q : pending)
      if (overlaps(q, p, allocs[i].nbytes))
        return report(kFreeInFlight, "cudaFreeHost of an allocation a pending copy still writes", q.dst, q.nbytes,
                      q.stream);
    allocs.erase(allocs.begin() + i);
    std::free(ptr);
    ++fake_frees;
    return 0;
  }
  return 1;  /* cudaErrorInvalidValue: not from cudaHostAlloc */
}

int cudaMemcpyAsync(void* dst, const void* src, size_t nbytes, int kind, void* stream) {
  if (fake_copies++ == fake_fail_copy) return 700;
  note(1, (uintptr_t)dst, (uintptr_t)src, nbytes, (uintptr_t)stream);
  if (kind == 2) return issue_d2h(dst, src, nbytes, stream);
  std::memmove(dst, src, nbytes);
  return 0;
}
int cudaMemcpy(void* dst, const void* src, size_t nbytes, int kind) { std::memmove(dst, src, nbytes); return 0; }
int cudaEventCreateWithFlags(void** event, unsigned flags) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  events[++next_event] = {0, 0, false};
  *event = reinterpret_cast<void*>(next_event);
  ++fake_events;
  fake_blocking_events += (flags & 1) != 0;
  return 0;
}
static Event* event_of(void* event) {
  return &events[reinterpret_cast<uintptr_t>(event)];
}
int cudaEventRecord(void* event, void* stream) {
  if (fake_fail_record) return 400;
  note(2, (uintptr_t)event, 0, 0, (uintptr_t)stream);
  std::lock_guard<std::recursive_mutex> lock(mu);
  maybe_run_ahead();
  Event* e = event_of(event);
  *e = {reinterpret_cast<uintptr_t>(stream), stream_of(reinterpret_cast<uintptr_t>(stream)).issued, true};
  return 0;
}
int cudaEventQuery(void* event) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  maybe_run_ahead();
  Event* e = event_of(event);
  if (!e->recorded) return 0;
  Reach r = reach(e->stream, e->seq);
  for (auto& p : pending)
    if (within(r, p)) return 600;
  return 0;
}
int cudaEventSynchronize(void* event) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  Event* e = event_of(event);
  if (e->recorded) land(e->stream, e->seq, false);
  return 0;
}
int cudaEventDestroy(void* event) { return 0; }
/* The stream's later work (copies, records) runs after the event's: no host wait, nothing lands. */
int cudaStreamWaitEvent(void* stream, void* event, unsigned flags) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  maybe_run_ahead();
  Event* e = event_of(event);
  if (!e->recorded) return 0;
  Stream& s = stream_of(reinterpret_cast<uintptr_t>(stream));
  s.waits.push_back({++s.issued, e->stream, e->seq});
  ++fake_stream_waits;
  return 0;
}
int cudaStreamSynchronize(void* stream) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  land(reinterpret_cast<uintptr_t>(stream), UINT64_MAX, false);
  return 0;
}
int cudaDeviceSynchronize(void) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  land(0, UINT64_MAX, true);
  return 0;
}
int cudaGetDevice(int* device) { *device = 0; return 0; }
int cudaSetDevice(int device) { return 0; }
int cudaGetDeviceCount(int* count) { *count = 1; return 0; }
int cudaPointerGetAttributes(void* attributes, const void* ptr) { std::memset(attributes, 0, 88); return 0; }
#if defined(FAKE_BATCH_ABI) && FAKE_BATCH_ABI == 12
int fake_runtime_version = 12080;
#else
int fake_runtime_version = 13000;
#endif
int cudaRuntimeGetVersion(int* version) { *version = fake_runtime_version; return 0; }
int cudaDriverGetVersion(int* version) { *version = 13000; return 0; }
int cudaGetLastError(void) { return 0; }
const char* cudaGetErrorString(int code) { return code > 9000 ? fake_error_text : "fake error"; }

/* -- the simulator's own calls (backend sim, tests) ------------------------------------------- */
/* The element kind of a pinned allocation ('b', 'f', 'i', 'u'; itemsize bytes): its poison. */
void fake_set_kind(void* ptr, int itemsize, char kind) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  for (auto& a : allocs)
    if (a.ptr == reinterpret_cast<uintptr_t>(ptr)) {
      a.itemsize = itemsize > 0 ? itemsize : 1;
      a.kind = kind;
      std::vector<unsigned char> zeros(a.nbytes, 0);
      poison(a.ptr, zeros.data(), a.nbytes);
    }
}
/* 0, or 9001 (reported) when a pending copy still writes a byte of [ptr, ptr + nbytes). */
int fake_check_read(const void* ptr, size_t nbytes) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  for (auto& q : pending)
    if (overlaps(q, p, nbytes))
      return report(kRead, "a host read of bytes a pending copy still writes (before its covering event completed)",
                    p, nbytes, q.stream);
  return 0;
}
/* Pending copies writing a byte of [ptr, ptr + nbytes). */
int fake_pending(const void* ptr, size_t nbytes) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  int n = 0;
  for (auto& q : pending) n += overlaps(q, reinterpret_cast<uintptr_t>(ptr), nbytes);
  return n;
}
int fake_report_reuse(const void* ptr, size_t nbytes) {
  return report(kReuse, "a copy set chose a destination its reader still references", reinterpret_cast<uintptr_t>(ptr),
                nbytes, 0);
}
void fake_seed(unsigned long long seed) { std::lock_guard<std::recursive_mutex> lock(mu); rng.seed(seed); }
void* fake_current_stream(void) {
  static int calls = 0;
  std::lock_guard<std::recursive_mutex> lock(mu);
  if (fake_stream_switch) return reinterpret_cast<void*>((calls++ & 1) ? kStreamB : kStreamA);
  return reinterpret_cast<void*>(kStreamA + 0x100 * static_cast<uintptr_t>(fake_stream_index));
}

#ifdef FAKE_BATCH_ABI
int fake_batch_calls = 0;
int fake_fail_batch = 0;   /* fail every batch call (nothing copied) */
int fake_batch_mode = 0;   /* 1: a broken batch that reports success and copies nothing */
/* struct cudaMemcpyAttributes: srcAccessOrder, two {type, id} hints, flags */
struct fake_attributes { int order, src_type, src_id, dst_type, dst_id; unsigned flags; };

static int fake_batch(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                      struct fake_attributes* attrs, size_t* attrs_idxs, size_t num_attrs, void* stream) {
  size_t i;
  fake_batch_calls++;
  if (fake_fail_batch) return 700;
  /* what CUDA validates: stream-ordered sources, one attribute for all, not the legacy stream */
  if (count == 0 || num_attrs != 1 || attrs_idxs[0] != 0 || attrs->order != 1 || stream == 0 || stream == (void*)1)
    return 1;
  note(3, count, 0, 0, (uintptr_t)stream);
  for (i = 0; i < count && fake_batch_mode != 1; ++i) {
    note(1, (uintptr_t)dsts[i], (uintptr_t)srcs[i], sizes[i], (uintptr_t)stream);
    int code = issue_d2h(dsts[i], srcs[i], sizes[i], stream);
    if (code) return code;
  }
  return 0;
}

#if FAKE_BATCH_ABI == 12
int cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                         struct fake_attributes* attrs, size_t* attrs_idxs, size_t num_attrs, size_t* fail_idx,
                         void* stream) {
  int code = fake_batch(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream);
  if (code) *fail_idx = 0;
  return code;
}
#else
int cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                         struct fake_attributes* attrs, size_t* attrs_idxs, size_t num_attrs, void* stream) {
  return fake_batch(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream);
}
#endif
#endif
}  // extern "C"
