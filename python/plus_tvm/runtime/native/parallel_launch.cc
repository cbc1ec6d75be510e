// TVM's parallel loops on the OpenMP pool the library kernels run on.
//
// A CPU model compiled by plus runs its convolutions and GEMMs in oneDNN, whose threads are
// OpenMP's (the libgomp torch loads), and its generated TIR kernels in TVM's own thread pool.
// On a machine with as many cores as threads the two pools fight: after every oneDNN call
// OpenMP's workers spin, waiting for the next parallel region, on the cores TVM's workers need
// for the TIR kernel that follows, and TVM's workers sleep between kernels, so every parallel
// TIR loop pays a wake-up. Here TVM's generated code launches its parallel loops on OpenMP
// instead: one team for everything, already awake between the library calls.
//
// How: generated code calls ``__TVMBackendParallelLaunch`` / ``__TVMBackendParallelBarrier``
// through pointers that tvm-ffi fills from its registry of context symbols when a library is
// loaded or a JIT module starts (``TVMFFIEnvModRegisterContextSymbol``). ``parallel_install``
// registers the two functions below (once per process), which modules loaded from then on
// call. They hand every launch to TVM's own functions (captured from the registry before) unless
// the calling thread has asked for OpenMP (``parallel_use_openmp``, a thread-local switch that
// ``CompiledModel`` turns on around its VM calls): other TVM code in the process keeps TVM's
// pool.
//
// The lambda's contract is TVM's (``c_backend_api.h``): task ``i`` of ``penv->num_task``;
// ``num_task`` 0 asks for the pool's size (here ``omp_get_max_threads()``, the count torch sets).
// A launch from inside an OpenMP region goes to TVM's pool (a nested team would oversubscribe),
// a barrier of a group launched on OpenMP is an OpenMP barrier, and an error a task raised on a
// worker thread is raised again on the calling thread (as TVM's pool does).

#include <omp.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace plus_native {
namespace {

struct GroupEnv {  // TVMParallelGroupEnv
  void* sync_handle;
  int32_t num_task;
};
using Lambda = int (*)(int task_id, GroupEnv* penv, void* cdata);
using LaunchFn = int (*)(Lambda, void*, int);
using BarrierFn = int (*)(int, GroupEnv*);

constexpr const char* kLaunchSymbol = "__TVMBackendParallelLaunch";
constexpr const char* kBarrierSymbol = "__TVMBackendParallelBarrier";

LaunchFn tvm_launch = nullptr;  // TVM's own, as registered before ours
BarrierFn tvm_barrier = nullptr;
bool installed = false;
std::once_flag install_once;
thread_local bool openmp_here = false;
std::atomic<int64_t> openmp_launches{0};
char openmp_group;  // the sync_handle of groups launched on OpenMP

int Launch(Lambda f, void* cdata, int num_task) {
  if (!openmp_here || omp_in_parallel()) return tvm_launch(f, cdata, num_task);
  int threads = num_task > 0 ? num_task : omp_get_max_threads();
  openmp_launches.fetch_add(1, std::memory_order_relaxed);
  if (threads <= 1) {
    GroupEnv env{&openmp_group, 1};
    return f(0, &env, cdata);
  }
  int failed = 0;
  bool caller_failed = false;
  TVMFFIObjectHandle worker_error = nullptr;  // a task's error, raised on a worker's thread
  std::mutex mutex;
#pragma omp parallel num_threads(threads)
  {
    GroupEnv env{&openmp_group, omp_get_num_threads()};
    int task = omp_get_thread_num();
    int rc = f(task, &env, cdata);
    if (rc != 0) {
      TVMFFIObjectHandle error = nullptr;
      if (task != 0) TVMFFIErrorMoveFromRaised(&error);  // (the error lives in the thread's TLS)
      std::lock_guard<std::mutex> lock(mutex);
      failed = rc;
      caller_failed |= task == 0;
      if (worker_error == nullptr) {
        worker_error = error;
      } else if (error != nullptr) {
        TVMFFIObjectDecRef(error);
      }
    }
  }
  if (worker_error != nullptr) {  // the caller raises it, as TVM's pool does
    if (!caller_failed) TVMFFIErrorSetRaised(worker_error);
    TVMFFIObjectDecRef(worker_error);
  }
  return failed;
}

int Barrier(int task_id, GroupEnv* penv) {
  if (penv->sync_handle != &openmp_group) return tvm_barrier(task_id, penv);
#pragma omp barrier
  return 0;
}

bool Install() {
  std::call_once(install_once, [] {
    tvm::ffi::Module::VisitContextSymbols([](tvm::ffi::String name, void* symbol) {
      // the registry keeps every registration in order: the last one of a name is in force
      if (name == kLaunchSymbol) tvm_launch = reinterpret_cast<LaunchFn>(symbol);
      if (name == kBarrierSymbol) tvm_barrier = reinterpret_cast<BarrierFn>(symbol);
    });
    if (tvm_launch == nullptr || tvm_barrier == nullptr) return;  // no TVM runtime loaded
    if (tvm_launch == &Launch) return;                           // (another copy of this file)
    installed =
        TVMFFIEnvModRegisterContextSymbol(kLaunchSymbol, reinterpret_cast<void*>(&Launch)) == 0 &&
        TVMFFIEnvModRegisterContextSymbol(kBarrierSymbol, reinterpret_cast<void*>(&Barrier)) == 0;
  });
  return installed;
}

bool UseOpenMP(bool on) {
  bool before = openmp_here;
  openmp_here = on && installed;
  return before;
}

int64_t Threads() { return omp_get_max_threads(); }

int64_t Launches() { return openmp_launches.load(); }

}  // namespace
}  // namespace plus_native

TVM_FFI_DLL_EXPORT_TYPED_FUNC(parallel_install, plus_native::Install);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(parallel_use_openmp, plus_native::UseOpenMP);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(parallel_threads, plus_native::Threads);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(parallel_launches, plus_native::Launches);
