"""OpenCL C kernels from the GPU lowering (`codegen.gpu`), and the C-style GPU renderer CUDA shares.

A GPU renderer is the C renderer with a few strings changed (tinygrad's cstyle pattern): how a kernel is
declared, how a buffer parameter and a shared array are spelled, what a thread index and a barrier are.
`GPUCodegen` holds what CUDA and OpenCL have in common; `OpenCLCodegen` and `cuda.CUDACodegen` fill in the
strings. Running the kernels is `runtime.opencl` (pyopencl) and `runtime.cuda` (the CUDA driver API).
"""

from __future__ import annotations

from ..target import Target
from ..tir.expr import BinOp, Call, Cast, Const, Expr, Var
from ..tir.stmt import Allocate, Buffer, LetStmt, Stmt
from .c import MATH, CCodegen, CodegenError, c_symbol, register_slots
from .gpu import DeviceProgram, Kernel

GPU_STACK_LIMIT = 16 * 1024  # bytes of one thread's private array


class GPUCodegen(CCodegen):
    """Kernels in a C dialect: subclasses set the strings below."""

    kernel_prefix = ""  # before the return type of a kernel
    global_ptr = "{t}* restrict"  # a buffer parameter
    shared_decl = "{t} {name}[{n}];"  # a shared array
    helper_prefix = "static inline"
    thread_exprs: dict[str, str] = {}  # "blockIdx.x" -> source
    barrier = ""
    dims: dict[str, int] = {}  # launch extent of each thread axis of the kernel being rendered

    def call(self, e: Call) -> str:
        if e.name == "gpu.barrier":
            return self.barrier
        if e.name.startswith("gpu."):
            return f"((int){self.thread_exprs[e.name[4:]]})"
        return super().call(e)

    def prefetch(self, ld) -> str:
        return "0"  # no prefetch on GPU targets: `(void)(0);`

    def stmt(self, s: Stmt) -> None:
        bounds = self._thread_bounds(s.value) if isinstance(s, LetStmt) else None
        if bounds is None:
            super().stmt(s)
            return
        # a loop bound to a thread axis: its variable lies in [min, min + launch extent), which lets the
        # renderer use plain / and % for the index arithmetic on it (as it does on a loop variable). A loop
        # that partitioning copied can bind the same variable twice in one C scope: the copy gets a block.
        again = s.var in self.thread_vars  # type: ignore[union-attr]
        self.thread_vars.add(s.var)  # type: ignore[union-attr]
        if again:
            self.emit("{")
            self.indent += 1
        self.emit(f"const {self.ctype(s.value.dtype)} {self.name(s.var)} = {self.expr(s.value)};")  # type: ignore[union-attr]
        with self.ana.scope(s.var, *bounds):  # type: ignore[union-attr]
            self.stmt(s.body)  # type: ignore[union-attr]
        if again:
            self.indent -= 1
            self.emit("}")

    def _thread_bounds(self, e: Expr) -> tuple[int, int] | None:
        lo = 0
        if isinstance(e, BinOp) and e.op == "add" and isinstance(e.a, Const):
            lo, e = int(e.a.value), e.b  # type: ignore[arg-type]
        if isinstance(e, Cast):
            e = e.value
        if not (isinstance(e, Call) and e.name.startswith("gpu.") and e.name[4:] in self.dims):
            return None
        return lo, lo + self.dims[e.name[4:]] - 1

    def helper(self, name: str, code: str) -> str:
        return super().helper(name, code.replace("static inline", self.helper_prefix, 1))

    def param_type(self, b: Buffer) -> str:
        return "unsigned char" if b.dtype.is_bool else b.dtype.c_type

    def allocate(self, s: Allocate) -> None:
        b = s.buffer
        name, t = self.name(b), b.dtype.c_type
        if b.scope == "shared":
            self.emit(f"// {b.name}: {b.dtype}[{', '.join(map(str, b.shape))}], shared by the block")
            self.emit(self.shared_decl.format(t=t, name=name, n=max(b.size, 1)))
            self.stmt(s.body)
            return
        if register_slots(s) is None and b.nbytes > GPU_STACK_LIMIT:
            raise CodegenError(
                f"buffer '{b.name}' ({b.nbytes} bytes) is allocated per thread inside a kernel; GPU threads have "
                f"at most {GPU_STACK_LIMIT} bytes of private memory here: compute it at an inner loop, or make it "
                "'shared'"
            )
        super().allocate(s)

    def kernel(self, k: Kernel) -> str:
        self.thread_vars: set[Var] = set()
        launch = (("blockIdx", k.grid), ("threadIdx", k.block))
        self.dims = {f"{g}.{a}": n for g, ext in launch for a, n in zip("xyz", ext)}
        for p in k.params:
            self.name(p)
        self.stmt(k.body)
        params = []
        for p in k.params:
            ptr = self.global_ptr.format(t=self.param_type(p))
            params.append(f"{'' if p in self.written else 'const '}{ptr} {self.name(p)}")
        body = [_gpu_line(line) for line in self.lines if not line.lstrip().startswith("#pragma omp")]
        doc = f"// {k.name}: grid {k.grid}, block {k.block}"
        prefix = self.kernel_prefix.format(block=k.block, threads=k.threads)
        sig = f"{prefix}void {c_symbol(k.name)}({', '.join(params)})"
        return "\n".join([doc, sig + " {", *body, "}"])


def _gpu_line(line: str) -> str:
    return line.replace("#pragma GCC unroll", "#pragma unroll").replace("#pragma GCC ivdep", "// ivdep")


def render(cls: type[GPUCodegen], prog: DeviceProgram, target: Target, prelude: str) -> str:
    """The source of every kernel of a device program, with the typedefs and helpers they use."""
    helpers: dict[str, str] = {}
    bodies = []
    for k in prog.kernels:
        g = cls(target)
        bodies.append(g.kernel(k))
        helpers.update(g.helpers)
        if g.vec_types:
            raise CodegenError(f"{k.name}: vector types in a GPU kernel (vectorized loops should be unrolled)")
    parts = [prelude]
    if helpers:
        parts.append("\n".join(helpers.values()) + "\n")
    parts += [b + "\n" for b in bodies]
    return "\n".join(parts)


# -- OpenCL -----------------------------------------------------------------------------------


class OpenCLCodegen(GPUCodegen):
    kernel_prefix = "__kernel __attribute__((reqd_work_group_size{block})) "
    global_ptr = "__global {t}* restrict"
    shared_decl = "__local {t} {name}[{n}];"
    thread_exprs = {
        "blockIdx.x": "get_group_id(0)", "blockIdx.y": "get_group_id(1)", "blockIdx.z": "get_group_id(2)",
        "threadIdx.x": "get_local_id(0)", "threadIdx.y": "get_local_id(1)", "threadIdx.z": "get_local_id(2)",
    }  # fmt: skip
    barrier = "barrier(CLK_LOCAL_MEM_FENCE)"


def _opencl_prelude(fp64: bool) -> str:
    # the C renderer's libm names (expf, nearbyintf, ...) are OpenCL's overloaded builtins
    renames = {f: f[:-1] for f, _ in MATH.values() if not f.startswith("ember")}  # expf -> exp
    renames.update({"nearbyintf": "rint", "nearbyint": "rint", "ldexpf": "ldexp", "ilogbf": "ilogb"})  # + narrow.py
    defines = "\n".join(f"#define {a} {b}" for a, b in sorted(renames.items()) if a != b)
    ext = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if fp64 else ""
    return f"""// Generated by Ember: OpenCL C 1.2 kernels.
{ext}typedef char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;
typedef uchar uint8_t; typedef ushort uint16_t; typedef uint uint32_t; typedef ulong uint64_t;
#define INT32_MIN (-2147483647 - 1)
#define INT64_MIN (-9223372036854775807L - 1)
#define memcpy __builtin_memcpy
{defines}
"""


def codegen_opencl(prog: DeviceProgram, target: Target | str = "opencl") -> str:
    target = Target.parse(target)
    body = render(OpenCLCodegen, prog, target, "")
    return _opencl_prelude("double" in body) + body
