# Temporary probe: a timeline of a run's cache loads, GPU kernel loads and steps (stderr).
import os, sys, time
T0 = time.perf_counter()
def say(msg):
    sys.stderr.write(f"[probe {1e3*(time.perf_counter()-T0):9.1f} ms] {msg}\n")
try:
    from numba.core import caching
    _load = caching.Cache.load_overload
    def load(self, sig, ctx):
        t = time.perf_counter(); r = _load(self, sig, ctx)
        say(f"cpu load {self._name} {1e3*(time.perf_counter()-t):.1f} ms"); return r
    caching.Cache.load_overload = load
except Exception as e:
    say(f"no cpu hook {e}")
import importlib.abc, importlib.util
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in ("mpikmeans.backends.gpu.compiled", "mpikmeans.backends.gpu.backend", "mpikmeans.scores",
                        "mpikmeans.lloyd"):
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        orig = spec.loader.exec_module
        def exec_module(mod):
            orig(mod)
            if name.endswith("compiled"):
                f = mod.compiled
                def compiled(nm, spec_, disp, args):
                    t = time.perf_counter(); k = f(nm, spec_, disp, args)
                    say(f"gpu kernel {nm} {spec_} {1e3*(time.perf_counter()-t):.1f} ms"); return k
                mod.compiled = compiled
            elif name.endswith("lloyd"):
                g = mod._relocate_empty
                def reloc(*a, **k):
                    t = time.perf_counter(); r = g(*a, **k)
                    say(f"relocated {r} in {1e3*(time.perf_counter()-t):.1f} ms"); return r
                mod._relocate_empty = reloc
            elif name.endswith("backend"):
                cls = mod.GPUBackend
                st = cls.step
                def step(self, c, s):
                    from numba import cuda
                    cuda.synchronize(); t = time.perf_counter(); r = st(self, c, s); cuda.synchronize()
                    flagged = int(self._outputs.host[self._outputs.ns + self._outputs.nsse::2].sum())
                    say(f"step k={len(c)} {1e3*(time.perf_counter()-t):.1f} ms changed {r.changed} rechecked {flagged}"); return r
                cls.step = step
            else:
                for fn in ("quality_scores", "sample_label_sums", "sum_rows", "_silhouette_rows", "_own_dist2"):
                    if hasattr(mod, fn):
                        g = getattr(mod, fn)
                        def wrap(*a, _g=g, _n=fn, **k):
                            t = time.perf_counter(); r = _g(*a, **k)
                            say(f"scores {_n} {1e3*(time.perf_counter()-t):.1f} ms"); return r
                        setattr(mod, fn, wrap)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Hook())
