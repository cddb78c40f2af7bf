#!/bin/bash
# Session 9 on the GPU host: the kvq-gpu tests (they compare against the CPU attention, whose
# softmax step is now one pass), then the 2–4-bit schemes and Oaken at 32K on its Xeon, at 8
# and 2 threads, three rounds. (Run then as these steps written out, the summary printed but not
# kept in a file; bench/gpu/host-cpu.sh now holds them, the same commands.)
KV=q4_0,int4-g128,int3-g128,turbo4,turbo3,turbo2,kivi4-g128,oaken \
  THREADS="8 2" ROUNDS=3 bash bench/gpu/host-cpu.sh
