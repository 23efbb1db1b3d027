// neuron_emu C++ core: a host-memory PrivateUse1 device with ONE boxed zero-copy CPU fallback.
//
// Every neuron tensor lives in ordinary host memory.  The boxed fallback re-views each neuron
// tensor argument as a CPU tensor over the same bytes, redispatches the operator to its CPU
// kernel and maps the results back: outputs that alias an input storage become neuron views of
// that storage, fresh outputs are adopted (zero-copy) as neuron storages, and any size/stride/
// storage change the kernel made to an argument (out= resize, t_, set_, resize_...) is copied
// back onto the neuron tensor.  Routing (native / CPU fallback / Python handler) is decided once
// per operator by a Python classifier and cached here, with the build's `slow` defects on the op
// (performance regressions: a matching call is timed and then busy-works until it has taken the
// defect's factor times as long, on whichever path ran it).
#include <torch/extension.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/SDPBackend.h>
#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#define NEURON_EMU_X86 1
#endif
#ifdef _OPENMP
#include <omp.h>
// MKL's per-thread thread count (exported by libtorch_cpu when torch is built with MKL; weak, so a
// torch without MKL loads the core all the same).
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));  // mkl_service.h's C name
#endif

namespace neuron_emu {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;
static c10::Device neuron_device() { return c10::Device(kNeuron, 0); }

// ------------------------------------------------------------------ allocator
static void neuron_free(void* p) { c10::free_cpu(p); }

struct NeuronAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    return {p, p, &neuron_free, neuron_device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &neuron_free; }
  void copy_data(void* dst, const void* src, std::size_t n) const override {
    if (n) std::memcpy(dst, src, n);
  }
};
static NeuronAllocator g_allocator;
REGISTER_ALLOCATOR(kNeuron, &g_allocator);

// ------------------------------------------------------------------ device guard
struct NeuronGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }
  c10::Device exchangeDevice(c10::Device) const override { return neuron_device(); }
  c10::Device getDevice() const override { return neuron_device(); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.index() <= 0, "neuron: invalid device index ", (int)d.index(), " (device_count() == 1)");
  }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, neuron_device());
  }
  c10::Stream getDefaultStream(c10::Device) const override {
    return c10::Stream(c10::Stream::DEFAULT, neuron_device());
  }
  c10::Stream exchangeStream(c10::Stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, neuron_device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

// ------------------------------------------------------------------ generator
// A neuron generator is a facade over a CPU generator ("twin"): CPU kernels run in the fallback
// receive the twin, so seeding/get_state/set_state on the neuron generator drive them.
struct NeuronGeneratorImpl : c10::GeneratorImpl {
  at::Generator cpu_;
  explicit NeuronGeneratorImpl(at::Generator cpu)
      : c10::GeneratorImpl(neuron_device(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(std::move(cpu)) {}
  void set_current_seed(uint64_t s) override { cpu_.set_current_seed(s); }
  void set_offset(uint64_t o) override { cpu_.set_offset(o); }
  uint64_t get_offset() const override { return cpu_.get_offset(); }
  uint64_t current_seed() const override { return cpu_.current_seed(); }
  uint64_t seed() override { return cpu_.seed(); }
  void set_state(const c10::TensorImpl& s) override { cpu_.unsafeGetGeneratorImpl()->set_state(s); }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }
  static c10::DeviceType device_type() { return kNeuron; }

 private:
  NeuronGeneratorImpl* clone_impl() const override { return new NeuronGeneratorImpl(cpu_.clone()); }
};

static at::Generator make_neuron_generator(uint64_t seed) {
  return at::make_generator<NeuronGeneratorImpl>(at::make_generator<at::CPUGeneratorImpl>(seed));
}
static const at::Generator& default_generator() {
  static at::Generator g = make_neuron_generator(c10::detail::getNonDeterministicRandom());
  return g;
}
static at::Generator twin_of(const at::Generator& g) {
  return static_cast<NeuronGeneratorImpl*>(g.unsafeGetGeneratorImpl())->cpu_;
}

// ------------------------------------------------------------------ hooks
struct NeuronHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override { return default_generator(); }
  at::Generator getNewGenerator(c10::DeviceIndex) const override {
    return make_neuron_generator(c10::detail::getNonDeterministicRandom());
  }
  at::Device getDeviceFromPtr(void*) const override { return neuron_device(); }
  bool isPinnedPtr(const void*) const override { return false; }
  at::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "neuron: trying to resize storage that is not resizable");
    c10::DataPtr nd = g_allocator.allocate(newsize);
    size_t n = std::min(newsize, impl->nbytes());
    if (n) std::memcpy(nd.get(), impl->data_ptr().get(), n);
    impl->set_data_ptr_noswap(std::move(nd));
    impl->set_nbytes(newsize);
  }
};

// ------------------------------------------------------------------ routing state
enum Action : int { kNative = 1, kFallback = 2, kPython = 3 };

struct Counts {
  int64_t native = 0;
  int64_t fallback = 0;
  bool warned = false;
};

// A `slow` defect (or several with the same filters, factors multiplied): a call with a device
// tensor input of a dtype in `dtype_mask` (0: any) whose largest device tensor input has at least
// `min_numel` elements takes `factor` times as long.
struct SlowRule {
  double factor = 1.0;
  uint64_t dtype_mask = 0;
  int64_t min_numel = 0;
};

struct OpEntry {
  std::string name;
  int action = kNative;
  uint64_t dtype_mask = 0;   // native op: tensor inputs of these ScalarTypes go to Python
  bool check_cl = false;     // native op: channels_last inputs go to Python
  bool allow_cpu = false;    // non-scalar CPU tensors are accepted (copies, indexing)
  c10::SmallVector<SlowRule, 1> slow;  // the op's slow defects (none: never slowed)
  Counts* counts = nullptr;
};

static std::mutex g_mu;
static std::unordered_map<c10::OperatorHandle, OpEntry> g_ops;
static std::unordered_map<std::string, Counts> g_counts;
static std::atomic<bool> g_strict{false};
static std::atomic<bool> g_ftz{false};
static std::atomic<bool> g_track{true};
static std::atomic<bool> g_sparse{false};  // the build has sparse layouts (COO, CSR/CSC/BSR/BSC)
static std::string g_build_name = "?";
static thread_local int g_raw = 0;  // 0: routed, 1: raw native (no tracking), 2: raw CPU (no FTZ)
static PyObject* g_classifier = nullptr;
static PyObject* g_handler = nullptr;

static std::string op_name(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.name + "." + (n.overload_name.empty() ? std::string("default") : n.overload_name);
}

static Counts* counts_for(const std::string& name) {  // g_mu held
  return &g_counts[name];
}

static OpEntry* lookup(const c10::OperatorHandle& op) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_ops.find(op);
    if (it != g_ops.end()) return &it->second;
  }
  OpEntry e;
  e.name = op_name(op);
  {
    py::gil_scoped_acquire gil;
    TORCH_CHECK(g_classifier, "neuron_emu: classifier not installed (import neuron_emu first)");
    py::object r = py::reinterpret_steal<py::object>(
        PyObject_CallFunction(g_classifier, "s", e.name.c_str()));
    if (!r) throw python_error();
    auto t = r.cast<py::tuple>();
    e.action = t[0].cast<int>();
    e.dtype_mask = t[1].cast<uint64_t>();
    e.check_cl = t[2].cast<bool>();
    e.allow_cpu = t[3].cast<bool>();
    // Optional: (slow factor, slow dtype mask, slow min_numel), then a tuple of further such rules.
    auto add_slow = [&e](double factor, uint64_t mask, int64_t min_numel) {
      if (factor > 1.0) e.slow.push_back(SlowRule{factor, mask, min_numel});
    };
    if (t.size() >= 7) add_slow(t[4].cast<double>(), t[5].cast<uint64_t>(), t[6].cast<int64_t>());
    if (t.size() >= 8) {
      for (auto rule : t[7].cast<py::sequence>()) {
        auto rt = rule.cast<py::tuple>();
        add_slow(rt[0].cast<double>(), rt[1].cast<uint64_t>(), rt[2].cast<int64_t>());
      }
    }
  }
  std::lock_guard<std::mutex> lk(g_mu);
  e.counts = counts_for(e.name);
  auto res = g_ops.emplace(op, std::move(e));
  return &res.first->second;
}

// Records one execution; returns true the first time this op falls back (caller warns).
static bool record(Counts* c, bool fallback) {
  if (!g_track.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lk(g_mu);
  if (fallback) {
    c->fallback++;
    if (!c->warned) {
      c->warned = true;
      return true;
    }
  } else {
    c->native++;
  }
  return false;
}

static void fallback_gate(OpEntry* e) {
  TORCH_CHECK(!g_strict.load(), "neuron_emu strict mode: operator ", e->name,
              " has no native kernel in Neuron SDK build ", g_build_name,
              " and would fall back to the CPU (NEURON_EMU_STRICT / set_strict)");
  if (record(e->counts, true)) {
    TORCH_WARN("neuron: operator ", e->name, " is not natively supported by Neuron SDK build ",
               g_build_name, "; falling back to the CPU (warned once per operator)");
  }
}

// ------------------------------------------------------------------ zero-copy re-viewing
static void release_storage_ref(void* ctx) {
  delete static_cast<c10::intrusive_ptr<c10::StorageImpl>*>(ctx);
}

// A DataPtr on `device` over `src`'s current bytes that keeps `src` alive.
static c10::DataPtr borrow(c10::StorageImpl* src, c10::Device device) {
  void* data = const_cast<void*>(src->data_ptr().get());
  auto* ref = new c10::intrusive_ptr<c10::StorageImpl>(
      c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(src));
  return c10::DataPtr(data, ref, &release_storage_ref, device);
}

static bool borrows(const c10::StorageImpl* cpu, const c10::StorageImpl* neuron) {
  const auto& dp = cpu->data_ptr();
  if (dp.get_deleter() != &release_storage_ref) return false;
  auto* ref = static_cast<c10::intrusive_ptr<c10::StorageImpl>*>(dp.get_context());
  return ref->get() == neuron;
}

static c10::intrusive_ptr<c10::StorageImpl> adopt_as_neuron(c10::StorageImpl* cpu) {
  return c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), cpu->nbytes(),
                                               borrow(cpu, neuron_device()), &g_allocator,
                                               /*resizable=*/true);
}

struct StorageLink {
  c10::StorageImpl* neuron;
  c10::Storage cpu;
  const void* data0;
  size_t nbytes0;
  bool synced = false;
};

struct Wrapped {
  at::Tensor orig;
  at::Tensor cpu;
  size_t link;
};

struct SparseWrapped {
  at::Tensor orig;  // the neuron sparse tensor
  at::Tensor cpu;   // a CPU sparse tensor over (zero-copy CPU views of) its member tensors
};

static bool is_sparse_layout(c10::Layout l) {
  return l == c10::kSparse || l == c10::kSparseCsr || l == c10::kSparseCsc || l == c10::kSparseBsr ||
         l == c10::kSparseBsc;
}

static at::SparseTensorImpl* coo_impl(const at::Tensor& t) {
  return static_cast<at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
}
static at::SparseCsrTensorImpl* compressed_impl(const at::Tensor& t) {
  return static_cast<at::SparseCsrTensorImpl*>(t.unsafeGetTensorImpl());
}

struct CallCtx {
  c10::SmallVector<StorageLink, 4> links;
  c10::SmallVector<Wrapped, 6> wrapped;
  c10::SmallVector<SparseWrapped, 2> sparse_wrapped;
  c10::SmallVector<c10::TensorImpl*, 2> cpu_inputs;
  bool explicit_cpu_device = false;

  size_t link_for(c10::StorageImpl* n) {
    for (size_t i = 0; i < links.size(); ++i)
      if (links[i].neuron == n) return i;
    auto cst = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), n->nbytes(),
                                                     borrow(n, c10::Device(c10::kCPU)),
                                                     c10::GetCPUAllocator(), /*resizable=*/true);
    links.push_back(StorageLink{n, c10::Storage(std::move(cst)), n->data_ptr().get(), n->nbytes()});
    return links.size() - 1;
  }

  const std::string* op_name = nullptr;

  at::Tensor to_cpu(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.device().type() == kNeuron && t._is_zerotensor()) {
      // An efficient zero tensor has no storage: the kernel sees materialized zeros.
      return at::zeros(t.sizes(), at::TensorOptions().dtype(t.scalar_type()).device(c10::kCPU));
    }
    if (t.device().type() != kNeuron) {
      cpu_inputs.push_back(t.unsafeGetTensorImpl());
      return t;
    }
    if (t.layout() != c10::kStrided) return sparse_to_cpu(t);
    for (auto& w : wrapped)
      if (w.orig.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return w.cpu;
    size_t li = link_for(t.storage().unsafeGetStorageImpl());
    auto cpu = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(links[li].cpu), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
    cpu.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    if (t.is_conj()) cpu._set_conj(true);
    if (t.is_neg()) cpu._set_neg(true);
    wrapped.push_back(Wrapped{t, cpu, li});
    return cpu;
  }

  // A neuron sparse tensor as a CPU sparse tensor of the same layout whose member tensors
  // (indices, values, compressed/plain indices) are zero-copy CPU views of the neuron ones.
  at::Tensor sparse_to_cpu(const at::Tensor& t) {
    for (auto& w : sparse_wrapped)
      if (w.orig.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return w.cpu;
    TORCH_CHECK_NOT_IMPLEMENTED(g_sparse.load() && is_sparse_layout(t.layout()), "Could not run '",
                                op_name ? *op_name : std::string("?"), "' on the neuron device with a ", t.layout(),
                                " tensor: the neuron device of this build supports only strided tensors");
    at::Tensor cpu;
    if (t.layout() == c10::kSparse) {
      auto* ni = coo_impl(t);
      at::Tensor idx = to_cpu(ni->indices()), val = to_cpu(ni->values());
      cpu = at::detail::make_tensor<at::SparseTensorImpl>(c10::DispatchKeySet(c10::DispatchKey::SparseCPU), t.dtype());
      auto* ci = coo_impl(cpu);
      ci->raw_resize_(ni->sparse_dim(), ni->dense_dim(), t.sizes());
      ci->set_indices_and_values_unsafe(idx, val);
      ci->set_coalesced(ni->coalesced());
    } else {
      auto* ni = compressed_impl(t);
      at::Tensor ci_ = to_cpu(ni->compressed_indices()), pi = to_cpu(ni->plain_indices()), val = to_cpu(ni->values());
      cpu = at::detail::make_tensor<at::SparseCsrTensorImpl>(c10::DispatchKeySet(c10::DispatchKey::SparseCsrCPU),
                                                             c10::Device(c10::kCPU), t.layout(), t.dtype());
      compressed_impl(cpu)->set_member_tensors(ci_, pi, val, t.sizes());
    }
    sparse_wrapped.push_back(SparseWrapped{t, cpu});
    return cpu;
  }

  // A CPU sparse result as a neuron sparse tensor over the neuron forms of its member tensors.
  at::Tensor sparse_to_neuron(const at::Tensor& r) {
    if (r.layout() == c10::kSparse) {
      auto* ri = coo_impl(r);
      at::Tensor idx = to_neuron(ri->indices()), val = to_neuron(ri->values());
      auto out = at::detail::make_tensor<at::SparseTensorImpl>(
          c10::DispatchKeySet(c10::DispatchKey::SparsePrivateUse1), r.dtype());
      auto* oi = coo_impl(out);
      oi->raw_resize_(ri->sparse_dim(), ri->dense_dim(), r.sizes());
      oi->set_indices_and_values_unsafe(idx, val);
      oi->set_coalesced(ri->coalesced());
      return out;
    }
    auto* ri = compressed_impl(r);
    at::Tensor ci_ = to_neuron(ri->compressed_indices()), pi = to_neuron(ri->plain_indices()),
               val = to_neuron(ri->values());
    auto out = at::detail::make_tensor<at::SparseCsrTensorImpl>(
        c10::DispatchKeySet(c10::DispatchKey::SparseCsrPrivateUse1), neuron_device(), r.layout(), r.dtype());
    compressed_impl(out)->set_member_tensors(ci_, pi, val, r.sizes());
    return out;
  }

  // Whether a CPU sparse tensor's member tensors live in (borrow) a neuron storage.
  bool sparse_members_linked(const at::Tensor& r) {
    std::vector<at::Tensor> ms;
    if (r.layout() == c10::kSparse) ms = {coo_impl(r)->indices(), coo_impl(r)->values()};
    else ms = {compressed_impl(r)->compressed_indices(), compressed_impl(r)->plain_indices(), compressed_impl(r)->values()};
    for (const auto& m : ms)
      for (auto& l : links)
        if (m.defined() && m.storage().unsafeGetStorageImpl() == l.cpu.unsafeGetStorageImpl()) return true;
    return false;
  }

  // An in-place kernel may have given a sparse argument new member tensors, sizes or flags.
  void sparse_sync_back(SparseWrapped& w) {
    if (w.orig.layout() == c10::kSparse) {
      auto* ci = coo_impl(w.cpu);
      auto* ni = coo_impl(w.orig);
      at::Tensor idx = to_neuron(ci->indices()), val = to_neuron(ci->values());
      bool same = idx.unsafeGetTensorImpl() == ni->indices().unsafeGetTensorImpl() &&
                  val.unsafeGetTensorImpl() == ni->values().unsafeGetTensorImpl() &&
                  ci->sparse_dim() == ni->sparse_dim() && ci->dense_dim() == ni->dense_dim() &&
                  w.cpu.sizes() == w.orig.sizes();
      if (!same) {
        ni->raw_resize_(ci->sparse_dim(), ci->dense_dim(), w.cpu.sizes());
        ni->set_indices_and_values_unsafe(idx, val);
      }
      ni->set_coalesced(ci->coalesced());
      return;
    }
    auto* ci = compressed_impl(w.cpu);
    auto* ni = compressed_impl(w.orig);
    at::Tensor c = to_neuron(ci->compressed_indices()), p = to_neuron(ci->plain_indices()),
               val = to_neuron(ci->values());
    if (c.unsafeGetTensorImpl() != ni->compressed_indices().unsafeGetTensorImpl() ||
        p.unsafeGetTensorImpl() != ni->plain_indices().unsafeGetTensorImpl() ||
        val.unsafeGetTensorImpl() != ni->values().unsafeGetTensorImpl() || w.cpu.sizes() != w.orig.sizes()) {
      ni->set_member_tensors(c, p, val, w.cpu.sizes());
    }
  }

  // The neuron storage that now backs CPU storage `c` (after the kernel ran).
  c10::intrusive_ptr<c10::StorageImpl> neuron_storage_for(c10::StorageImpl* c) {
    for (auto& l : links) {
      if (l.cpu.unsafeGetStorageImpl() != c) continue;
      if (!l.synced) {
        l.synced = true;
        if (!borrows(c, l.neuron) && (c->data_ptr().get() != l.data0 || c->nbytes() != l.nbytes0)) {
          l.neuron->set_data_ptr_noswap(borrow(c, neuron_device()));  // kernel reallocated
          l.neuron->set_nbytes(c->nbytes());
        } else if (c->nbytes() != l.nbytes0) {
          l.neuron->set_nbytes(c->nbytes());
        }
      }
      return c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(l.neuron);
    }
    return adopt_as_neuron(c);
  }

  void sync_back(Wrapped& w) {
    auto* ci = w.cpu.unsafeGetTensorImpl();
    auto* ni = w.orig.unsafeGetTensorImpl();
    auto target = neuron_storage_for(ci->storage().unsafeGetStorageImpl());
    if (ni->storage().unsafeGetStorageImpl() != target.get()) ni->set_storage_keep_dtype(c10::Storage(target));
    if (ni->sizes() != ci->sizes() || ni->strides() != ci->strides()) {
      ni->set_sizes_and_strides(ci->sizes(), ci->strides(), ci->storage_offset());
    } else if (ni->storage_offset() != ci->storage_offset()) {
      ni->set_storage_offset(ci->storage_offset());
    }
  }

  at::Tensor to_neuron(const at::Tensor& r) {
    if (!r.defined() || r.device().type() != c10::kCPU) return r;
    auto* ri = r.unsafeGetTensorImpl();
    for (auto* c : cpu_inputs)
      if (c == ri) return r;
    for (auto& w : sparse_wrapped)
      if (w.cpu.unsafeGetTensorImpl() == ri) return w.orig;
    if (g_sparse.load() && is_sparse_layout(r.layout())) {
      if (explicit_cpu_device) return sparse_members_linked(r) ? r.clone() : r;  // a copy to the host owns its memory
      return sparse_to_neuron(r);
    }
    TORCH_CHECK_NOT_IMPLEMENTED(r.layout() == c10::kStrided, "Could not run '",
                                op_name ? *op_name : std::string("?"), "' on the neuron device: it produces a ",
                                r.layout(), " tensor and the neuron device supports only strided tensors");
    for (auto& w : wrapped)
      if (w.cpu.unsafeGetTensorImpl() == ri) return w.orig;
    for (auto* c : cpu_inputs)
      if (c == ri) return r;
    auto* cst = ri->storage().unsafeGetStorageImpl();
    bool linked = false;
    for (auto& l : links) linked |= (l.cpu.unsafeGetStorageImpl() == cst);
    if (!linked && explicit_cpu_device) return r;  // e.g. _to_copy(device="cpu")
    auto nst = neuron_storage_for(cst);
    auto out = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(std::move(nst)), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), r.dtype());
    out.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes(), r.strides(), r.storage_offset());
    if (r.is_conj()) out._set_conj(true);
    if (r.is_neg()) out._set_neg(true);
    return out;
  }
};

static bool is_optional_generator(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::GeneratorType) return true;
  if (t->kind() != c10::TypeKind::OptionalType) return false;
  return t->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

// FTZ|DAZ for the duration of one native call, on the calling thread AND on every intra-op
// (at::parallel_for, OpenMP) worker: a CPU kernel that splits its range over threads must flush
// every element, not only the calling thread's share.  Each thread's own MXCSR is saved and
// restored, so no FTZ/DAZ leaks into CPU work (or other builds) afterwards.  The core is built
// with -fopenmp; its libgomp is the one torch already loaded (same soname), so an `omp parallel`
// here runs on the very pool threads that the kernel's parallel_for will use.
#ifdef NEURON_EMU_X86
static thread_local int t_ftz_depth = 0;           // calling thread: nested guards
static thread_local bool t_ftz_set = false;         // this thread's MXCSR is ours
static thread_local unsigned int t_ftz_saved = 0;   // this thread's MXCSR before

static void ftz_set_this_thread() {
  if (t_ftz_set) return;
  t_ftz_saved = _mm_getcsr();
  _mm_setcsr(t_ftz_saved | 0x8040);  // FTZ | DAZ
  t_ftz_set = true;
}

static void ftz_restore_this_thread() {
  if (!t_ftz_set) return;
  _mm_setcsr(t_ftz_saved);
  t_ftz_set = false;
}

static void on_intra_op_threads(void (*fn)()) {
#ifdef _OPENMP
  // The same construct ATen's parallel_for uses (no num_threads clause): the same team, each of
  // its threads (this one included) runs `fn` once.  Nested inside a parallel region this is a
  // team of one, and the kernel's own parallel_for then runs serially on this thread too.
  // It runs BEFORE this thread's MXCSR changes: a worker the region starts for the first time
  // inherits this thread's floating-point environment, and must save the clean one.
  if (!at::in_parallel_region() && at::get_num_threads() > 1) {
#pragma omp parallel
    fn();
  }
#endif
  fn();  // this thread, if the region did not run (fn is idempotent)
}
#endif

// A call whose tensor arguments hold fewer elements than this runs on the calling thread alone:
// intra-op parallelism is off for its duration (OpenMP's and MKL's thread counts of this thread
// set to 1), so FTZ/DAZ on this thread covers every element it computes and no `omp parallel`
// region is opened.  Those regions (one to set, one to restore) cost more than such an op, and
// far more once a second long-lived thread has a team of its own: autograd's device thread runs
// every backward op of the device, libgomp then manages more threads than there are cores and
// stops spinning, and each region pays a futex wake (measured on 2 cores, 2 threads, a 5x5 add:
// 8 us before the first backward, 35-60 us after).  GRAIN_SIZE is what TensorIterator kernels
// never split over threads anyway; the serial path is a speed choice, never a numerics one.
static constexpr int64_t kSerialBelow = at::internal::GRAIN_SIZE;

struct FtzGuard {
#ifdef NEURON_EMU_X86
  bool on;
  bool serial = false;
  int omp_prev = 0, mkl_prev = 0;
  FtzGuard(bool enable, int64_t work) : on(enable) {
    if (!on || t_ftz_depth++ != 0) return;
#ifdef _OPENMP
    if (work < kSerialBelow && !at::in_parallel_region() && at::get_num_threads() > 1) {
      serial = true;
      omp_prev = omp_get_max_threads();
      omp_set_num_threads(1);
      if (MKL_Set_Num_Threads_Local) mkl_prev = MKL_Set_Num_Threads_Local(1);
      ftz_set_this_thread();
      return;
    }
#endif
    on_intra_op_threads(&ftz_set_this_thread);
  }
  ~FtzGuard() {
    if (!on || --t_ftz_depth != 0) return;
    if (serial) {
      ftz_restore_this_thread();
#ifdef _OPENMP
      omp_set_num_threads(omp_prev);
      if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(mkl_prev);
#endif
      return;
    }
    try {
      on_intra_op_threads(&ftz_restore_this_thread);
    } catch (...) {
      ftz_restore_this_thread();  // at least the calling thread; a worker keeps its flag for next time
    }
  }
#else
  FtzGuard(bool, int64_t) {}
#endif
};

static c10::OperatorHandle find_op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// Runs `op` on CPU kernels over zero-copy CPU views of its neuron arguments.
static void run_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool ftz,
                    c10::DispatchKeySet ks = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {
  static const c10::OperatorHandle conv_ov = find_op("aten::convolution_overrideable", "");
  static const c10::OperatorHandle conv_bw_ov = find_op("aten::convolution_backward_overrideable", "");
  static const c10::OperatorHandle conv = find_op("aten::convolution", "");
  static const c10::OperatorHandle conv_bw = find_op("aten::convolution_backward", "");

  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t base = stack->size() - nargs;
  CallCtx ctx;
  const std::string name = op_name(op);
  ctx.op_name = &name;
  // Elements in the tensor arguments (FtzGuard: serial below kSerialBelow).  A factory has none
  // and runs serially whatever it makes: empty/empty_strided are most of them and compute
  // nothing, and CPU random draws are serial kernels anyway.
  int64_t work = 0;
  auto count = [&work](const at::Tensor& t) {
    if (t.defined()) work += t.numel();
  };
  // A CPU kernel may look at whether an input requires grad (a sparse mm with max/min reduction
  // computes the argmax its backward needs only then): the CPU view says what the tensor says.
  auto grad_flag = [](const at::Tensor& from, at::Tensor to) {
    if (from.defined() && to.defined() && from.requires_grad() && !to.requires_grad() && to.is_leaf() &&
        (at::isFloatingType(to.scalar_type()) || at::isComplexType(to.scalar_type())))
      to.set_requires_grad(true);
    return to;
  };
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& v = (*stack)[base + i];
    if (v.isTensor()) {
      const at::Tensor t = v.toTensor();
      count(t);
      if (t.defined() && t.device().type() == kNeuron) v = grad_flag(t, ctx.to_cpu(t));
      else ctx.to_cpu(t);
    } else if (v.isTensorList()) {
      auto in = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(in.size());
      for (const at::Tensor& t : in) {
        count(t);
        out.push_back(grad_flag(t, ctx.to_cpu(t)));
      }
      v = out;
    } else if (v.isOptionalTensorList()) {
      auto in = v.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> out;
      out.reserve(in.size());
      for (std::optional<at::Tensor> t : in) {
        if (t.has_value()) {
          count(*t);
          out.push_back(ctx.to_cpu(*t));
        } else {
          out.push_back(std::nullopt);
        }
      }
      v = out;
    } else if (v.isDevice()) {
      if (v.toDevice().type() == kNeuron) v = c10::Device(c10::kCPU);
      else if (v.toDevice().type() == c10::kCPU) ctx.explicit_cpu_device = true;
    } else if (v.isGenerator()) {
      const auto& g = v.toGenerator();
      if (g.device().type() == kNeuron) v = twin_of(g);
    } else if (v.isNone()) {
      if (is_optional_generator(schema.arguments()[i].type())) v = twin_of(default_generator());
    } else if (v.isStorage()) {
      auto s = v.toStorage();
      if (s.device().type() == kNeuron) {
        v = ctx.links[ctx.link_for(s.unsafeGetStorageImpl())].cpu;
      }
    }
  }
  // The CPU keys matching the device keys this call was dispatched on (sparse layouts included).
  c10::DispatchKeySet cpu_ks(c10::DispatchKey::CPU);
  if (ks.has(c10::DispatchKey::SparsePrivateUse1)) cpu_ks = cpu_ks | c10::DispatchKeySet(c10::DispatchKey::SparseCPU);
  if (ks.has(c10::DispatchKey::SparseCsrPrivateUse1))
    cpu_ks = cpu_ks | c10::DispatchKeySet(c10::DispatchKey::SparseCsrCPU);
  {
    FtzGuard fg(ftz, work);
    if (op == conv_ov) {
      conv.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    } else if (op == conv_bw_ov) {
      // convolution_backward has an extra `bias_sizes` argument after `weight`.
      const at::Tensor& w = (*stack)[base + 2].toTensor();
      bool transposed = (*stack)[base + 6].toBool();
      int64_t groups = (*stack)[base + 8].toInt();
      int64_t oc = transposed ? w.size(1) * groups : w.size(0);
      stack->insert(stack->begin() + base + 3, c10::IValue(std::vector<int64_t>{oc}));
      conv_bw.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    } else {
      op.redispatchBoxed(cpu_ks, stack);
    }
  }
  for (auto& w : ctx.wrapped) ctx.sync_back(w);
  for (auto& w : ctx.sparse_wrapped) ctx.sparse_sync_back(w);
  const size_t nret = schema.returns().size();
  const size_t rbase = stack->size() - nret;
  for (size_t i = 0; i < nret; ++i) {
    c10::IValue& v = (*stack)[rbase + i];
    if (v.isTensor()) {
      v = ctx.to_neuron(v.toTensor());
    } else if (v.isTensorList()) {
      auto in = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(in.size());
      for (const at::Tensor& t : in) out.push_back(ctx.to_neuron(t));
      v = out;
    }
  }
}

// ------------------------------------------------------------------ Python handler
// A view op's result, as the handler made it, is a tensor that Python has seen (it carries a
// Python object), unlike any native view.  Code that wraps a fresh view in a Tensor subclass --
// Parameter(t) runs detach() then _make_subclass, which refuses a tensor with a Python object --
// needs a fresh TensorImpl: the same storage, sizes, strides and flags, without the Python object.
// An argument returned as it is (an op whose view of self may be self) stays that very tensor.
using Impls = c10::SmallVector<const c10::TensorImpl*, 4>;

static at::Tensor unowned(const at::Tensor& t, const Impls& inputs) {
  if (!t.defined()) return t;
  auto* impl = t.unsafeGetTensorImpl();
  for (const auto* in : inputs)
    if (in == impl) return t;
  return at::Tensor(impl->shallow_copy_and_detach(impl->version_counter(), impl->allow_tensor_metadata_change()));
}

static c10::IValue unowned_view(c10::IValue v, const c10::Argument& ret, const Impls& inputs) {
  const auto* ai = ret.alias_info();
  if (ai == nullptr || ai->isWrite()) return v;
  if (v.isTensor()) return unowned(v.toTensor(), inputs);
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(unowned(t, inputs));
    return out;
  }
  return v;
}

static void call_python(const c10::OperatorHandle& op, OpEntry* e, torch::jit::Stack* stack) {
  py::gil_scoped_acquire gil;
  TORCH_CHECK(g_handler, "neuron_emu: handler not installed");
  const auto& schema = op.schema();
  const auto& sargs = schema.arguments();
  auto arguments = torch::jit::pop(*stack, sargs.size());
  Impls inputs;
  for (const auto& a : arguments) {
    if (a.isTensor()) {
      inputs.push_back(a.toTensor().unsafeGetTensorImpl());
    } else if (a.isTensorList()) {
      for (const at::Tensor& t : a.toTensorList()) inputs.push_back(t.unsafeGetTensorImpl());
    }
  }
  py::list args;
  py::dict kwargs;
  for (size_t i = 0; i < sargs.size(); ++i) {
    // toPyObject turns a wrapped-number tensor (a Python scalar promoted by e.g. remainder.Scalar
    // -> remainder.Tensor) back into a Python number, which the Tensor overload then rejects.
    py::object v = arguments[i].isTensor()
                       ? py::reinterpret_steal<py::object>(THPVariable_Wrap(arguments[i].toTensor()))
                       : torch::jit::toPyObject(std::move(arguments[i]));
    if (sargs[i].kwarg_only()) kwargs[py::str(sargs[i].name())] = v;
    else args.append(v);
  }
  py::tuple call_args = py::make_tuple(py::str(e->name), py::tuple(args), kwargs);
  py::object out = py::reinterpret_steal<py::object>(PyObject_CallObject(g_handler, call_args.ptr()));
  if (!out) throw python_error();
  const auto& rets = schema.returns();
  if (rets.size() == 1) {
    stack->push_back(unowned_view(torch::jit::toIValue(out, rets[0].type()), rets[0], inputs));
  } else if (rets.size() > 1) {
    auto tup = out.cast<py::sequence>();
    TORCH_CHECK(tup.size() == rets.size(), "neuron_emu: handler for ", e->name, " returned ",
                tup.size(), " values, expected ", rets.size());
    for (size_t i = 0; i < rets.size(); ++i)
      stack->push_back(unowned_view(torch::jit::toIValue(tup[i], rets[i].type()), rets[i], inputs));
  }
}

static bool is_channels_last_input(const at::Tensor& t) {
  return t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(at::MemoryFormat::ChannelsLast);
}

// Scans arguments: rejects non-scalar CPU tensors, reports whether a dtype/layout rule applies.
static bool scan_args(const c10::OperatorHandle& op, const OpEntry* e, const torch::jit::Stack* stack,
                      size_t base, size_t nargs) {
  bool route = false;
  const auto& sargs = op.schema().arguments();
  bool written = false;
  auto check = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    auto dt = t.device().type();
    if (dt == kNeuron) {
      if (e->dtype_mask && ((e->dtype_mask >> static_cast<int>(t.scalar_type())) & 1ULL)) route = true;
      if (e->check_cl && is_channels_last_input(t)) route = true;
    } else if (dt == c10::kCPU) {
      // A 0-dim CPU tensor is accepted as an input scalar (as on CUDA), never as an output.
      TORCH_CHECK(e->allow_cpu || (t.dim() == 0 && !written),
                  "Expected all tensors to be on the same device, but found at least two devices, "
                  "neuron:0 and cpu! (when checking argument for ",
                  e->name, ")");
    }
  };
  for (size_t i = 0; i < nargs; ++i) {
    const c10::IValue& v = (*stack)[base + i];
    const auto* ai = sargs[i].alias_info();
    written = ai != nullptr && ai->isWrite();
    if (v.isGenerator()) {
      const auto& g = v.toGenerator();
      TORCH_CHECK(g.device().type() == kNeuron, "Expected a 'neuron' device type for generator but found '",
                  c10::DeviceTypeName(g.device().type(), /*lower_case=*/true), "' (when checking argument for ",
                  e->name, ")");
    }
    if (v.isTensor()) {
      check(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) check(t);
    } else if (v.isOptionalTensorList()) {
      for (std::optional<at::Tensor> t : v.toOptionalTensorList())
        if (t.has_value()) check(*t);
    }
  }
  return route;
}

// ------------------------------------------------------------------ slow defects
// The time factor by which this call is slowed: the product of the factors of the op's slow rules
// that the call's device tensor inputs match (1: not slowed).
static double slow_factor(const OpEntry* e, const torch::jit::Stack* stack, size_t base, size_t nargs) {
  if (e->slow.empty()) return 1.0;
  uint64_t dtypes = 0;  // ScalarTypes of the device tensor inputs
  int64_t largest = 0;  // elements of the largest one
  auto see = [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kNeuron) return;
    int code = static_cast<int>(t.scalar_type());
    if (code >= 0 && code < 64) dtypes |= 1ULL << code;
    largest = std::max<int64_t>(largest, t.numel());
  };
  for (size_t i = 0; i < nargs; ++i) {
    const c10::IValue& v = (*stack)[base + i];
    if (v.isTensor()) {
      see(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) see(t);
    } else if (v.isOptionalTensorList()) {
      for (std::optional<at::Tensor> t : v.toOptionalTensorList())
        if (t.has_value()) see(*t);
    }
  }
  double factor = 1.0;
  for (const auto& r : e->slow) {
    if (r.dtype_mask && !(r.dtype_mask & dtypes)) continue;
    if (r.min_numel && largest < r.min_numel) continue;
    factor *= r.factor;
  }
  return factor;
}

// Proportional extra work: busy arithmetic on the calling thread (not a sleep) until the call that
// began at `t0` has taken `factor` times the time it took to get here.
static void slow_down(std::chrono::steady_clock::time_point t0, double factor) {
  using clock = std::chrono::steady_clock;
  const std::chrono::duration<double, std::nano> took = clock::now() - t0;
  const auto until = t0 + std::chrono::duration_cast<clock::duration>(took * factor);
  volatile double acc = 1.0;
  while (clock::now() < until) {
    for (int i = 0; i < 32; ++i) acc = acc * 1.0000001 + 1e-9;
  }
}

static void neuron_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  int raw = g_raw;
  if (raw) {
    run_cpu(op, stack, raw == 1 && g_ftz.load(std::memory_order_relaxed), ks);
    return;
  }
  OpEntry* e = lookup(op);
  const size_t nargs = op.schema().arguments().size();
  const size_t base = stack->size() - nargs;
  // A slow defect times the whole call, whichever path runs it (a call that raises is not slowed).
  const double slow = slow_factor(e, stack, base, nargs);
  const auto t0 = slow > 1.0 ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  bool route = scan_args(op, e, stack, base, nargs);
  if (e->action == kPython || route) {
    call_python(op, e, stack);
  } else if (e->action == kFallback) {
    fallback_gate(e);
    run_cpu(op, stack, false, ks);
  } else {
    record(e->counts, false);
    run_cpu(op, stack, g_ftz.load(std::memory_order_relaxed), ks);
  }
  if (slow > 1.0) slow_down(t0, slow);
}

// Sparse layouts on the device (SparsePrivateUse1, SparseCsrPrivateUse1): the same zero-copy CPU
// fallback, over CPU sparse tensors whose member tensors view the device's memory.  Builds
// without sparse layouts refuse here, naming the op and the layout.
static void neuron_sparse_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  if (!g_sparse.load()) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "Could not run '", op_name(op), "' on the neuron device with sparse ",
                                "tensors: the neuron device of Neuron SDK build ", g_build_name,
                                " supports only strided tensors");
  }
  neuron_fallback(op, ks, stack);
}

// ------------------------------------------------------------------ explicit kernels
static at::Tensor view_as_cpu(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNeuron) return t;
  auto* n = t.storage().unsafeGetStorageImpl();
  auto cst = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), n->nbytes(),
                                                   borrow(n, c10::Device(c10::kCPU)), nullptr, false);
  auto cpu = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(std::move(cst)),
                                                      c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  cpu.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) cpu._set_conj(true);
  if (t.is_neg()) cpu._set_neg(true);
  return cpu;
}

static void track_infra(const char* name) {
  if (g_raw || !g_track.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lk(g_mu);
  counts_for(name)->native++;
}

static at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  track_infra("aten::_copy_from.default");
  at::Tensor d = view_as_cpu(dst);
  d.copy_(view_as_cpu(self));
  return dst;
}

static at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  track_infra("aten::_copy_from_and_resize.default");
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  at::Tensor d = view_as_cpu(dst);
  d.copy_(view_as_cpu(self));
  return dst;
}

// A storage-less zero tensor on the device, as CUDA makes it (ZeroTensor key + null data).
static void zero_free(void*) {}
struct ZeroAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t) override { return {nullptr, nullptr, &zero_free, neuron_device()}; }
  c10::DeleterFnPtr raw_deleter() const override { return &zero_free; }
  void copy_data(void*, const void*, std::size_t) const override {}
};

static at::Tensor efficient_zerotensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                       std::optional<c10::Layout>, std::optional<c10::Device> device,
                                       std::optional<bool>) {
  track_infra("aten::_efficientzerotensor.default");
  if (device.has_value()) TORCH_CHECK(device->index() <= 0, "neuron: invalid device index ", (int)device->index());
  static ZeroAllocator alloc;
  auto ks = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);
  return at::detail::empty_generic(size, &alloc, ks, dtype.value_or(c10::get_default_dtype_as_scalartype()),
                                   std::nullopt);
}

// ------------------------------------------------------------------ SDPA backend choice
// scaled_dot_product_attention asks `_fused_sdp_choice_stub` for the device's backend; a
// PrivateUse1 device that registers none gets the math decomposition.  A build that has the CPU's
// fused (flash) kernel natively picks exactly what the CPU would pick for these inputs (same
// checks, same torch.backends toggles), so the device runs the kernel the CPU runs; any other
// build keeps the math path (where its matmul numerics apply).
static std::atomic<bool> g_sdp_cpu_choice{false};

static int64_t neuron_fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const std::optional<at::Tensor>& attn_mask, double dropout_p,
                                       bool is_causal, std::optional<double> scale, bool enable_gqa) {
  if (!g_sdp_cpu_choice.load(std::memory_order_relaxed)) return static_cast<int64_t>(at::SDPBackend::math);
  // torch.compile with dynamic shapes traces with symbolic sizes: a CPU view of such a tensor cannot
  // be made (its storage size is symbolic), so the traced graph takes the math decomposition, which
  // any device can run (values within tolerance of the fused kernel's; eager calls keep the CPU's choice)
  auto symbolic = [](const at::Tensor& t) {
    for (const auto& s : t.sym_sizes()) if (s.is_heap_allocated()) return true;
    for (const auto& s : t.sym_strides()) if (s.is_heap_allocated()) return true;
    return t.sym_storage_offset().is_heap_allocated();
  };
  if (symbolic(q) || symbolic(k) || symbolic(v) || (attn_mask.has_value() && attn_mask->defined() && symbolic(*attn_mask)))
    return static_cast<int64_t>(at::SDPBackend::math);
  // The CPU's checks read requires_grad (a fused kernel cannot train with some inputs): keep it.
  auto cpu_like = [](const at::Tensor& t) {
    at::Tensor c = view_as_cpu(t);
    if (t.requires_grad()) c.set_requires_grad(true);
    return c;
  };
  std::optional<at::Tensor> mask;
  if (attn_mask.has_value() && attn_mask->defined()) mask = cpu_like(*attn_mask);
  // The CPU's own choice, through the dispatcher (aten::_fused_sdp_choice -> the CPU stub). The
  // choice reads shapes, dtypes and flags only, so the CPU views of FakeTensors (torch.compile's
  // tracing reaches here through the op's Meta kernel) serve as well as real ones: the call must
  // not go back to the FakeTensorMode that is active, which refuses non-fake tensors.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  return at::_fused_sdp_choice(cpu_like(q), cpu_like(k), cpu_like(v), mask, dropout_p, is_causal, scale,
                               enable_gqa);
}
}  // namespace neuron_emu
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &::neuron_emu::neuron_fused_sdp_choice)
}  // namespace at::native
namespace neuron_emu {

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
}
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron_sparse_fallback>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron_sparse_fallback>());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_copy_from", &copy_from);
  m.impl("_copy_from_and_resize", &copy_from_and_resize);
  m.impl("_efficientzerotensor", &efficient_zerotensor);
  m.impl("convolution_overrideable", torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
  m.impl("convolution_backward_overrideable", torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
  m.impl("mode.values", torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
}

TORCH_LIBRARY_IMPL(aten, Conjugate, m) { m.impl("_copy_from", torch::CppFunction::makeFallthrough()); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { m.impl("_copy_from", torch::CppFunction::makeFallthrough()); }

// ------------------------------------------------------------------ autocast (CUDA-like lists)
using at::autocast::CastPolicy;
#define NEURON_AC_LOW(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_AC_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_AC_FP32_OPT(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_AC_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NEURON_AC_LOW)
  AT_FORALL_FP32(NEURON_AC_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_AC_FP32_OPT)
  AT_FORALL_PROMOTE(NEURON_AC_PROMOTE)
}

// ------------------------------------------------------------------ Python-facing API
// Registers the boxed fallback as a direct PrivateUse1 kernel for `names`, so that ops whose
// functional form would otherwise go through a generic composite (e.g. add.Tensor -> add.out)
// reach the device under their own name and run the CPU kernel, like a real backend's kernels.
static void register_kernels(const std::vector<std::string>& names) {
  static torch::Library* lib =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  for (const auto& n : names) lib->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
}

// The same for the sparse layouts: a direct SparsePrivateUse1 / SparseCsrPrivateUse1 kernel for
// every op the CPU has a SparseCPU / SparseCsrCPU kernel for, so that the device runs the CPU's
// sparse kernel where a CompositeExplicitAutograd default (is_coalesced, ...) would otherwise win
// over the sparse fallback.
static void register_sparse_kernels(const std::vector<std::string>& coo, const std::vector<std::string>& compressed) {
  static torch::Library* lib_coo = new torch::Library(torch::Library::IMPL, "aten",
                                                      c10::DispatchKey::SparsePrivateUse1, __FILE__, __LINE__);
  static torch::Library* lib_csr = new torch::Library(torch::Library::IMPL, "aten",
                                                      c10::DispatchKey::SparseCsrPrivateUse1, __FILE__, __LINE__);
  for (const auto& n : coo) lib_coo->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_sparse_fallback>());
  for (const auto& n : compressed)
    lib_csr->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_sparse_fallback>());
}

// Direct kernels for the composite view ops (transpose.int, permute, ...) that the active build's
// view_as_copy defects name.  Such an op normally never reaches the device under its own name: its
// CompositeExplicitAutograd kernel runs for the device and only the as_strided it calls arrives.
// Registered here, it reaches the boxed fallback (the router sends it to the Python handler, which
// applies the defect).  The registrations live in their own library, replaced on every build
// change, so a build without such defects keeps the composite (fast) path for every view op.
static std::unique_ptr<torch::Library> g_defect_lib;

static void set_defect_kernels(const std::vector<std::string>& names) {
  g_defect_lib.reset();  // deregisters the previous build's kernels
  if (names.empty()) return;
  g_defect_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                                  __FILE__, __LINE__);
  for (const auto& n : names)
    g_defect_lib->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
}

static void init_hooks() {
  static bool done = false;
  if (done) return;
  done = true;
  at::RegisterPrivateUse1HooksInterface(new NeuronHooks());
}

// The autograd engine sizes its per-device worker threads once, at the first backward of the
// process.  If that backward ran (on the CPU) before this extension registered the device, the
// engine has no queue for device index 0 and every neuron backward hits an internal assert.  Give
// it the queue and worker thread it would have made had the device existed then.
struct EngineAccess : torch::autograd::Engine {
  static std::vector<std::shared_ptr<torch::autograd::ReadyQueue>>& queues(torch::autograd::Engine& e) {
    return e.*(&EngineAccess::device_ready_queues_);
  }
  static bool started(torch::autograd::Engine& e) {
    return static_cast<bool>(e.*(&EngineAccess::thread_pool_shared_));
  }
};

static bool fix_autograd_device_threads() {
  auto& engine = torch::autograd::Engine::get_default_engine();
  if (!EngineAccess::started(engine)) return false;  // not started yet: it will count the device
  auto& queues = EngineAccess::queues(engine);
  if (!queues.empty()) return false;
  queues.push_back(std::make_shared<torch::autograd::ReadyQueue>());
  std::thread t(&torch::autograd::Engine::thread_init, &engine, 0, queues[0], true);
  t.detach();
  return true;
}

}  // namespace neuron_emu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace neuron_emu;
  m.def("init_hooks", &init_hooks);
  m.def("fix_autograd_device_threads", &fix_autograd_device_threads);
  m.def("register_kernels", &register_kernels);
  m.def("register_sparse_kernels", &register_sparse_kernels);
  m.def("set_defect_kernels", &set_defect_kernels);
  m.def("set_router", [](py::object classifier, py::object handler) {
    Py_XINCREF(classifier.ptr());
    Py_XINCREF(handler.ptr());
    g_classifier = classifier.ptr();
    g_handler = handler.ptr();
  });
  m.def("set_build", [](const std::string& name, bool ftz) {
    std::lock_guard<std::mutex> lk(g_mu);
    g_build_name = name;
    g_ftz = ftz;
    g_ops.clear();
    for (auto& kv : g_counts) kv.second.warned = false;
  });
  m.def("set_strict", [](bool s) { g_strict = s; });
  m.def("set_sdp_cpu_choice", [](bool on) { g_sdp_cpu_choice = on; });
  m.def("set_sparse", [](bool on) { g_sparse = on; });
  m.def("get_strict", []() { return g_strict.load(); });
  m.def("set_tracking", [](bool s) { g_track = s; });
  m.def("set_raw", [](int r) {
    int prev = g_raw;
    g_raw = r;
    return prev;
  });
  m.def("get_raw", []() { return g_raw; });
  m.def("record", [](const std::string& name, bool fallback) {
    if (!g_track.load()) return false;
    std::lock_guard<std::mutex> lk(g_mu);
    Counts* c = counts_for(name);
    if (!fallback) {
      c->native++;
      return false;
    }
    c->fallback++;
    if (c->warned) return false;
    c->warned = true;
    return true;
  });
  m.def("get_counts", []() {
    std::lock_guard<std::mutex> lk(g_mu);
    py::dict d;
    for (auto& kv : g_counts) {
      if (kv.second.native == 0 && kv.second.fallback == 0) continue;
      d[py::str(kv.first)] = py::make_tuple(kv.second.native, kv.second.fallback);
    }
    return d;
  });
  m.def("clear_counts", []() {
    std::lock_guard<std::mutex> lk(g_mu);
    // The once-per-operator warning stays once per process: clearing the counts does not re-arm it.
    for (auto& kv : g_counts) {
      bool warned = kv.second.warned;
      kv.second = Counts{};
      kv.second.warned = warned;
    }
  });
  m.def("default_twin", []() { return twin_of(default_generator()); });
  m.def("generator_twin", [](const at::Generator& g) {
    TORCH_CHECK(g.device().type() == kNeuron, "not a neuron generator");
    return twin_of(g);
  });
  m.def("scalar_type_code", [](const at::Tensor& t) { return static_cast<int>(t.scalar_type()); });
}
