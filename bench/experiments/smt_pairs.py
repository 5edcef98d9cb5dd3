"""Which of this machine's CPUs share a physical core (a VM may hide it: lscpu says 1 thread per core).

Each pair (0, j) runs the same one-thread float32 matrix product on both CPUs at
once, each process pinned to its CPU; the rate of CPU 0 relative to its rate
alone says whether the two compete for one core's FMA units (about 0.5-0.7) or
not (about 1.0).  Also a pair (j, j+1) for every even j, the usual sibling
numbering of a hypervisor.  Why it matters (issue 17): on the 16-core H100 host
two threads of the CPU step ran 1.3x faster than one, four 2.5x, sixteen 7.3x
(bench/results/cpu_step_scaling_*), as if threads shared cores.

    python bench/experiments/smt_pairs.py [SECONDS]
"""
import multiprocessing as mp
import os
import sys
import time


def _rate(cpu: int, seconds: float, start, out) -> None:
    os.sched_setaffinity(0, {cpu})
    from threadpoolctl import threadpool_limits
    import numpy as np

    a = np.ones((256, 256), dtype=np.float32)
    b = np.ones((256, 256), dtype=np.float32)
    with threadpool_limits(1):
        a @ b
        start.wait()
        t0 = time.perf_counter()
        reps = 0
        while time.perf_counter() - t0 < seconds:
            for _ in range(20):
                a @ b
            reps += 20
        out.put((cpu, reps * 256 ** 3 / (time.perf_counter() - t0) / 1e9))


def run(cpus: list, seconds: float) -> dict:
    start = mp.Barrier(len(cpus))
    out = mp.Queue()
    procs = [mp.Process(target=_rate, args=(c, seconds, start, out)) for c in cpus]
    for p in procs:
        p.start()
    res = dict(out.get() for _ in procs)
    for p in procs:
        p.join()
    return res


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
    cpus = sorted(os.sched_getaffinity(0))
    alone = run([cpus[0]], seconds)[cpus[0]]
    print(f"CPUs {cpus}; CPU {cpus[0]} alone: {alone:.1f} GFMA/s (sgemm 256^3, one thread)")
    for j in cpus[1:]:
        r = run([cpus[0], j], seconds)
        print(f"pair ({cpus[0]:>2}, {j:>2}): {r[cpus[0]] / alone:4.2f} {r[j] / alone:4.2f} of alone")
    for i in range(0, len(cpus) - 1, 2):
        r = run([cpus[i], cpus[i + 1]], seconds)
        print(f"pair ({cpus[i]:>2}, {cpus[i + 1]:>2}): {r[cpus[i]] / alone:4.2f} {r[cpus[i + 1]] / alone:4.2f} of alone")
    r = run(cpus, seconds)
    print(f"all {len(cpus)} at once: {sum(r.values()) / alone:.1f} x one alone "
          f"(min {min(r.values()) / alone:.2f}, max {max(r.values()) / alone:.2f} each)")


if __name__ == "__main__":
    main()
