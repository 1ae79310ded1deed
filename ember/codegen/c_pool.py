"""The thread pool that runs the C target's parallel loops (C source, emitted once per library).

A parallel loop is outlined by the C renderer into `static void region(void* closure, int64_t begin, int64_t end)`
and run by `ember_parallel_for(region, &closure, begin, end, chunk, threads)`. Unlike an OpenMP
`parallel for schedule(static)`, whose region waits for its slowest thread (on a core shared with a busy process,
one time slice of someone else's work per region), the pool balances as it goes and never waits for a thread
that has not started:

- The iterations are taken `chunk` at a time from counters (`ember_pool_next`), one per home range: thread k's
  home is the k-th of `threads` equal runs of chunks, in order, and it takes its own chunks first, then the other
  ranges' until none is left. Every thread thus computes the same slice of each loop while the machine is fair,
  so a kernel reads its producer's output from its own core's cache (from a single shared counter, which thread
  took which channel block changed from kernel to kernel: RegNetX-400MF at 2 threads 5.0-5.3 -> 4.4 ms, BERT-4
  34.5 -> 31.7), and a thread that is late or slow has its chunks taken by the others. A worker that wakes late
  finds the counters spent and goes back to waiting; the caller then waits only for the workers that are inside a
  chunk (`ember_pool_active`).
- A region is published as one atomic word, odd while open, made even again (closed) by the caller when the
  counter is spent. A worker counts itself in (`active`) and then checks that the word is the one it saw: a
  worker that arrives after the close leaves without touching the region (seq_cst on both sides).
- Idle threads poll for a while (`EMBER_POOL_SPIN` polls, default 2000: about 50 us of `pause`) and then block on
  a condition variable; the caller waits for its workers the same way. Polling never calls sched_yield: on a core
  shared with a busy process a yield hands that process a whole time slice.
- A core shared with another process is noticed and the workers stop polling for a while (`ember_pool_calm_until`,
  EMBER_POOL_HOLD_NS: 100 ms, renewed while it lasts): a worker notices it when the monotonic clock jumps by more
  than 50 us between two of its polls (it lost its core), the caller when it waited longer than 50 us, and longer
  than two of its own chunks, for a worker inside a chunk. Meanwhile workers poll only EMBER_POOL_SPIN / 16 times
  after a region and then block, so they are runnable only while there is work. That matters twice. A polling
  worker is always runnable: the scheduler time-slices it against the busy process and its slice ends at any
  moment, mostly inside a chunk, and the caller then waits out the busy process's slice (milliseconds) at the end
  of the region. A worker woken for a region runs a short burst with a fresh slice and is rarely preempted inside a
  chunk. And with two always-runnable threads beside a busy one, the scheduler leaves the caller on the shared core
  about half the time (serial code and its chunks at half speed); a worker that sleeps carries little load, and the
  caller stays on the free core.
- A worker still inside a chunk long after the caller ran out of chunks (twice the caller's mean chunk time, and 50
  us) has most likely lost its core to another process, which then holds it for a whole time slice (milliseconds)
  while the caller waits: the caller moves it to a CPU about to be idle (its own, then those of workers not in the
  region; `ember_pool_rescue`) and blocks; the worker finishes its chunk there at once, and the next region puts it
  back. BERT-4 at 2 threads beside a process spinning on core 1: 55-56 -> 49-50 ms (quiet 37 ms both ways; the
  busy core's half is worth at most 1.33x), about 3 rescues a run; EfficientNet-B0 (short chunks) unchanged.
- Worker k keeps to the k-th CPU the process may use once the caller's current CPU is set aside (`ember_pool_place`;
  EMBER_POOL_PIN=0 leaves them unpinned). Woken after a pause, an unpinned worker is placed on its waker's CPU
  (Linux's wake affinity) and polls there beside the caller until the load balancer moves one of them,
  milliseconds later: in onnxruntime/OpenVINO turns with 50 ms pauses (bench/zoo.py), MobileNetV2 at 2 threads
  took 5.0 ms, more than at 1 thread, and 3.5 ms pinned. Beside a busy core (bench/contention.py, busy/quiet
  median at 2 threads) pinning also helped: EfficientNet-B0 1.65 -> 1.27, BERT-4 1.72 -> 1.54, ResNet-18 1.36 ->
  1.30 (the caller keeps the free core; the pinned worker's chunks are taken by the caller when it is late).
  The caller, the application's thread, is never pinned: each region reads its CPU (`sched_getcpu`) and moves a
  worker that is kept to it (with fixed CPUs, a caller the scheduler had put on the worker's CPU shared it for the
  rest of the run: MobileNetV3-small at 2 threads 2.1-2.3 ms, slower than at 1 thread; 1.3-1.6 with the move).
- Workers are created on the first region that needs them (at most EMBER_POOL_MAX - 1) and kept; a worker that
  cannot be created is not waited for (its share runs on the others). One region at a time: a caller that finds
  the pool taken (another host thread's region) runs its loop serially. A forked child starts with no workers.
- The thread count: `ember_set_num_threads(n)`, else $OMP_NUM_THREADS, else the machine's online cores.
  A target's `-threads=N` is passed to each region instead.
"""

from __future__ import annotations

POOL_DECL = """\
void ember_parallel_for(void (*region)(void* closure, int64_t begin, int64_t end), void* closure, int64_t begin,
                        int64_t end, int64_t chunk, int32_t threads);"""

POOL_SOURCE = r"""
// -- the thread pool of parallel loops (ember/codegen/c_pool.py) -------------------------------------------
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#define EMBER_POOL_MAX 64
#define EMBER_POOL_GAP_NS 50000         // a longer gap between two polls: the thread lost its core
#define EMBER_POOL_HOLD_NS 100000000    // how long workers stay calm after that (renewed while it lasts)
static pthread_mutex_t ember_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ember_pool_wake = PTHREAD_COND_INITIALIZER;  // workers wait for a region
static pthread_cond_t ember_pool_idle = PTHREAD_COND_INITIALIZER;  // the caller waits for its workers
static _Atomic uint64_t ember_pool_word;     // odd: a region is open
// per home range: the next iteration to take, each counter on a cache line of its own (two lines on x86, whose
// prefetcher fetches lines in pairs): side by side, every chunk a thread took from its own counter moved the line
// away from the other thread (false sharing; a 3136 x 96 x 96 product took longer at 2 threads than at 1)
static struct { _Alignas(128) _Atomic int64_t at; } ember_pool_next[EMBER_POOL_MAX];
static int64_t ember_pool_home_end[EMBER_POOL_MAX];      // per home range: its end
static int32_t ember_pool_homes;                         // home ranges of the open region (its threads)
static _Atomic int32_t ember_pool_active;    // workers inside the open region
static _Atomic int32_t ember_pool_inside[EMBER_POOL_MAX];  // per worker: taking chunks of the open region
static _Atomic int32_t ember_pool_sleepers;  // workers blocked on ember_pool_wake
static _Atomic int32_t ember_pool_waiting;   // the caller is blocked on ember_pool_idle
static _Atomic int32_t ember_pool_busy;      // a caller holds the pool
static int32_t ember_pool_workers;           // workers 1..this exist
static int32_t ember_pool_threads;           // ember_set_num_threads (0: the default)
static int32_t ember_pool_spin = -1;        // polls before an idle thread blocks (EMBER_POOL_SPIN)
static _Atomic int64_t ember_pool_calm_until;  // till then (monotonic ns) a core is shared: workers poll briefly
static void (*ember_pool_fn)(void*, int64_t, int64_t);  // the open region: written before the word opens it
static void* ember_pool_closure;
static int64_t ember_pool_chunk;
static int32_t ember_pool_limit;             // workers below this index take part

static void ember_pool_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t ember_pool_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void ember_pool_contended(int64_t now) { atomic_store(&ember_pool_calm_until, now + EMBER_POOL_HOLD_NS); }

// Polls until the word is no longer `w`, at most `polls` times; a worker that finds it lost its core on the way
// tells the pool and stops. Returns whether the word moved on.
static int ember_pool_poll(uint64_t w, int32_t polls) {
  int64_t last = ember_pool_now();
  for (int32_t n = 1; n <= polls; n++) {
    if (atomic_load(&ember_pool_word) != w) return 1;
    ember_pool_relax();
    if ((n & 15) == 0) {
      int64_t now = ember_pool_now();
      if (now - last > EMBER_POOL_GAP_NS) {
        ember_pool_contended(now);
        break;
      }
      last = now;
    }
  }
  return atomic_load(&ember_pool_word) != w;
}

// Takes chunks of its home range, then of the others' till none is left; returns how many it ran.
static int64_t ember_pool_take(int32_t home, void (*fn)(void*, int64_t, int64_t), void* closure, int64_t chunk) {
  int64_t taken = 0;
  for (int32_t h = 0; h < ember_pool_homes; h++) {
    int32_t j = (home + h) % ember_pool_homes;
    int64_t end = ember_pool_home_end[j];
    for (;;) {
      int64_t b = atomic_fetch_add(&ember_pool_next[j].at, chunk);
      if (b >= end) break;
      fn(closure, b, end - b > chunk ? b + chunk : end);
      taken++;
    }
  }
  return taken;
}

// Worker k keeps to one CPU of those the process may use, the k-th of them once the caller's own CPU is set aside:
// woken after a pause, an unpinned worker is placed on its waker's CPU (Linux's wake affinity) and shares it with
// the caller, polling, until the load balancer moves one of them, milliseconds later (MobileNetV2 at 2 threads,
// calls after 50 ms idle: 5.9 ms, slower than 1 thread's 5.3; pinned 3.x). The caller is not pinned (it is the
// application's thread): where the scheduler moves it onto a worker's CPU, the next region moves the workers
// (`ember_pool_place`; MobileNetV3-small at 2 threads, caller on the worker's CPU: 2.3 ms, 0.9 beside it).
// EMBER_POOL_PIN=0 leaves the workers unpinned.
#if defined(__linux__) && defined(SYS_sched_getaffinity) && defined(SYS_sched_setaffinity) && defined(SYS_gettid)
#define EMBER_POOL_CAN_PIN 1
enum { EMBER_POOL_MASK_WORDS = 16, EMBER_POOL_MASK_BITS = 8 * sizeof(unsigned long) };  // masks of up to 1024 CPUs
static int32_t ember_pool_cpus[EMBER_POOL_MASK_WORDS * EMBER_POOL_MASK_BITS];  // the CPUs the process may use
static int32_t ember_pool_ncpus = -1;          // how many (-1: not read yet; 0: pinning is off)
static int32_t ember_pool_caller_cpu = -2;     // the caller's CPU when the workers were last placed
static int32_t ember_pool_placed;              // workers 1..this were placed then
int sched_getcpu(void);                        // glibc and musl (declared by <sched.h> under _GNU_SOURCE only)
static _Atomic int32_t ember_pool_cpu_of[EMBER_POOL_MAX];  // per worker: the CPU it is to keep to (-1: any)
static _Atomic int64_t ember_pool_tid[EMBER_POOL_MAX];     // per worker: its thread id, once it runs

static void ember_pool_set_cpu(int64_t tid, int32_t cpu) {
  unsigned long one[EMBER_POOL_MASK_WORDS] = {0};
  one[cpu / EMBER_POOL_MASK_BITS] = 1ul << (cpu % EMBER_POOL_MASK_BITS);
  syscall(SYS_sched_setaffinity, (pid_t)tid, sizeof one, one);
}

// Under ember_pool_busy: the CPUs the process may use (read once), and worker k's CPU: the k-th of them when the
// caller's is set aside; a worker whose CPU changed is moved now.
static void ember_pool_place(void) {
  if (ember_pool_ncpus < 0) {
    const char* env = getenv("EMBER_POOL_PIN");
    unsigned long mask[EMBER_POOL_MASK_WORDS] = {0};
    long got = env != NULL && atoi(env) == 0 ? 0 : syscall(SYS_sched_getaffinity, 0, sizeof mask, mask);
    int32_t n = 0;
    for (int32_t c = 0; got > 0 && c < (int32_t)(got * 8) && c < EMBER_POOL_MASK_WORDS * EMBER_POOL_MASK_BITS; c++)
      if ((mask[c / EMBER_POOL_MASK_BITS] >> (c % EMBER_POOL_MASK_BITS)) & 1ul) ember_pool_cpus[n++] = c;
    ember_pool_ncpus = n >= 2 ? n : 0;  // one CPU allowed: nothing to spread over
    for (int32_t k = 0; k < EMBER_POOL_MAX; k++) atomic_store(&ember_pool_cpu_of[k], -1);
  }
  if (ember_pool_ncpus == 0) return;
  int32_t caller = sched_getcpu(), at = 0;
  if (caller == ember_pool_caller_cpu && ember_pool_placed == ember_pool_workers) return;
  ember_pool_caller_cpu = caller;
  ember_pool_placed = ember_pool_workers;
  while (at < ember_pool_ncpus && ember_pool_cpus[at] != caller) at++;  // at == ncpus: not one of ours
  int32_t others = at < ember_pool_ncpus ? ember_pool_ncpus - 1 : ember_pool_ncpus;
  for (int32_t k = 1; k <= ember_pool_workers; k++) {
    int32_t i = (k - 1) % others;
    int32_t cpu = ember_pool_cpus[i < at ? i : i + 1];  // the i-th CPU after the caller's is set aside
    if (atomic_exchange(&ember_pool_cpu_of[k], cpu) == cpu) continue;
    int64_t tid = atomic_load(&ember_pool_tid[k]);
    if (tid != 0) ember_pool_set_cpu(tid, cpu);  // not running yet: it reads its CPU when it starts
  }
}

static void ember_pool_pin(int32_t k) {  // a new worker: its thread id, then its CPU (again if the caller moved it)
  atomic_store(&ember_pool_tid[k], (int64_t)syscall(SYS_gettid));
  for (int32_t cpu = atomic_load(&ember_pool_cpu_of[k]), was = -1; cpu >= 0 && cpu != was;
       was = cpu, cpu = atomic_load(&ember_pool_cpu_of[k]))
    ember_pool_set_cpu(atomic_load(&ember_pool_tid[k]), cpu);
}

// Under ember_pool_busy, the caller about to block for workers still inside a chunk long after its own ran out:
// such a worker has most likely lost its core to another process (the scheduler gives that one a whole time slice,
// milliseconds). Each is moved to a CPU about to be idle (the caller's, then those of workers not inside the
// region), where it finishes its chunk at once; the next region puts the workers back (`ember_pool_place`).
static void ember_pool_rescue(void) {
  if (ember_pool_ncpus <= 0) return;
  int32_t free_cpus[EMBER_POOL_MAX], nfree = 0;
  free_cpus[nfree++] = sched_getcpu();
  if (free_cpus[0] < 0 || free_cpus[0] >= EMBER_POOL_MASK_WORDS * EMBER_POOL_MASK_BITS) return;
  for (int32_t k = 1; k <= ember_pool_workers; k++) {
    int32_t cpu = atomic_load(&ember_pool_cpu_of[k]);
    if (!atomic_load(&ember_pool_inside[k]) && cpu >= 0 && cpu != free_cpus[0]) free_cpus[nfree++] = cpu;
  }
  for (int32_t k = 1, i = 0; k <= ember_pool_workers; k++) {
    int64_t tid = atomic_load(&ember_pool_tid[k]);
    if (!atomic_load(&ember_pool_inside[k]) || tid == 0) continue;
    int32_t cpu = free_cpus[i++ % nfree];
    if (atomic_exchange(&ember_pool_cpu_of[k], cpu) != cpu) ember_pool_set_cpu(tid, cpu);
  }
  ember_pool_caller_cpu = -2;  // placed anew by the next region
}
#else
static void ember_pool_place(void) {}
static void ember_pool_pin(int32_t k) { (void)k; }
static void ember_pool_rescue(void) {}
#endif

static void* ember_pool_worker(void* arg) {
  int32_t k = (int32_t)(intptr_t)arg;
  uint64_t seen = 0;
  ember_pool_pin(k);
  for (;;) {
    uint64_t w = atomic_load(&ember_pool_word);
    if ((w & 1) && w != seen) {
      seen = w;
      atomic_fetch_add(&ember_pool_active, 1);
      if (atomic_load(&ember_pool_word) == w && k < ember_pool_limit) {  // still open: it stays till we leave
        atomic_store(&ember_pool_inside[k], 1);
        ember_pool_take(k, ember_pool_fn, ember_pool_closure, ember_pool_chunk);
        atomic_store(&ember_pool_inside[k], 0);
      }
      if (atomic_fetch_sub(&ember_pool_active, 1) == 1 && atomic_load(&ember_pool_waiting)) {
        pthread_mutex_lock(&ember_pool_mu);
        pthread_cond_broadcast(&ember_pool_idle);
        pthread_mutex_unlock(&ember_pool_mu);
      }
      continue;
    }
    int calm = ember_pool_now() < atomic_load(&ember_pool_calm_until);
    if (!ember_pool_poll(w, calm ? ember_pool_spin / 16 : ember_pool_spin)) {
      pthread_mutex_lock(&ember_pool_mu);
      atomic_fetch_add(&ember_pool_sleepers, 1);
      while (atomic_load(&ember_pool_word) == w) pthread_cond_wait(&ember_pool_wake, &ember_pool_mu);
      atomic_fetch_sub(&ember_pool_sleepers, 1);
      pthread_mutex_unlock(&ember_pool_mu);
    }
  }
  return NULL;
}

static void ember_pool_after_fork(void) {  // the child has none of the parent's workers
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  ember_pool_mu = mu;
  ember_pool_wake = ember_pool_idle = cv;
  ember_pool_workers = 0;
#ifdef EMBER_POOL_CAN_PIN
  ember_pool_placed = 0;
  for (int32_t k = 0; k < EMBER_POOL_MAX; k++) atomic_store(&ember_pool_tid[k], 0);
#endif
  atomic_store(&ember_pool_active, 0);
  for (int32_t k = 0; k < EMBER_POOL_MAX; k++) atomic_store(&ember_pool_inside[k], 0);
  atomic_store(&ember_pool_sleepers, 0);
  atomic_store(&ember_pool_waiting, 0);
  atomic_store(&ember_pool_busy, 0);
}

static int32_t ember_pool_default_threads(void) {
  const char* env = getenv("OMP_NUM_THREADS");
  if (env != NULL && atoi(env) > 0) return atoi(env);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int32_t)n : 1;
}

static void ember_pool_start(int32_t workers) {  // under ember_pool_busy
  if (ember_pool_spin < 0) {
    const char* env = getenv("EMBER_POOL_SPIN");
    ember_pool_spin = env != NULL ? atoi(env) : 2000;
    pthread_atfork(NULL, NULL, ember_pool_after_fork);
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  while (ember_pool_workers < workers) {
    pthread_t t;
    if (pthread_create(&t, &attr, ember_pool_worker, (void*)(intptr_t)(ember_pool_workers + 1)) != 0) break;
    ember_pool_workers++;
  }
  pthread_attr_destroy(&attr);
}

// Runs fn(closure, b, e) over [begin, end) in chunks of `chunk` iterations on `threads` threads (0: the library's
// count), the calling thread included; returns when every chunk is done.
void ember_parallel_for(void (*fn)(void*, int64_t, int64_t), void* closure, int64_t begin, int64_t end, int64_t chunk,
                        int32_t threads) {
  int32_t nt = threads > 0 ? threads : ember_pool_threads > 0 ? ember_pool_threads : ember_pool_default_threads();
  int32_t free_ = 0;
  if (chunk < 1) chunk = 1;
  if (nt <= 1 || end - begin <= chunk || !atomic_compare_exchange_strong(&ember_pool_busy, &free_, 1)) {
    fn(closure, begin, end);
    return;
  }
  nt = nt < EMBER_POOL_MAX ? nt : EMBER_POOL_MAX;
  ember_pool_start(nt - 1);
  ember_pool_place();
  ember_pool_fn = fn;
  ember_pool_closure = closure;
  ember_pool_chunk = chunk;
  ember_pool_limit = nt;
  int64_t chunks = (end - begin + chunk - 1) / chunk;  // thread k's home: its share of the chunks, in order
  for (int32_t k = 0; k < nt; k++) {
    atomic_store(&ember_pool_next[k].at, begin + chunks * k / nt * chunk);
    ember_pool_home_end[k] = k == nt - 1 ? end : begin + chunks * (k + 1) / nt * chunk;
  }
  ember_pool_homes = nt;
  uint64_t open = atomic_load(&ember_pool_word) + 1;
  atomic_store(&ember_pool_word, open);
  if (atomic_load(&ember_pool_sleepers) > 0) {
    pthread_mutex_lock(&ember_pool_mu);
    pthread_cond_broadcast(&ember_pool_wake);
    pthread_mutex_unlock(&ember_pool_mu);
  }
  int64_t start = ember_pool_now();
  int64_t mine = ember_pool_take(0, fn, closure, chunk);
  atomic_store(&ember_pool_word, open + 1);  // closed: a worker arriving now leaves the region alone
  int64_t done = ember_pool_now();
  int64_t late = mine > 0 ? 2 * (done - start) / mine : 0;  // a worker inside a chunk this long after us: stalled
  late = late > EMBER_POOL_GAP_NS ? late : EMBER_POOL_GAP_NS;
  int rescued = 0;
  for (int32_t n = 0; n < ember_pool_spin && atomic_load(&ember_pool_active) != 0; n++) {
    ember_pool_relax();
    if ((n & 15) == 15 && ember_pool_now() - done >= late) break;
  }
  if (atomic_load(&ember_pool_active) != 0) {  // block till the workers are out; rescue them once they are late
    pthread_mutex_lock(&ember_pool_mu);
    atomic_store(&ember_pool_waiting, 1);
    while (atomic_load(&ember_pool_active) != 0) {
      int64_t left = done + late - ember_pool_now();
      if (rescued) {
        pthread_cond_wait(&ember_pool_idle, &ember_pool_mu);
      } else if (left <= 0) {
        ember_pool_rescue();
        rescued = 1;
      } else {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);  // the condition variable's clock
        int64_t ns = until.tv_nsec + left;
        until.tv_sec += ns / 1000000000;
        until.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&ember_pool_idle, &ember_pool_mu, &until);
      }
    }
    atomic_store(&ember_pool_waiting, 0);
    pthread_mutex_unlock(&ember_pool_mu);
  }
  int64_t waited = ember_pool_now() - done;  // for workers inside a chunk: longer than two of ours, one lost its core
  if (waited > late) ember_pool_contended(done);
  atomic_store(&ember_pool_busy, 0);
}

// Sets the number of threads of the library's parallel loops (default: $OMP_NUM_THREADS, else all cores).
void ember_set_num_threads(int32_t n) {
  ember_pool_threads = n > 0 ? n : 0;
#ifdef _OPENMP
  if (n > 0) omp_set_num_threads(n);
#endif
}

// The number of threads the library's parallel loops use.
int32_t ember_get_num_threads(void) {
  return ember_pool_threads > 0 ? ember_pool_threads : ember_pool_default_threads();
}
"""
