# 2026-12-02T17:06Z, AMD EPYC family 25 model 17 (Zen 4, AVX-512 VNNI/VBMI), 2 cores; binary 57f73da (main)
KV=int4-g128,q4_0,int4-g64,kivi4-g128,turbo4,iq4_nl,int3-g128,turbo3,int3-g64,kivi2 CTX=32768 ITERS=10 bench/cpu/ab.sh 5 main:target/release/kvq:
