#!/usr/bin/env python3
"""Throughput of the AVX-512 instructions the integer kernels use, alone and paired with
vpdpbusd, in inline-assembly loops the compiler cannot rearrange (pipes.c's C loops let gcc
spill or fold). Each case is a block of independent instructions repeated 4 times per loop
iteration; cycles are against a dependent chain of 50 adds, timed first.

Usage: python3 bench/cpu/pipes_asm.py     (writes, builds with gcc and runs a C file in /tmp)
"""
import os
import subprocess
import tempfile


def dp(i):
    return f"vpdpbusd %zmm30, %zmm31, %zmm{i}"


def alone(op, n=8):
    return [op.format(i=i, o=4 * i, p=64 * (i % 2)) for i in range(n)]


def paired(op, n=8):
    return [x for i in range(n) for x in (dp(i), op.format(i=8 + i, o=4 * i, p=64 * (i % 2)))]


CASES = {
    "vpdpbusd, 8 chains": alone("vpdpbusd %zmm30, %zmm31, %zmm{i}"),
    "vpdpbusd, 4 chains": [dp(i % 4) for i in range(8)],
    "vpdpbusd {1to16} memory operand": alone("vpdpbusd {o}(%rsi){{1to16}}, %zmm31, %zmm{i}"),
    "vpbroadcastd from memory": alone("vpbroadcastd {o}(%rsi), %zmm{i}"),
    "vmovdqu64 load": alone("vmovdqu64 {p}(%rsi), %zmm{i}"),
    "vpermb": alone("vpermb %zmm30, %zmm31, %zmm{i}"),
    "vpternlogd": alone("vpternlogd $0xe4, %zmm30, %zmm31, %zmm{i}"),
    "vpandd": alone("vpandd %zmm30, %zmm31, %zmm{i}"),
    "vpaddd": alone("vpaddd %zmm30, %zmm31, %zmm{i}"),
    "vpsrld": alone("vpsrld $2, %zmm31, %zmm{i}"),
    "vcvtdq2ps": alone("vcvtdq2ps %zmm31, %zmm{i}"),
    "vfmadd231ps": alone("vfmadd231ps %zmm30, %zmm31, %zmm{i}"),
    "vpdpbusd + vpermb": paired("vpermb %zmm30, %zmm31, %zmm{i}"),
    "vpdpbusd + vpternlogd": paired("vpternlogd $0xe4, %zmm30, %zmm31, %zmm{i}"),
    "vpdpbusd + vpandd": paired("vpandd %zmm30, %zmm31, %zmm{i}"),
    "vpdpbusd + vpandd + vpord": [
        x
        for i in range(8)
        for x in (dp(i), f"vpandd %zmm30, %zmm31, %zmm{8 + i}", f"vpord %zmm30, %zmm31, %zmm{16 + i}")
    ],
    "vpdpbusd + vpsrld": paired("vpsrld $2, %zmm31, %zmm{i}"),
    "vpdpbusd + vpbroadcastd memory": paired("vpbroadcastd {o}(%rsi), %zmm{i}"),
    "vpdpbusd + vmovdqu64 load": paired("vmovdqu64 {p}(%rsi), %zmm{i}"),
    "vpdpbusd + vcvtdq2ps": paired("vcvtdq2ps %zmm31, %zmm{i}"),
    "vpdpbusd + vfmadd231ps": paired("vfmadd231ps %zmm30, %zmm31, %zmm{i}"),
}


def c_source():
    clobbers = "".join(f', "xmm{k}"' for k in range(32))
    lines = [
        "#include <stdio.h>",
        "#include <time.h>",
        "static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);"
        " return t.tv_sec + t.tv_nsec * 1e-9; }",
        "static int buf[1024] __attribute__((aligned(64)));",
        "int main(void) {",
        "  long n = 20000000, x = 0;",
        "  double t = now();",
        '  for (long i = 0; i < n; i++) __asm__ volatile(".rept 50\\n\\tadd $1, %0\\n\\t.endr" : "+r"(x));',
        "  double ghz = n * 50 / (now() - t) / 1e9;",
        '  printf("clock: %.2f GHz (a dependent add chain)\\n", ghz);',
    ]
    for name, block in CASES.items():
        body = "\\n\\t".join(block * 4).replace("%", "%%").replace("{1to16}", "%{1to16%}")
        lines += [
            "  {",
            "    double t = now();",
            f'    for (long i = 0; i < n; i++) __asm__ volatile("{body}" :: "S"(buf) : "memory"{clobbers});',
            f"    double cycles = (now() - t) * ghz * 1e9 / (n * 4.0);",
            f'    printf("%-34s %5.2f cycles per block of {len(block)}\\n", "{name}", cycles);',
            "  }",
        ]
    lines += ["  return 0;", "}"]
    return "\n".join(lines)


def main():
    work = tempfile.mkdtemp()
    src, exe = os.path.join(work, "pipes_asm.c"), os.path.join(work, "pipes_asm")
    with open(src, "w") as f:
        f.write(c_source())
    subprocess.run(["gcc", "-O2", "-mavx512f", src, "-o", exe], check=True)
    subprocess.run([exe], check=True)


if __name__ == "__main__":
    main()
