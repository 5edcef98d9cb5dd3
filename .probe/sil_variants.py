"""The silhouette pass's kernel against two variants (padded means; two rows a thread): times and bits (scratch)."""
import math
import sys

import numpy as np
from numba import cuda, float64, int64

from mpikmeans.backends.gpu import GPUBackend, scorek
from mpikmeans.backends.gpu.intrinsics import dadd_rn, dmul_rn

QT = 8
QT2 = 16
NT = 128


@cuda.jit(device=True)
def fold(d, q, c, mine, bi, spread):
    if q == c:
        return d, bi
    v = d + spread[q]
    return mine, (v if v < bi else bi)


@cuda.jit(device=True)
def finish(i, mine, bi, c, mass, w, weighted, spread, own, dist, sil):
    own[i] = mine
    dist[i] = math.sqrt(mine)
    wi = w[i] if weighted else 1.0
    if mass[c] == wi:
        return
    ai = (mine + spread[c]) * mass[c] / (mass[c] - wi)
    if ai < bi:
        sil[i] = 1.0 - ai / bi
    elif ai > bi:
        sil[i] = bi / ai - 1.0


@cuda.jit
def sil_pad(x, ld, n, m, p, pp, labels, mt, slot, spread, mass, w, weighted, own, dist, sil):
    i = cuda.grid(1)
    if i >= n:
        return
    own[i] = 0.0
    dist[i] = 0.0
    sil[i] = 0.0
    a = labels[i]
    if a < 0:
        return
    c = slot[a]
    if c < 0:
        return
    mine = 0.0
    bi = math.inf
    dd = cuda.local.array(QT, dtype=float64)
    for q0 in range(0, p, QT):
        for r in range(QT):
            dd[r] = 0.0
        for j in range(m):
            xj = float64(x[j * ld + i])
            base = j * pp + q0
            for r in range(QT):
                t = xj - mt[base + r]
                dd[r] = dadd_rn(dd[r], dmul_rn(t, t))
        for r in range(QT):
            q = q0 + r
            if q < p:
                mine, bi = fold(dd[r], q, c, mine, bi, spread)
    finish(i, mine, bi, c, mass, w, weighted, spread, own, dist, sil)


@cuda.jit
def sil_r2(x, ld, n, m, p, pp, labels, mt, slot, spread, mass, w, weighted, own, dist, sil):
    tid = cuda.threadIdx.x
    i0 = cuda.blockIdx.x * 2 * NT + tid
    i1 = i0 + NT
    c0 = -1
    c1 = -1
    if i0 < n:
        own[i0] = 0.0
        dist[i0] = 0.0
        sil[i0] = 0.0
        if labels[i0] >= 0:
            c0 = slot[labels[i0]]
    if i1 < n:
        own[i1] = 0.0
        dist[i1] = 0.0
        sil[i1] = 0.0
        if labels[i1] >= 0:
            c1 = slot[labels[i1]]
    if c0 < 0 and c1 < 0:
        return
    r0 = i0 if i0 < n else n - 1
    r1 = i1 if i1 < n else n - 1
    mine0 = 0.0
    mine1 = 0.0
    bi0 = math.inf
    bi1 = math.inf
    dd = cuda.local.array(QT2, dtype=float64)
    for q0 in range(0, p, QT):
        for r in range(QT2):
            dd[r] = 0.0
        for j in range(m):
            x0 = float64(x[j * ld + r0])
            x1 = float64(x[j * ld + r1])
            base = j * pp + q0
            for r in range(QT):
                cj = mt[base + r]
                t0 = x0 - cj
                dd[r] = dadd_rn(dd[r], dmul_rn(t0, t0))
                t1 = x1 - cj
                dd[QT + r] = dadd_rn(dd[QT + r], dmul_rn(t1, t1))
        for r in range(QT):
            q = q0 + r
            if q < p:
                mine0, bi0 = fold(dd[r], q, c0, mine0, bi0, spread)
                mine1, bi1 = fold(dd[QT + r], q, c1, mine1, bi1, spread)
    if c0 >= 0:
        finish(i0, mine0, bi0, c0, mass, w, weighted, spread, own, dist, sil)
    if c1 >= 0:
        finish(i1, mine1, bi1, c1, mass, w, weighted, spread, own, dist, sil)



def make_rq(R, Q):
    RQ = R * Q

    def sil_rq(x, ld, n, m, p, pp, labels, mt, slot, spread, mass, w, weighted, own, dist, sil):
        tid = cuda.threadIdx.x
        base_i = cuda.blockIdx.x * R * NT + tid
        cs = cuda.local.array(R, dtype=int64)
        rows = cuda.local.array(R, dtype=int64)
        mine = cuda.local.array(R, dtype=float64)
        bi = cuda.local.array(R, dtype=float64)
        xv = cuda.local.array(R, dtype=float64)
        dd = cuda.local.array(RQ, dtype=float64)
        anyrow = False
        for r in range(R):
            i = base_i + r * NT
            cs[r] = -1
            rows[r] = i if i < n else n - 1
            mine[r] = 0.0
            bi[r] = math.inf
            if i < n:
                own[i] = 0.0
                dist[i] = 0.0
                sil[i] = 0.0
                if labels[i] >= 0:
                    cs[r] = slot[labels[i]]
                    anyrow = anyrow or cs[r] >= 0
        if not anyrow:
            return
        for q0 in range(0, p, Q):
            for e in range(RQ):
                dd[e] = 0.0
            for j in range(m):
                for r in range(R):
                    xv[r] = float64(x[j * ld + rows[r]])
                b = j * pp + q0
                for q in range(Q):
                    cj = mt[b + q]
                    for r in range(R):
                        t = xv[r] - cj
                        dd[r * Q + q] = dadd_rn(dd[r * Q + q], dmul_rn(t, t))
            for q in range(Q):
                qq = q0 + q
                if qq < p:
                    for r in range(R):
                        mine[r], bi[r] = fold(dd[r * Q + q], qq, cs[r], mine[r], bi[r], spread)
        for r in range(R):
            if cs[r] >= 0:
                finish(base_i + r * NT, mine[r], bi[r], cs[r], mass, w, weighted, spread, own, dist, sil)

    return cuda.jit(sil_rq)


VARIANTS = {"r2q8": (2, 8), "r4q8": (4, 8), "r4q4": (4, 4)}
KERNELS = {name: make_rq(*rq) for name, rq in VARIANTS.items()}


def timed(fn, reps=5):
    s, e = cuda.event(), cuda.event()
    ts = []
    for _ in range(reps):
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(cuda.event_elapsed_time(s, e))
    return float(np.median(ts))


for case in sys.argv[1:]:
    path, kk = case.split(":")
    x = np.ascontiguousarray(np.load(path))
    n, m = x.shape
    be = GPUBackend(dtype="float64")
    be.load(x, None)
    rng = np.random.default_rng(0)
    for p in [int(v) for v in kk.split(",")]:
        cent = np.ascontiguousarray(x[rng.choice(n, p, replace=False)])
        labels, _ = be.assign(cent)
        dl = cuda.to_device(np.ascontiguousarray(labels, dtype=np.int32))
        pp = -(-p // QT) * QT
        mt = np.zeros((m, pp))
        mt[:, :p] = cent.T
        dmt_p = cuda.to_device(np.ascontiguousarray(cent.T).ravel())
        dmt_pp = cuda.to_device(mt.ravel())
        slot = cuda.to_device(np.arange(p, dtype=np.int64))
        spread = cuda.to_device(rng.uniform(0, 5, p))
        mass = cuda.to_device(np.bincount(labels, minlength=p).astype(np.float64))
        outs = {}
        ker = scorek.score_kernels()["silhouette"]
        res = {}
        for name in ("current", "r2", *VARIANTS):
            arrs = [cuda.device_array(n) for _ in range(3)]
            if name == "current":
                args = (be.rows.dx, be.rows.ld, n, m, p, dl, dmt_p, slot, spread, mass, arrs[0], False, *arrs)
                fn = lambda: ker[-(-n // scorek.NT), scorek.NT](*args)  # noqa: E731
            elif name == "pad":
                args = (be.rows.dx, be.rows.ld, n, m, p, pp, dl, dmt_pp, slot, spread, mass, arrs[0], False, *arrs)
                fn = lambda: sil_pad[-(-n // NT), NT](*args)  # noqa: E731
            elif name == "r2":
                args = (be.rows.dx, be.rows.ld, n, m, p, pp, dl, dmt_pp, slot, spread, mass, arrs[0], False, *arrs)
                fn = lambda: sil_r2[-(-n // (2 * NT)), NT](*args)  # noqa: E731
            else:
                R, Q = VARIANTS[name]
                qp = -(-p // Q) * Q
                mq = np.zeros((m, qp))
                mq[:, :p] = cent.T
                args = (be.rows.dx, be.rows.ld, n, m, p, qp, dl, cuda.to_device(mq.ravel()), slot, spread, mass, arrs[0],
                        False, *arrs)
                fn = lambda k=KERNELS[name], R=R, args=args: k[-(-n // (R * NT)), NT](*args)  # noqa: E731
            fn()
            cuda.synchronize()
            res[name] = timed(fn)
            outs[name] = [a.copy_to_host() for a in arrs]
        same = {name: all(np.array_equal(a.view(np.int64), b.view(np.int64)) for a, b in zip(outs[name], outs["current"]))
                for name in outs if name != "current"}
        print(f"{path.split('/')[-1]} p={p}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in res.items()), "same bits:", same,
              flush=True)
    be.close()
