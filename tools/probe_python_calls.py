"""probe_python_calls: where a Python transfer of many small tensors spends its time, by thread and setting.

A design probe (not part of the package), for the question the overlap harness raises: why a call on the harness's
worker thread can take longer than the same call in a tight loop. It times ``ferry.transfer_tensor_d2h`` of 64 MiB
cut into N torch CUDA tensors on the main thread and on a ``ThreadPoolExecutor`` worker, with ferry's settings and
the host's state varied one at a time, and prints per variant the median call, walk and first-part times (ms), the
GIL holds of a call and the longest one (us). It first prints torch's own per-tensor costs on each thread (reading
a tensor, making and freeing an output object; ns).

Needs a GPU, torch, and ferry from the project's CMake build (its test hooks: ``_phase_timing``, ``_last_phases``,
``_gil_pacing``, ``_gil_start_yield_us``, ``_gc_deferral``, ``_exchange_costs``)::

    PYTHONPATH=build/python python3 tools/probe_python_calls.py 4096 16384

Without a GPU it says so and exits 0.
"""

import argparse
import gc
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

PAYLOAD = 64 << 20


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("counts", type=int, nargs="*", default=[4096, 16384], help="tensor counts (default 4096 16384)")
    p.add_argument("--repeats", type=int, default=9, help="timed calls per variant, after 2 warm-ups (default 9)")
    p.add_argument("--live-objects", type=int, default=200000,
                   help="small containers kept alive, as an application's, for the collector's older passes to walk "
                        "(default 200000)")
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("probe_python_calls: torch is not installed; nothing to measure")
        return 0
    if not torch.cuda.is_available():
        print("probe_python_calls: no CUDA device; nothing to measure")
        return 0
    import ferry
    from ferry import _ferry
    if not hasattr(_ferry, "_last_phases"):
        print("probe_python_calls: this ferry has no test hooks; use the project's CMake build (build/python)")
        return 1

    dev = torch.device("cuda", torch.cuda.current_device())
    flush = torch.zeros(256 << 20, dtype=torch.uint8)  # written before a call: caches cold, as after other work

    def call(src, like_the_harness=False):
        if like_the_harness:  # as python -m ferry.bench.overlap's worker does
            torch.cuda.set_device(dev)
        t0 = time.perf_counter_ns()
        out = ferry.transfer_tensor_d2h(src, device=dev) if like_the_harness else ferry.transfer_tensor_d2h(src)
        t1 = time.perf_counter_ns()
        return (t1 - t0) / 1e6, _ferry._last_phases(), out

    collections = []  # (phase, perf_counter_ns) of every collection's start and stop

    def watch(phase, info):
        collections.append((phase, time.perf_counter_ns()))

    gc.callbacks.append(watch)
    live = [{"i": [i]} for i in range(args.live_objects)]

    def gc_spans():
        spans, start = [], None
        for phase, t in collections:
            if phase == "start":
                start = t
            elif start is not None:
                spans.append((t - start) / 1e3)
                start = None
        return spans

    def variant(label, src, worker=None, before=None, like_the_harness=False):
        rows = []
        for r in range(args.repeats + 2):
            if before:
                before()
            collections.clear()
            if worker:
                ms, ph, out = worker.submit(call, src, like_the_harness).result()
            else:
                ms, ph, out = call(src, like_the_harness)
            del out  # on the calling thread, as the harness frees each block's outputs
            time.sleep(0.002)  # a young pass the call left behind runs at the next allocations
            if r >= 2:
                since = lambda k: (ph[k] - ph["start"]) / 1e6 if ph.get(k) else float("nan")
                spans = gc_spans()
                rows.append((ms, since("walked"), since("first_part"), ph.get("holds") or 0,
                             (ph.get("max_hold_ns") or 0) / 1e3, sum(spans), max(spans, default=0.0)))
        m = [statistics.median(x[i] for x in rows) for i in range(7)]
        print(f"{label:<52} call {m[0]:7.3f} ms (min {min(x[0] for x in rows):7.3f})  walked {m[1]:7.3f}  "
              f"first part {m[2]:6.3f}  holds {m[3]:5.0f}  longest {m[4]:6.1f} us  gc {m[5]:7.1f} us, longest "
              f"{m[6]:7.1f} (worst call {max(x[6] for x in rows):8.1f})", flush=True)

    _ferry._phase_timing(True)
    for n in args.counts:
        src = [torch.full((PAYLOAD // n,), i % 251, dtype=torch.uint8, device=dev) for i in range(n)]
        torch.cuda.synchronize()
        print(f"-- {n} tensors of {PAYLOAD // n} bytes")
        costs = lambda: [round(x) for x in _ferry._exchange_costs(src)]
        with ThreadPoolExecutor(1) as ex:
            print(f"torch's costs, ns a tensor (read, make, free): main thread {costs()}, worker "
                  f"{ex.submit(costs).result()}", flush=True)
        variant("main thread, alone", src)
        stop = threading.Event()
        idle = threading.Thread(target=stop.wait)
        idle.start()
        variant("main thread, an idle thread exists", src)
        stop.set()
        idle.join()
        with ThreadPoolExecutor(1) as ex:
            variant("worker thread", src, ex)
            variant("worker thread, as the harness calls it", src, ex, like_the_harness=True)
            old = _ferry._gil_pacing(0, 0)
            variant("worker thread, no release points", src, ex)
            _ferry._gil_pacing(*old)
            old = _ferry._gil_start_yield_us(0)
            variant("worker thread, no step-aside", src, ex)
            _ferry._gil_start_yield_us(old)
            _ferry._gc_deferral(False)
            variant("worker thread, collector on in the call", src, ex)
            _ferry._gc_deferral(True)
            gc.disable()
            variant("worker thread, collector off in the process", src, ex)
            gc.enable()
            variant("worker thread, 256 MiB written before each call", src, ex, before=lambda: flush.add_(1))
            variant("worker thread, torch's to('cpu') before each call", src, ex,
                    before=lambda: [t.to("cpu") for t in src])
        variant("main thread, alone, again", src)
        del src
    gc.callbacks.remove(watch)
    del live
    return 0


if __name__ == "__main__":
    sys.exit(main())
