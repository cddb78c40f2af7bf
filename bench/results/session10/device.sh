#!/bin/bash
# Session 10 on the GPU host: the kvq-gpu tests, then the 2- to 4-bit schemes at 32K on its
# Xeon at 2 and 8 threads, three rounds (every 4-bit scheme this time: iq4_nl, int4-g64, q4_1,
# kivi4 and turbo4-prod were not run there before). (Run then as these steps written out;
# bench/gpu/host-cpu.sh now holds them, the same commands.)
KV=q4_0,q4_1,iq4_nl,int4-g64,int4-g128,kivi4-g128,kivi4,turbo4,turbo4-prod,int3-g128,turbo3,turbo3-prod,int2-g128,turbo2 \
  THREADS="2 8" ROUNDS=3 bash bench/gpu/host-cpu.sh
