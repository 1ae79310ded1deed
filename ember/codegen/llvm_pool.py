"""The thread pool that runs the llvm target's parallel loops: LLVM IR over libc's pthreads, no C compiler.

One pool per process, in a JIT module of its own (`POOL_IR`) compiled on first use and never freed: its workers
outlive any one kernel module, so their code and state must too. Kernel modules reach it through the symbol
`ember_pool_run`, which `load()` gives LLVM's dynamic linker (`llvm.add_symbol`) before the first module is
finalized; each module's `ember_parallel_for` (codegen.llvm.RUNTIME_IR) reads its own thread count and calls it.

    ember_pool_run(fn, closure, n, nt)   fn(closure, begin, end) over [0, n) in nt static chunks (2 <= nt <= n)

- Workers are created lazily, on the first region that needs them, and again when a region asks for more
  threads than exist (up to 63: chunk k runs on worker k, chunk 0 on the calling thread). A worker whose
  pthread_create fails is not made; its chunk, and those after it, run inline on the caller.
- A region is published as one atomic word, `generation << 8 | chunks`: a worker whose index is below
  `chunks` runs its chunk, the others go back to sleep. The caller counts its helpers back down (`pending`)
  and releases the pool.
- After a region a worker polls the word up to `spin` times (`pause` on x86) before it blocks on its own
  condition variable, so regions in quick succession (a model's kernels) do not pay a wake-up each; the
  caller polls `pending` the same way before it blocks. `spin` adapts, from 0 to `SPIN` (environment
  `EMBER_POOL_SPIN`, default 4000, ~100 us): the caller doubles it when its helpers were caught spinning and
  done in time, and halves it when it had to block, as it must where a helper shares a core with the caller
  or with other processes (spinning then only delays the thread waited for); every 1024th region starts
  again from `SPIN`, to notice cores that became free.
- One region at a time: a caller takes the pool with a compare-and-swap; a region that finds it taken (another
  host thread's region, or a parallel loop nested inside a running region) runs serially on its own thread.
- Workers are detached threads blocked in pthread_cond_wait when idle: process exit does not wait for them.
  A forked child starts with no workers (`os.register_at_fork` resets the pool).
"""

from __future__ import annotations

import ctypes
import os

SPIN = int(os.environ.get("EMBER_POOL_SPIN", 4000))  # the most polls before a thread blocks

POOL_IR = r"""
@pool_mu = internal global [64 x i8] zeroinitializer, align 64
@pool_done_cv = internal global [64 x i8] zeroinitializer, align 64
@pool_cv = internal global [64 x [64 x i8]] zeroinitializer, align 64  ; worker k waits on pool_cv[k]
@pool_word = internal global i64 0, align 64                          ; generation << 8 | chunks
@pool_pending = internal global i32 0, align 64                       ; workers still in the region
@pool_busy = internal global i32 0, align 64                          ; 1 while a region runs
@pool_spin = internal global i32 SPIN, align 64                       ; polls before blocking (adaptive)
@ember_pool_workers = global i64 0, align 64                          ; workers 1..this exist
@pool_start = internal global [64 x i64] zeroinitializer              ; the word a new worker starts from
@pool_asleep = internal global [64 x i8] zeroinitializer              ; worker k blocked (under pool_mu)
@pool_fn = internal global ptr null, align 64
@pool_closure = internal global ptr null
@pool_n = internal global i64 0
@pool_chunk = internal global i64 0

declare i32 @pthread_mutex_init(ptr, ptr)
declare i32 @pthread_cond_init(ptr, ptr)
declare i32 @pthread_mutex_lock(ptr)
declare i32 @pthread_mutex_unlock(ptr)
declare i32 @pthread_cond_wait(ptr, ptr)
declare i32 @pthread_cond_signal(ptr)
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_detach(i64)
RELAX_DECL

define internal void @relax() {
  RELAX_CALL
  ret void
}

; a fresh pool, no workers: at load, and in a forked child (the parent's workers are not there)
define void @ember_pool_init() {
entry:
  %r0 = call i32 @pthread_mutex_init(ptr @pool_mu, ptr null)
  %r1 = call i32 @pthread_cond_init(ptr @pool_done_cv, ptr null)
  br label %cv
cv:
  %k = phi i64 [ 0, %entry ], [ %k1, %cv ]
  %p = getelementptr [64 x [64 x i8]], ptr @pool_cv, i64 0, i64 %k
  %r2 = call i32 @pthread_cond_init(ptr %p, ptr null)
  %k1 = add i64 %k, 1
  %more = icmp ult i64 %k1, 64
  br i1 %more, label %cv, label %done
done:
  store i64 0, ptr @ember_pool_workers
  store i32 0, ptr @pool_pending
  store i32 0, ptr @pool_busy
  ret void
}

; chunk k of [0, n): [k * chunk, min((k + 1) * chunk, n)), nothing when empty
define internal void @run_chunk(ptr %fn, ptr %closure, i64 %n, i64 %chunk, i64 %k) {
entry:
  %begin = mul i64 %k, %chunk
  %e0 = add i64 %begin, %chunk
  %c = icmp slt i64 %e0, %n
  %end = select i1 %c, i64 %e0, i64 %n
  %some = icmp slt i64 %begin, %end
  br i1 %some, label %call, label %done
call:
  call void %fn(ptr %closure, i64 %begin, i64 %end)
  br label %done
done:
  ret void
}

; worker k (the argument): run chunk k of every region with more than k chunks
define internal ptr @worker(ptr %arg) {
entry:
  %idx = ptrtoint ptr %arg to i64
  %sp = getelementptr [64 x i64], ptr @pool_start, i64 0, i64 %idx
  %seen0 = load i64, ptr %sp
  %cvp = getelementptr [64 x [64 x i8]], ptr @pool_cv, i64 0, i64 %idx
  %asleep = getelementptr [64 x i8], ptr @pool_asleep, i64 0, i64 %idx
  br label %top
top:
  %seen = phi i64 [ %seen0, %entry ], [ %w, %finished ]
  %limit = load atomic i32, ptr @pool_spin monotonic, align 4
  br label %spin
spin:
  %i = phi i32 [ 0, %top ], [ %i1, %relax ]
  %ws = load atomic i64, ptr @pool_word acquire, align 8
  %changed = icmp ne i64 %ws, %seen
  br i1 %changed, label %check, label %again
again:
  %i1 = add i32 %i, 1
  %spun = icmp uge i32 %i1, %limit
  br i1 %spun, label %block, label %relax
relax:
  call void @relax()
  br label %spin
check:
  %chunks = and i64 %ws, 255
  %mine = icmp ult i64 %idx, %chunks
  br i1 %mine, label %run, label %block
block:
  %bseen = phi i64 [ %seen, %again ], [ %ws, %check ]
  %l0 = call i32 @pthread_mutex_lock(ptr @pool_mu)
  br label %bwait
bwait:
  %wb = load atomic i64, ptr @pool_word acquire, align 8
  %bnew = icmp ne i64 %wb, %bseen
  %bchunks = and i64 %wb, 255
  %bmine = icmp ult i64 %idx, %bchunks
  %go = and i1 %bnew, %bmine
  br i1 %go, label %woke, label %sleep
sleep:
  store i8 1, ptr %asleep
  %cw = call i32 @pthread_cond_wait(ptr %cvp, ptr @pool_mu)
  store i8 0, ptr %asleep
  br label %bwait
woke:
  %u0 = call i32 @pthread_mutex_unlock(ptr @pool_mu)
  br label %run
run:
  %w = phi i64 [ %ws, %check ], [ %wb, %woke ]
  %fn = load ptr, ptr @pool_fn
  %closure = load ptr, ptr @pool_closure
  %n = load i64, ptr @pool_n
  %chunk = load i64, ptr @pool_chunk
  call void @run_chunk(ptr %fn, ptr %closure, i64 %n, i64 %chunk, i64 %idx)
  %old = atomicrmw sub ptr @pool_pending, i32 1 acq_rel
  %last = icmp eq i32 %old, 1
  br i1 %last, label %wake_caller, label %finished
wake_caller:
  %l1 = call i32 @pthread_mutex_lock(ptr @pool_mu)
  %s1 = call i32 @pthread_cond_signal(ptr @pool_done_cv)
  %u1 = call i32 @pthread_mutex_unlock(ptr @pool_mu)
  br label %finished
finished:
  br label %top
}

; fn(closure, begin, end) over [0, n) in nt static chunks: chunk 0 here, chunk k on worker k
define void @ember_pool_run(ptr %fn, ptr %closure, i64 %n, i64 %nt) {
entry:
  %tid = alloca i64
  %x = cmpxchg ptr @pool_busy, i32 0, i32 1 acquire monotonic
  %got = extractvalue { i32, i1 } %x, 1
  br i1 %got, label %grow, label %serial
serial:
  call void %fn(ptr %closure, i64 0, i64 %n)
  ret void
grow:
  %word0 = load atomic i64, ptr @pool_word monotonic, align 8
  %have = load i64, ptr @ember_pool_workers
  br label %gcheck
gcheck:
  %k = phi i64 [ %have, %grow ], [ %k1, %created ]
  %k1 = add i64 %k, 1
  %need = icmp ult i64 %k1, %nt
  br i1 %need, label %create, label %publish
create:
  %sp = getelementptr [64 x i64], ptr @pool_start, i64 0, i64 %k1
  store i64 %word0, ptr %sp
  %arg = inttoptr i64 %k1 to ptr
  %rc = call i32 @pthread_create(ptr %tid, ptr null, ptr @worker, ptr %arg)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %created, label %publish
created:
  %t = load i64, ptr %tid
  %rd = call i32 @pthread_detach(i64 %t)
  store i64 %k1, ptr @ember_pool_workers
  br label %gcheck
publish:
  %nw = load i64, ptr @ember_pool_workers
  %ntm1 = sub i64 %nt, 1
  %few = icmp ult i64 %nw, %ntm1
  %helpers = select i1 %few, i64 %nw, i64 %ntm1
  %n1 = add i64 %n, %ntm1
  %chunk = udiv i64 %n1, %nt
  %alone = icmp eq i64 %helpers, 0
  br i1 %alone, label %inline_all, label %post
inline_all:
  call void %fn(ptr %closure, i64 0, i64 %n)
  br label %release
post:
  store ptr %fn, ptr @pool_fn
  store ptr %closure, ptr @pool_closure
  store i64 %n, ptr @pool_n
  store i64 %chunk, ptr @pool_chunk
  %h32 = trunc i64 %helpers to i32
  store atomic i32 %h32, ptr @pool_pending monotonic, align 4
  %gen = lshr i64 %word0, 8
  %gen1 = add i64 %gen, 1
  %probe = and i64 %gen1, 1023                      ; every 1024 regions, spin fully again
  %reset = icmp eq i64 %probe, 0
  %limit0 = load atomic i32, ptr @pool_spin monotonic, align 4
  %limit = select i1 %reset, i32 SPIN, i32 %limit0
  store atomic i32 %limit, ptr @pool_spin monotonic, align 4
  %gsh = shl i64 %gen1, 8
  %chunks = add i64 %helpers, 1
  %word = or i64 %gsh, %chunks
  %l0 = call i32 @pthread_mutex_lock(ptr @pool_mu)
  store atomic i64 %word, ptr @pool_word release, align 8
  br label %wake
wake:                                               ; signal the helpers that sleep, count them
  %j = phi i64 [ 1, %post ], [ %j1, %wnext ]
  %slept = phi i32 [ 0, %post ], [ %slept1, %wnext ]
  %ap = getelementptr [64 x i8], ptr @pool_asleep, i64 0, i64 %j
  %a = load i8, ptr %ap
  %isa = icmp ne i8 %a, 0
  br i1 %isa, label %signal, label %wnext
signal:
  %cvp = getelementptr [64 x [64 x i8]], ptr @pool_cv, i64 0, i64 %j
  %s0 = call i32 @pthread_cond_signal(ptr %cvp)
  br label %wnext
wnext:
  %inc = zext i1 %isa to i32
  %slept1 = add i32 %slept, %inc
  %j1 = add i64 %j, 1
  %wmore = icmp ule i64 %j1, %helpers
  br i1 %wmore, label %wake, label %own
own:
  %u0 = call i32 @pthread_mutex_unlock(ptr @pool_mu)
  %awake = icmp eq i32 %slept1, 0
  call void @run_chunk(ptr %fn, ptr %closure, i64 %n, i64 %chunk, i64 0)
  br label %extra
extra:                                              ; chunks of workers that could not be created
  %e = phi i64 [ %chunks, %own ], [ %e1, %extra_run ]
  %emore = icmp ult i64 %e, %nt
  br i1 %emore, label %extra_run, label %spin
extra_run:
  call void @run_chunk(ptr %fn, ptr %closure, i64 %n, i64 %chunk, i64 %e)
  %e1 = add i64 %e, 1
  br label %extra
spin:
  %i = phi i32 [ 0, %extra ], [ %i1, %relax ]
  %left = load atomic i32, ptr @pool_pending acquire, align 4
  %fin = icmp eq i32 %left, 0
  br i1 %fin, label %caught, label %again
caught:                                             ; helpers found spinning and done in time: spin longer
  %twice = shl i32 %limit, 1
  %grown = add i32 %twice, 16
  %big = icmp ugt i32 %grown, SPIN
  %up0 = select i1 %big, i32 SPIN, i32 %grown
  %up = select i1 %awake, i32 %up0, i32 %limit
  store atomic i32 %up, ptr @pool_spin monotonic, align 4
  br label %release
again:
  %i1 = add i32 %i, 1
  %spun = icmp uge i32 %i1, %limit
  br i1 %spun, label %block, label %relax
relax:
  call void @relax()
  br label %spin
block:
  %l1 = call i32 @pthread_mutex_lock(ptr @pool_mu)
  br label %bwait
bwait:
  %bleft = load atomic i32, ptr @pool_pending acquire, align 4
  %bfin = icmp eq i32 %bleft, 0
  br i1 %bfin, label %unblock, label %sleep
sleep:
  %cw = call i32 @pthread_cond_wait(ptr @pool_done_cv, ptr @pool_mu)
  br label %bwait
unblock:                                            ; helpers spinning yet late (no core of their own): spin less
  %u1 = call i32 @pthread_mutex_unlock(ptr @pool_mu)
  %down = lshr i32 %limit, 1
  store atomic i32 %down, ptr @pool_spin monotonic, align 4
  br label %release
release:
  store atomic i32 0, ptr @pool_busy release, align 4
  ret void
}
"""


def pool_ir(triple: str) -> str:
    """`POOL_IR` for a target triple: spin loops `pause` on x86 (LLVM has no portable spin hint)."""
    x86 = triple.startswith(("x86_64", "i386", "i486", "i586", "i686"))
    decl, call = ("declare void @llvm.x86.sse2.pause()", "call void @llvm.x86.sse2.pause()") if x86 else ("", "")
    return POOL_IR.replace("RELAX_DECL", decl).replace("RELAX_CALL", call).replace("SPIN", str(SPIN))


_workers_address: int | None = None  # of `ember_pool_workers`, once loaded


def load() -> None:
    """Compile the pool, once per process, and make `ember_pool_run` resolvable by kernel modules. Call before
    the first module that uses it is finalized, under codegen.llvm's lock (llvmlite is not thread-safe). The
    engine is never freed: idle workers sleep in its code."""
    global _workers_address
    if _workers_address is not None:
        return
    import llvmlite.binding as llvm  # the optional extra ember[llvm]; codegen.llvm checks for it

    triple = llvm.get_process_triple()
    mod = llvm.parse_assembly(pool_ir(triple))
    mod.triple = triple
    mod.verify()
    tm = llvm.Target.from_triple(triple).create_target_machine(opt=2, codemodel="jitdefault", jit=True)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    init = ctypes.CFUNCTYPE(None)(engine.get_function_address("ember_pool_init"))
    init()
    llvm.add_symbol("ember_pool_run", engine.get_function_address("ember_pool_run"))
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=init)
    _workers_address = engine.get_global_value_address("ember_pool_workers")
    engine.detach()  # leaked on purpose, like a shared library that is never unloaded


def workers() -> int:
    """How many pool threads exist in this process (0 before the first parallel region)."""
    return 0 if _workers_address is None else ctypes.c_int64.from_address(_workers_address).value
