// test/emu/negative/unsupported_ptx.cu - must NOT build in the emulated tier: inline PTX that the
// emulator does not model (bar.sync with a named barrier) has to stop the build naming the
// instruction (test/emu/run_emu_tests.sh self).
__global__ void uses_named_barrier() { asm volatile("bar.sync 1, 64;\n" ::); }

void launch_named_barrier() { uses_named_barrier<<<1, 64>>>(); }
