#!/bin/bash
# Session 13 on the GPU host: the kvq-gpu tests and the 2- to 4-bit schemes with Oaken at 32K on
# its Xeon at 2 and 8 threads, three rounds (bench/gpu/host-cpu.sh), with this session's kernels
# (20dcc8f); then Oaken against 9c8c862's kernels (.gpubin/kvq-old), 2 threads, 5 rounds in turns.
KV=q4_0,int4-g128,int3-g64,int3-g128,turbo3,kivi4,turbo4-prod,oaken \
  THREADS="2 8" ROUNDS=3 bash bench/gpu/host-cpu.sh
KV=oaken ITERS=10 bash bench/cpu/ab.sh 5 old:.gpubin/kvq-old:RAYON_NUM_THREADS=2 \
  new:.gpubin/kvq:RAYON_NUM_THREADS=2 | tee $OUT/ab-oaken-xeon.txt
