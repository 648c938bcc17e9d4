// test/emu/negative/unsupported_intrinsic.cu - must NOT build in the emulated tier: it calls an
// intrinsic the emulator does not provide (__ballot_sync), and the build has to stop with its
// name rather than run it as a no-op (test/emu/run_emu_tests.sh self).
__global__ void uses_ballot(unsigned* out) { out[threadIdx.x] = __ballot_sync(0xffffffffu, 1); }

void launch_ballot(unsigned* out) { uses_ballot<<<1, 32>>>(out); }
