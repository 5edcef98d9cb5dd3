"""The instruction mix and stall reasons of one kernel from ncu's per-SASS-line export.

Input: ``ncu -i REPORT --page source --csv --print-source sass > FILE.csv`` of a report taken with
``--section SourceCounters`` (``scripts/device_gpu.sh`` with ``NCU_SOURCE=1`` writes one).  Prints the
warp instructions executed and the stall samples by opcode (predicates and modifiers dropped), then the
stall reasons over all samples: where a kernel's issue slots go, without the 1 MB export in the repository.

    python bench/experiments/ncu_sass_mix.py ncu_B_float32_source.csv [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import csv


def mix(path: str) -> tuple:
    """``(instructions by opcode, samples by opcode, samples by stall reason, total instructions, total
    samples)`` from the CSV at ``path``."""
    rows = list(csv.reader(open(path, newline="")))
    head = next(i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r)
    h = rows[head]
    src, ins, smp = h.index("Source"), h.index("Instructions Executed"), h.index("Warp Stall Sampling (All Samples)")
    stall_cols = [i for i, c in enumerate(h) if c.startswith("stall_") and "Not Issued" not in c]
    ops, samples, stalls = collections.Counter(), collections.Counter(), collections.Counter()
    for r in rows[head + 1:]:
        try:
            n, s = int(r[ins]), int(r[smp])
        except (ValueError, IndexError):
            continue
        words = r[src].split()
        if not words:
            continue
        op = (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]
        ops[op] += n
        samples[op] += s
        for c in stall_cols:
            stalls[h[c]] += int(r[c] or 0)
    return ops, samples, stalls, sum(ops.values()), sum(samples.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    ops, samples, stalls, tot, tot_s = mix(a.csv)
    print(f"{a.csv}: {tot:.4g} warp instructions, {tot_s} stall samples")
    print("opcode    instr %  samples %")
    for op, n in ops.most_common(a.top):
        print(f"{op:<8} {100 * n / tot:7.1f}  {100 * samples[op] / max(tot_s, 1):8.1f}")
    print("stall reasons (share of all samples):")
    for c, n in stalls.most_common(12):
        print(f"  {c:<24} {100 * n / max(tot_s, 1):5.1f}")


if __name__ == "__main__":
    main()
