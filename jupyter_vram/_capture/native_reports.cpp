// jupyter_vram's light CPU recorder: the allocator's reports and the ranges around them,
// kept in flat arrays while the cell runs, with no Python per op.
//
// The CPU allocator reports every allocation and free to the "memory reporting" debug info of
// the thread that makes it (the hook torch's profiler uses). This library installs its own
// such reporter, and a RecordFunction callback that keeps, per thread, the op, autograd node
// and ranges open now, so each report gets its innermost aten op, the backward node's
// sequence number and the outermost op's span, and the module / optimizer / backward ranges
// become time points. jupyter_vram's Python side reads the arrays in chunks (jv_take) and
// gives each report its module and phase from those points, as it does for the profiler's
// event tree. A plain C API (ctypes): no Python headers, no pybind11.

#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <pthread.h>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// point kinds, as profiler_read numbers them
enum : int64_t { OPEN_MODULE = 0, CLOSE_MODULE = 1, OPEN_STEP = 2, CLOSE_STEP = 3,
                 BACKWARD = 4, FORWARD_OP = 5 };
// what a frame must do when its range ends
enum : int8_t { END_NONE = 0, END_MODULE = 1, END_STEP = 2, END_BACKWARD = 3 };

constexpr int REPORT_COLUMNS = 6;  // time, ptr, size, op, backward seq, span
constexpr int POINT_COLUMNS = 4;   // time, kind, value, end
constexpr int SPAN_COLUMNS = 2;    // start, end

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Frame {
  int32_t op;      // the op reports inside are charged to (0: none)
  int64_t bseq;    // the autograd node's sequence number (-2: not in backward)
  int64_t span;    // the outermost op's span slot (-1: none yet)
  int64_t point;   // this range's open point, whose end is set when it ends (-1: none)
  int64_t value;   // module id or optimizer name id, for the close point
  int64_t own_span;  // the span slot this frame opened (-1: none)
  int8_t end;
};

std::mutex g_mutex;  // guards the arrays and the name table
std::vector<int64_t> g_reports, g_points, g_spans;
int64_t g_span_base = 0;  // span slots taken before the current chunk
std::deque<std::string> g_names{""};
std::unordered_map<std::string, int32_t> g_name_ids{{"", 0}};
std::atomic<bool> g_active{false};
std::atomic<int64_t> g_generation{0};
at::CallbackHandle g_handle = 0;

// Steady steps (jv_mark, jv_steady): a loop's steps that allocate and free the same sizes in
// the same order. A step runs from one top-level module call to the next; a loop's pattern can
// take several (a model, then a loss module; micro-batches, then the optimizer step). Once the
// last P steps repeated the P before them (begun by the same modules), the rest are recorded
// as reports only (no RecordFunction callback: most of this library's cost), each checked
// against the pattern; the first report that differs is noted, and the Python side turns
// detail back on.
struct Step {
  std::vector<int64_t> sizes;  // sizes reported in it (up to kMaxStep)
  int64_t module = -1;         // the module call that began it
  bool whole = false;          // begun by a module call (not by the recording or detail resuming)
  bool long_ = false;          // made more than kMaxStep reports
  bool operator==(const Step& o) const {
    return whole && o.whole && !long_ && !o.long_ && module == o.module && sizes == o.sizes;
  }
};
constexpr size_t kMaxStep = 1 << 16;
constexpr size_t kMaxPeriod = 16;  // the longest pattern looked for, in steps
Step g_step;                        // the step now
std::deque<Step> g_history;         // the steps before it (up to 2 x kMaxPeriod)
std::vector<int64_t> g_template;  // steady: the sizes each step repeats
size_t g_template_at = 0;         // the next report's place in it
bool g_steady = false;
pthread_t g_steady_thread;
int64_t g_total = 0;  // reports made so far in this recording (the next one's index)
std::atomic<int64_t> g_diverged{-1};  // steady: the index of the first report that differed
// Python's own "a signal came" (PyErr_SetInterruptEx, safe from any thread, no GIL needed),
// found at run time: a divergence asks the recording thread's handler to put detail back at
// once, between the next two bytecodes (0: not found; the helper thread's ticks ask later)
int (*g_interrupt)(int) = nullptr;
int g_signal = 0;

// set when this thread's state is destroyed (thread exit): a free reported after that, by
// another thread-local's destructor, must not touch it
thread_local bool t_gone = false;

struct ThreadState {
  int64_t generation = -1;
  std::vector<Frame> stack;
  std::vector<std::pair<int64_t, int64_t>> modules;  // open module calls: (open point, id)
  std::unordered_map<const char*, std::pair<int32_t, const std::string*>> ids;
  ~ThreadState() { t_gone = true; }
};
thread_local ThreadState t_state;

ThreadState& state() {
  auto generation = g_generation.load(std::memory_order_relaxed);
  if (t_state.generation != generation) {  // a new recording: forget the last one's frames
    t_state.generation = generation;
    t_state.stack.clear();
    t_state.modules.clear();
  }
  return t_state;
}

int32_t intern(ThreadState& ts, const char* name) {
  auto it = ts.ids.find(name);
  if (it != ts.ids.end() && std::strcmp(it->second.second->c_str(), name) == 0) {
    return it->second.first;
  }
  std::lock_guard<std::mutex> guard(g_mutex);
  std::string key(name);
  auto found = g_name_ids.find(key);
  int32_t id;
  if (found == g_name_ids.end()) {
    id = static_cast<int32_t>(g_names.size());
    g_names.push_back(key);
    g_name_ids.emplace(std::move(key), id);
  } else {
    id = found->second;
  }
  ts.ids[name] = {id, &g_names[id]};
  return id;
}

// ops that only obtain memory for the op around them: the allocation is that op's
bool plumbing(const char* op) {
  static const char* const names[] = {"empty", "empty_strided", "empty_like", "new_empty",
                                      "new_empty_strided", "resize_", "as_strided"};
  for (const char* name : names) {
    if (std::strcmp(op, name) == 0) return true;
  }
  return false;
}

bool starts_with(const char* s, const char* prefix, size_t n) {
  return std::strncmp(s, prefix, n) == 0;
}

int64_t add_point(int64_t t, int64_t kind, int64_t value, int64_t end) {
  std::lock_guard<std::mutex> guard(g_mutex);
  g_points.insert(g_points.end(), {t, kind, value, end});
  return static_cast<int64_t>(g_points.size() / POINT_COLUMNS) - 1;
}

int64_t add_span(int64_t t) {
  std::lock_guard<std::mutex> guard(g_mutex);
  g_spans.insert(g_spans.end(), {t, 0});
  return g_span_base + static_cast<int64_t>(g_spans.size() / SPAN_COLUMNS) - 1;
}

// A range that is not an aten op: our module range, an optimizer step, the autograd engine
// running a node, or the node itself.
void enter_range(ThreadState& ts, const at::RecordFunction& fn, const char* name, Frame& f) {
  static const char module[] = "jv.module:";
  static const char step[] = "Optimizer.step#";
  static const char evaluate[] = "autograd::engine::evaluate_function";
  if (starts_with(name, module, sizeof(module) - 1)) {
    f.value = std::strtoll(name + sizeof(module) - 1, nullptr, 10);
    f.point = add_point(now_ns(), OPEN_MODULE, f.value, 0);
    f.end = END_MODULE;
  } else if (starts_with(name, step, sizeof(step) - 1)) {
    const char* rest = name + sizeof(step) - 1;
    const char* dot = std::strchr(rest, '.');
    std::string optimizer = dot ? std::string(rest, dot - rest) : std::string(rest);
    f.value = intern(ts, (optimizer + ".step").c_str());
    add_point(now_ns(), OPEN_STEP, f.value, 0);
    f.end = END_STEP;
  } else if (starts_with(name, evaluate, sizeof(evaluate) - 1)) {
    if (f.bseq == -2) {
      f.point = add_point(now_ns(), BACKWARD, 0, 0);
      f.end = END_BACKWARD;
    }
    f.bseq = fn.seqNr();
  } else if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    const char* last = std::strrchr(name, ':');
    f.op = intern(ts, last ? last + 1 : name);
    if (f.bseq == -1 && !ts.stack.empty()) {
      // the engine's range carries no sequence number; its node does (the profiler's tree
      // gives the range its node's): what the range makes after the node is the node's too
      f.bseq = fn.seqNr();
      ts.stack.back().bseq = f.bseq;
    }
  }
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (t_gone) return nullptr;
  ThreadState& ts = state();
  Frame f = ts.stack.empty() ? Frame{0, -2, -1, -1, 0, -1, END_NONE} : ts.stack.back();
  f.point = -1;
  f.own_span = -1;
  f.end = END_NONE;
  if (!g_active.load(std::memory_order_relaxed)) {  // stopping, or a forked child: pair only
    ts.stack.push_back(f);
    return nullptr;
  }
  const char* name = fn.name();
  if (starts_with(name, "aten::", 6)) {
    const char* op = name + 6;
    if (!f.op || !plumbing(op)) f.op = intern(ts, op);
    int64_t seq = fn.seqNr();
    if (seq >= 0 && f.bseq == -2) add_point(now_ns(), FORWARD_OP, seq, 0);
  } else {
    enter_range(ts, fn, name, f);
  }
  if (f.op && f.span < 0) {
    f.span = f.own_span = add_span(now_ns());
  }
  ts.stack.push_back(f);
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  if (t_gone) return;
  ThreadState& ts = state();
  if (ts.stack.empty()) return;
  Frame f = ts.stack.back();
  ts.stack.pop_back();
  if (f.end == END_NONE && f.own_span < 0) return;
  int64_t t = now_ns();
  std::lock_guard<std::mutex> guard(g_mutex);
  if (f.point >= 0 && f.point * POINT_COLUMNS + 3 < static_cast<int64_t>(g_points.size())) {
    g_points[f.point * POINT_COLUMNS + 3] = t;
  }
  if (f.end == END_MODULE) g_points.insert(g_points.end(), {t, CLOSE_MODULE, f.value, 0});
  if (f.end == END_STEP) g_points.insert(g_points.end(), {t, CLOSE_STEP, f.value, 0});
  int64_t slot = f.own_span - g_span_base;
  if (slot >= 0 && slot * SPAN_COLUMNS + 1 < static_cast<int64_t>(g_spans.size())) {
    g_spans[slot * SPAN_COLUMNS + 1] = t;
  }
}

// A process forked while recording (a DataLoader worker) records nothing: its callbacks
// only keep their frames paired, and its reports are dropped.
void forked_child() { g_active.store(false); }
const int g_atfork = pthread_atfork(nullptr, nullptr, &forked_child);

// torch reads whatever sits in the thread's PROFILER_STATE slot as a profiler's state
// (ProfilerStateBase: its config, its type); a bare memory reporter there was read as one and
// crashed (an autograd Function's apply). Ours is a profiler state that says "disabled": torch
// code asking whether a profiler runs hears no, and the allocator still reports to it.
struct Reporter final : public torch::profiler::impl::ProfilerStateBase {
  Reporter()
      : ProfilerStateBase(
            torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::Disabled)) {}
  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }
  void reportMemoryUsage(void* ptr, int64_t size, size_t, size_t, c10::Device device) override {
    if (!g_active.load(std::memory_order_relaxed) || device.type() != c10::DeviceType::CPU ||
        t_gone) {
      return;
    }
    ThreadState& ts = state();
    int64_t op = 0, bseq = -2, span = -1;
    if (g_steady) {
      report_steady(ptr, size);
      return;
    }
    if (!ts.stack.empty()) {
      const Frame& f = ts.stack.back();
      op = f.op;
      bseq = f.bseq;
      span = f.span;
    }
    int64_t t = now_ns();
    std::lock_guard<std::mutex> guard(g_mutex);
    g_reports.insert(g_reports.end(),
                     {t, reinterpret_cast<int64_t>(ptr), size, op, bseq, span});
    if (g_step.sizes.size() < kMaxStep) {
      g_step.sizes.push_back(size);
    } else {
      g_step.long_ = true;  // a step this long is not worth comparing: its sizes are not kept
    }
    ++g_total;
  }

  // A report while steady: no labels (they come from the step it repeats), checked against
  // that step's size at this place; a report of another thread differs too.
  static void report_steady(void* ptr, int64_t size) {
    int64_t t = now_ns();
    std::lock_guard<std::mutex> guard(g_mutex);
    g_reports.insert(g_reports.end(), {t, reinterpret_cast<int64_t>(ptr), size, 0, -2, -1});
    if (g_diverged.load(std::memory_order_relaxed) < 0) {
      bool same = !g_template.empty() && g_template[g_template_at] == size &&
                  pthread_equal(pthread_self(), g_steady_thread);
      if (same) {
        g_template_at = (g_template_at + 1) % g_template.size();
      } else {
        g_diverged.store(g_total, std::memory_order_relaxed);
        if (g_interrupt != nullptr && g_signal > 0) g_interrupt(g_signal);
      }
    }
    ++g_total;
  }
  bool memoryProfilingEnabled() const override {
    return g_active.load(std::memory_order_relaxed);
  }
};

bool reporter_on_top() {
  return dynamic_cast<Reporter*>(
             c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE)) != nullptr;
}

void add_callback() {
  g_handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_start, &on_end).needsInputs(false).needsIds(true));
}

void find_interrupt() {
  if (g_interrupt == nullptr) {
    g_interrupt = reinterpret_cast<int (*)(int)>(dlsym(RTLD_DEFAULT, "PyErr_SetInterruptEx"));
  }
}

bool g_paused = false;  // a profiler took the reports (jv_pause) and has not given them back

}  // namespace

extern "C" {

// Start recording on the calling thread (and the threads it hands its state to).
int jv_start() {
  if (g_active.load()) return 1;
  {
    std::lock_guard<std::mutex> guard(g_mutex);
    g_reports.clear();
    g_points.clear();
    g_spans.clear();
    g_span_base = 0;
    g_step = Step();
    g_history.clear();
    g_template.clear();
    g_steady = false;
    g_total = 0;
    g_diverged.store(-1);
  }
  g_generation.fetch_add(1);
  g_active.store(true);
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE,
                                   std::make_shared<Reporter>());
  add_callback();
  return 0;
}

// Stop: no more reports or callbacks; what was recorded stays until taken.
void jv_stop() {
  if (!g_active.exchange(false)) return;
  if (g_handle != 0) at::removeCallback(g_handle);
  g_handle = 0;
  {
    std::lock_guard<std::mutex> guard(g_mutex);
    g_steady = false;
  }
  if (!g_paused && reporter_on_top()) {
    c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
  }
  g_paused = false;
}

// A torch profiler is about to start on this thread: it needs the reporter's slot.
int jv_pause() {
  if (!g_active.load() || g_paused || !reporter_on_top()) return 0;
  c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
  g_paused = true;
  return 1;
}

// That profiler stopped: report to us again.
int jv_resume() {
  if (!g_active.load() || !g_paused ||
      c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr) {
    return 0;
  }
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE,
                                   std::make_shared<Reporter>());
  g_paused = false;
  return 1;
}

// A module call begins / returns on the calling thread (jupyter_vram's module hooks): its
// points, without a record function (one made from Python costs several times this call).
// Calls still open when a chunk is taken are closed before and opened again after.
void jv_module_enter(int64_t id) {
  if (t_gone || !g_active.load(std::memory_order_relaxed)) return;
  ThreadState& ts = state();
  ts.modules.emplace_back(add_point(now_ns(), OPEN_MODULE, id, 0), id);
}

void jv_module_exit() {
  if (t_gone) return;
  ThreadState& ts = state();
  if (ts.modules.empty()) return;
  auto [point, id] = ts.modules.back();
  ts.modules.pop_back();
  if (!g_active.load(std::memory_order_relaxed)) return;
  int64_t t = now_ns();
  std::lock_guard<std::mutex> guard(g_mutex);
  if (point * POINT_COLUMNS + 3 < static_cast<int64_t>(g_points.size())) {
    g_points[point * POINT_COLUMNS + 3] = t;
  }
  g_points.insert(g_points.end(), {t, CLOSE_MODULE, id, 0});
}

// The shortest pattern, of at least ``shortest`` steps, that the last steps repeat: P when the
// last P steps equal the P before them, all begun by module calls and not too long, and
// report something (0: none).
size_t repeating_period(size_t shortest) {
  size_t n = g_history.size();
  for (size_t period = std::max<size_t>(shortest, 1); period <= kMaxPeriod; ++period) {
    if (2 * period > n) break;
    bool same = true, reports = false;
    for (size_t i = n - period; i < n && same; ++i) {
      same = g_history[i] == g_history[i - period];
      reports = reports || !g_history[i].sizes.empty();
    }
    if (same && reports) return period;
  }
  return 0;
}

// A top-level module call (``module``) begins a step on the calling thread: out[0] = the
// index of the step's first report, out[1] = P when the steps that just ended repeat a pattern
// of P steps (P >= ``shortest``; 0: none).
void jv_mark(int64_t module, int64_t shortest, int64_t* out) {
  std::lock_guard<std::mutex> guard(g_mutex);
  out[0] = g_total;
  g_history.push_back(std::move(g_step));
  while (g_history.size() > 2 * kMaxPeriod) g_history.pop_front();
  g_step = Step();
  g_step.module = module;
  g_step.whole = true;
  out[1] = static_cast<int64_t>(repeating_period(static_cast<size_t>(std::max<int64_t>(shortest, 1))));
}

// Steady on (1): the calling thread's later reports repeat the pattern of the last ``period``
// steps, from its first; the RecordFunction callback goes (records begun before still end
// through it); the first report that differs raises ``signum`` in Python (0: none). Off (0):
// the callback again, and steps counted afresh. Returns the next report's index.
int64_t jv_steady(int on, int signum, int64_t period) {
  if (!g_active.load()) return -1;
  find_interrupt();
  if (on && g_handle != 0) {
    at::removeCallback(g_handle);
    g_handle = 0;
  }
  int64_t total;
  {
    std::lock_guard<std::mutex> guard(g_mutex);
    total = g_total;
    g_steady = on != 0;
    g_signal = signum;
    g_diverged.store(-1);
    g_template_at = 0;
    if (on) {
      g_template.clear();
      size_t n = g_history.size();
      size_t p = std::min<size_t>(static_cast<size_t>(std::max<int64_t>(period, 1)), n);
      for (size_t i = n - p; i < n; ++i) {
        g_template.insert(g_template.end(), g_history[i].sizes.begin(),
                          g_history[i].sizes.end());
      }
      g_steady_thread = pthread_self();
    }
    g_step = Step();  // the step now did not begin at a module call: never compared
    g_history.clear();
  }
  if (!on && g_handle == 0) add_callback();
  return total;
}

// Whether a report that does not repeat the step raises the signal itself (Python's
// PyErr_SetInterruptEx is here); where not, only the helper thread's requests notice it.
int jv_raises() {
  find_interrupt();
  return g_interrupt != nullptr ? 1 : 0;
}

// Steady: the index of the first report that did not repeat the step (-1: none yet).
int64_t jv_diverged() { return g_diverged.load(); }

// Whether a recording is on (in this process).
int jv_recording() { return g_active.load() ? 1 : 0; }

// Whether this thread reports to us now (a profiler started later takes the reports).
int jv_reporting() { return reporter_on_top() ? 1 : 0; }

// How many reports, points and spans a jv_take would copy now.
void jv_counts(int64_t* counts) {
  std::lock_guard<std::mutex> guard(g_mutex);
  counts[0] = static_cast<int64_t>(g_reports.size() / REPORT_COLUMNS);
  counts[1] = static_cast<int64_t>(g_points.size() / POINT_COLUMNS);
  counts[2] = static_cast<int64_t>(g_spans.size() / SPAN_COLUMNS);
  counts[3] = g_span_base;
}

// Copy the counted rows out (row-major int64) and forget them.
void jv_take(int64_t reports, int64_t points, int64_t spans, int64_t* report_out,
             int64_t* point_out, int64_t* span_out) {
  std::lock_guard<std::mutex> guard(g_mutex);
  auto move = [](std::vector<int64_t>& from, int64_t rows, int columns, int64_t* out) {
    size_t n = static_cast<size_t>(rows) * columns;
    n = n < from.size() ? n : from.size();
    std::memcpy(out, from.data(), n * sizeof(int64_t));
    from.erase(from.begin(), from.begin() + n);
    return static_cast<int64_t>(n / columns);
  };
  move(g_reports, reports, REPORT_COLUMNS, report_out);
  move(g_points, points, POINT_COLUMNS, point_out);
  g_span_base += move(g_spans, spans, SPAN_COLUMNS, span_out);
}

// Pair a recording's reports (in time order; size > 0 an allocation, < 0 a free, 0 nothing):
// a free ends the live block at its address; an allocation over bytes of live blocks ends
// them (freed where no report was made: another thread). link[i]: for an allocation, the
// report that ended it (-1: live at the end); for a free, the allocation it ended (-1: none).
// cpu_rows.links_in_python is the same rule in Python, for where this library cannot be built.
void jv_links(int64_t n, const int64_t* ptr, const int64_t* size, int64_t* link) {
  std::map<int64_t, std::pair<int64_t, int64_t>> live;  // start -> (allocation, end)
  for (int64_t i = 0; i < n; ++i) {
    link[i] = -1;
    const int64_t start = ptr[i];
    if (size[i] > 0) {
      const int64_t end = start + size[i];
      auto next = live.lower_bound(end);  // live blocks never overlap: the ones left of an
      while (next != live.begin()) {      // overlapping one end before it
        auto block = std::prev(next);
        if (block->second.second <= start) break;
        link[block->second.first] = i;
        next = live.erase(block);
      }
      live.emplace_hint(next, start, std::make_pair(i, end));
    } else if (size[i] < 0) {
      auto block = live.find(start);
      if (block != live.end()) {
        link[block->second.first] = i;
        link[i] = block->second.first;
        live.erase(block);
      }
    }
  }
}

int32_t jv_name_count() {
  std::lock_guard<std::mutex> guard(g_mutex);
  return static_cast<int32_t>(g_names.size());
}

const char* jv_name(int32_t id) {
  std::lock_guard<std::mutex> guard(g_mutex);
  return id >= 0 && static_cast<size_t>(id) < g_names.size() ? g_names[id].c_str() : "";
}

}  // extern "C"
