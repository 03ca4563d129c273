"""A real, recoverable GPU fault: a kernel that stores to an unmapped address (CUDA error 700;
the driver logs an MMU-fault XID, 31 on Hopper). Driver API through ctypes, the PTX compiled
by the driver: no CUDA toolkit needed. The context dies; the GPU stays healthy."""

import ctypes
import sys
import time

PTX = b"""
.version 7.0
.target sm_50
.address_size 64
.visible .entry bad(.param .u64 p)
{
  .reg .u64 a;
  .reg .u32 v;
  ld.param.u64 a, [p];
  mov.u32 v, 42;
  st.global.u32 [a], v;
  ret;
}
"""
CUDA_ERROR_ILLEGAL_ADDRESS = 700


def main() -> int:
    cu = ctypes.CDLL("libcuda.so.1")

    def call(name: str, *args: object) -> int:
        result = int(getattr(cu, name)(*args))
        print(f"{time.time():.3f} {name} -> {result}", flush=True)
        return result

    dev, ctx, mod, fn = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    call("cuInit", 0)
    call("cuDeviceGet", ctypes.byref(dev), 0)
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    call("cuCtxSetCurrent", ctx)
    call("cuModuleLoadData", ctypes.byref(mod), PTX)
    call("cuModuleGetFunction", ctypes.byref(fn), mod, b"bad")
    address = ctypes.c_uint64(0x10)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(address), ctypes.c_void_p))
    call("cuLaunchKernel", fn, 1, 1, 1, 1, 1, 1, 0, None, params, None)
    return 0 if call("cuCtxSynchronize") == CUDA_ERROR_ILLEGAL_ADDRESS else 1


if __name__ == "__main__":
    sys.exit(main())
