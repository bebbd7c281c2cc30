// kernels.cu — device code used only by ferry's GPU tests, built by nvcc into a fatbin embedded in the test.
//
// ferry_test_slow_fill: every block waits `spin_ns` nanoseconds of wall time (the %globaltimer register), then the
// grid fills `n` bytes with `value`. A producer that is still running when a transfer starts is what the ordering
// tests need: if ferry did not wait for it, the copy would read the old bytes.

extern "C" __global__ void ferry_test_slow_fill(unsigned char *dst, unsigned long long n, unsigned int value,
                                                unsigned long long spin_ns) {
  if (spin_ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
      __nanosleep(1000);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < spin_ns);
  }
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = (unsigned char)value;
}
