#!/bin/bash
# Session 14 on the GPU host: the kvq-gpu tests and the 2- to 4-bit schemes at 32K on its Xeon
# at 2 and 8 threads, three rounds (bench/gpu/host-cpu.sh), with this session's kernels; then
# the plane-table kernels against d9e350b's (.gpubin/kvq-old), 2 threads, 5 rounds in turns;
# then the group kernels in L2 (.gpubin/gk, .gpubin/gk-old: the group_kernels example of
# each build), both roles, 5 runs each (bench/gpu/host-l2.sh).
KV=q4_0,int4-g128,int3-g64,int3-g128,turbo3,turbo2,kivi4,turbo4-prod,turbo3-prod \
  THREADS="2 8" ROUNDS=3 bash bench/gpu/host-cpu.sh
KV=int3-g128,turbo3,int3,turbo2,turbo3-prod,turbo4-prod ITERS=10 bash bench/cpu/ab.sh 5 \
  old:.gpubin/kvq-old:RAYON_NUM_THREADS=2 new:.gpubin/kvq:RAYON_NUM_THREADS=2 | tee $OUT/ab-planes-xeon.txt
SCHEMES="int3-g128 turbo3 int3 int2-g128 turbo2 q4_0 turbo4-prod turbo3-prod turbo2-prod" NAME=l2-xeon bash bench/gpu/host-l2.sh
