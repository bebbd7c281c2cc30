"""End-to-end D2H from Python, and the call overhead of a small transfer: ferry against the raw copy and PyTorch.

Two experiments, in one run on one device:

1. ``e2e``: a payload (default 64 MiB of uint8) split into N tensors (default 1, 256, 4096; ``--layout mixed``:
   one tensor of half the payload and N - 1 sharing the rest), copied to the host and returned as torch CPU
   tensors. Methods:
     - ``raw copy``: one ``copy_`` of a single contiguous tensor of the whole payload into a preallocated pinned
       buffer on a side stream, then synchronize: the physical limit, the reference for the ratios;
     - ``ferry``: ``ferry.transfer_tensor_d2h(tensors)``, outputs built and returned;
     - ``ferry async`` = ``ferry submit`` + ``ferry wait``: the same through ``transfer_tensor_d2h_async``, split
       into the call (walk, submit, torch outputs built while the copies run) and ``wait()``. The sync and async
       calls are interleaved (their order alternating), and submit and wait come from the same async calls, so
       the split adds up to its own total and drift in the machine hits both forms alike;
     - ``ferry: <phase>``: where the synchronous calls' time went, from ferry's private phase stamps taken in
       those same calls (builds with test hooks only): first part (start to the first part's copies queued),
       walk+submit (start to the whole batch walked and queued, the output objects built while the copies run),
       wait, finish (rebuild and release); and the number of parts the calls were cut into (median);
     - ``torch to(cpu)``: SPDL's reference, ``[t.to("cpu", non_blocking=True) ...]`` on a dedicated stream
       that waits for the current stream, then synchronize.
2. ``small``: one small tensor (default 1 KiB) per call: ferry against torch ``to(cpu)`` on a dedicated stream.

Every timing is wall time around the whole call (outputs included) after ``torch.cuda.synchronize()``; medians of
``--repeats`` (p10 and p90 too). Time spent in Python's cyclic garbage collector during the timed ferry calls is
measured too (gc.callbacks) and printed with the phases, as are the calling thread's minor page faults per call
(getrusage): on a virtual machine a first touch of a page can cost microseconds, so memory the allocator hands back
to the system between calls shows up there. The CSV has one row per (experiment, tensor count, method); a compact
table is printed last, with a CPU probe: the median time of a fixed Python loop on the measuring thread before and
after the e2e experiment. On a virtual machine a vCPU's speed changes with the host's load, and the many-tensor
figures (CPU work) change with it; the probe tells such a run apart. ``--evict-mib N`` writes N MiB of scratch
memory before each timed e2e call (cold caches); ``--in-thread`` runs every measurement on a new thread while the
main thread waits, as the overlap benchmark's transfer worker runs. Without CUDA it says so and exits 0.

Usage::

    python -m ferry.bench.call_overhead --output call_overhead.csv
    python -m ferry.bench.call_overhead --num-tensors 16384 --layout mixed
"""

import argparse
import csv
import os
import resource
import statistics
import sys
import time
from datetime import datetime, timezone
from ferry.bench._cli import cuda_device, default_device, non_negative_float, non_negative_int, positive_int
from ferry.bench._gpu import torch_cuda_device
from ferry.bench.bandwidth import LAYOUTS, layout_sizes

SCHEMA_VERSION = 1
# layout: the e2e rows' --layout; parts: the median number of parts of ferry's synchronous calls (its "ferry" row).
FIELDS = ["schema_version", "created_utc", "device_name", "torch_version", "ferry_version", "experiment",
          "total_bytes", "num_tensors", "method", "repeats", "median_ms", "p10_ms", "p90_ms", "gb_per_s",
          "ratio", "ratio_to", "layout", "parts"]
TARGETS = {1: 1.05, 256: 1.2, 4096: 2.0, 16384: 6.0}  # the project's targets: ferry / raw copy, end to end
SMALL_TARGET = 1.5                                    # and ferry / torch for one small tensor


def _parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m ferry.bench.call_overhead",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="call_overhead.csv", help="CSV output path (default: %(default)s).")
    p.add_argument("--device", type=cuda_device, default=default_device(),
                   help="CUDA device (default: LOCAL_RANK, else cuda:0).")
    p.add_argument("--total-mib", type=positive_int, default=64, help="Payload of the e2e experiment in MiB.")
    p.add_argument("--num-tensors", type=positive_int, nargs="+", default=[1, 256, 4096],
                   help="Tensor counts of the e2e experiment (default: 1 256 4096).")
    p.add_argument("--layout", choices=LAYOUTS, default="even",
                   help="How the e2e payload is cut: even (sizes differ by at most one byte; default) or mixed "
                        "(one tensor of half the payload, the rest split evenly between the others).")
    p.add_argument("--repeats", type=positive_int, default=30, help="Timed repeats per case (median reported).")
    p.add_argument("--warmup", type=non_negative_int, default=5, help="Untimed repeats first (pool, caches, streams).")
    p.add_argument("--views", action="store_true",
                   help="Make the e2e tensors views of one device buffer (as the bandwidth bench does) instead of "
                        "separate tensors.")
    p.add_argument("--device-arg", action="store_true",
                   help="Pass device= to ferry's calls (as the bandwidth bench does).")
    p.add_argument("--sleep-before-ms", type=non_negative_float, default=0.0,
                   help="Sleep this long (after the device synchronize) before each timed e2e call, so the calling "
                        "thread starts from an idle core, as a worker woken by an executor does.")
    p.add_argument("--torch-first", action="store_true",
                   help="Time torch's to(cpu) loop before ferry for each tensor count (default: after), to see "
                        "whether the state PyTorch's loop leaves in the process changes ferry's figures.")
    p.add_argument("--evict-mib", type=non_negative_int, default=0,
                   help="Before each timed e2e call (ferry's and torch's alike, outside the timed window) write a "
                        "scratch buffer of this many MiB, so the call starts with cold caches (default 0: off).")
    p.add_argument("--in-thread", action="store_true",
                   help="Run every measurement on a new thread (threading.Thread) while the main thread waits in "
                        "join(), as a transfer worker of the overlap benchmark runs, instead of on the main thread.")
    p.add_argument("--small-bytes", type=positive_int, default=1024, help="Size of the small tensor.")
    p.add_argument("--small-calls", type=positive_int, default=2000, help="Timed calls of the small experiment.")
    return p.parse_args(argv)


def _percentiles(samples_ms):
    ordered = sorted(samples_ms)

    def at(q):
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    return statistics.median(ordered), at(0.10), at(0.90)


class _CacheEvictor:
    """Writes a scratch buffer of `nbytes` (memset, outside the timed window), so the next call starts with the
    calling core's caches full of other data, as a transfer worker's call does after the foreground's work ran
    between two of its batches. 0 bytes: does nothing."""

    def __init__(self, nbytes):
        import ctypes

        self._memset, self._n, self._k = ctypes.memset, nbytes, 0
        self._buf = (ctypes.c_char * nbytes)() if nbytes else None

    def __call__(self):
        if self._buf is not None:
            self._k += 1
            self._memset(self._buf, self._k & 0xFF, self._n)


def _time(fn, repeats, warmup, sync, faults=None, evict=None):
    """Wall times in ms of fn() (whose result is dropped at once), each after a full device synchronize (and
    evict(), when given); the minor page faults of each call are appended to `faults` when it is a list."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        sync()
        if evict is not None:
            evict()
        f0 = _minor_faults()
        start = time.perf_counter_ns()
        out = fn()
        end = time.perf_counter_ns()
        if faults is not None:
            faults.append(_minor_faults() - f0)
        del out
        samples.append((end - start) / 1e6)
    return samples


# ferry's private phase stamps (test-hook builds): the first part is submitted at "first_part"; the walk, the
# submission of every part and the build of the torch outputs overlap the copies until "walked".
PHASES = [("first part", "start", "first_part"), ("walk+submit", "start", "walked"), ("wait", "walked", "waited"),
          ("finish", "waited", "finished")]


class _GcClock:
    """Milliseconds spent in the cyclic garbage collector since the last reset (gc.callbacks)."""

    def __init__(self):
        self.total_ns, self._start = 0, None

    def __call__(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter_ns()
        elif self._start is not None:
            self.total_ns += time.perf_counter_ns() - self._start
            self._start = None

    def reset(self):
        self.total_ns = 0

    @property
    def ms(self):
        return self.total_ns / 1e6


def _minor_faults():
    """Minor page faults of the calling thread so far."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _ferry_e2e(ferry, tensors, repeats, warmup, sync, kwargs=None, sleep_s=0.0, evict=None):
    """Synchronous and asynchronous calls interleaved, alternating which goes first; returns {method: [ms]} with the
    phase rows of the synchronous calls, {form: [gc ms]}, {form: [minor page faults]} and the synchronous calls'
    [parts] (empty without test hooks)."""
    import gc

    from ferry import _ferry

    kwargs = kwargs or {}
    samples = {m: [] for m in ("ferry", "ferry async", "ferry submit", "ferry wait")}
    samples.update({f"ferry: {name}": [] for name, _, _ in PHASES})
    gc_ms = {"ferry": [], "ferry async": []}
    faults = {"ferry": [], "ferry async": []}
    parts = []
    clock = _GcClock()
    gc.callbacks.append(clock)
    timing = getattr(_ferry, "_phase_timing", None)  # test-hook builds only: without them, no phase rows
    old_timing = timing(True) if timing else None
    try:
        for i in range(warmup + repeats):
            for form in (("sync", "async") if i % 2 == 0 else ("async", "sync")):
                sync()
                if sleep_s:
                    time.sleep(sleep_s)
                if evict is not None:
                    evict()
                clock.reset()
                f0 = _minor_faults()
                t0 = time.perf_counter_ns()
                if form == "sync":
                    out = ferry.transfer_tensor_d2h(tensors, **kwargs)
                    t2 = time.perf_counter_ns()
                    phases = _ferry._last_phases() if timing else {}
                else:
                    handle = ferry.transfer_tensor_d2h_async(tensors, **kwargs)
                    t1 = time.perf_counter_ns()
                    out = handle.wait()
                    t2 = time.perf_counter_ns()
                    del handle
                gc_during = clock.ms
                faults_during = _minor_faults() - f0
                del out
                if i < warmup:
                    continue
                if form == "sync":
                    samples["ferry"].append((t2 - t0) / 1e6)
                    gc_ms["ferry"].append(gc_during)
                    faults["ferry"].append(faults_during)
                    for name, a, b in PHASES:
                        if phases.get(a) is not None and phases.get(b) is not None:
                            samples[f"ferry: {name}"].append((phases[b] - phases[a]) / 1e6)
                    if phases.get("start") is not None and phases.get("parts") is not None:
                        parts.append(phases["parts"])
                else:
                    samples["ferry async"].append((t2 - t0) / 1e6)
                    samples["ferry submit"].append((t1 - t0) / 1e6)
                    samples["ferry wait"].append((t2 - t1) / 1e6)
                    gc_ms["ferry async"].append(gc_during)
                    faults["ferry async"].append(faults_during)
    finally:
        if timing:
            timing(old_timing)
        gc.callbacks.remove(clock)
    return {m: v for m, v in samples.items() if v}, gc_ms, faults, parts


def _split(total_bytes, n, device, torch, views=False, layout="even"):
    sizes = layout_sizes(total_bytes, n, layout)
    if views:
        return list(torch.randint(0, 256, (total_bytes,), dtype=torch.uint8, device=device).split(sizes))
    return [torch.randint(0, 256, (s,), dtype=torch.uint8, device=device) for s in sizes]


def _cpu_probe_ms(repeats=15):
    """Median time of a fixed CPU-bound Python loop on the calling thread: how fast this CPU is right now. On a
    virtual machine a vCPU's speed can change with the host's load, and every ferry phase with it."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        d = {}
        for i in range(20000):
            d[i] = (i, str(i))
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main(argv=None):
    args = _parse_args(argv)
    if not args.in_thread:
        return _run(args)
    import threading
    outcome = {}

    def body():
        try:
            outcome["rc"] = _run(args)
        except BaseException as e:  # re-raised on the main thread
            outcome["error"] = e

    worker = threading.Thread(target=body, name="call_overhead")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["rc"]


def _run(args):
    found = torch_cuda_device("call_overhead", args.device, "this benchmark compares against PyTorch")
    if found is None:
        return 0
    torch, device = found
    import ferry

    torch.cuda.set_device(device)
    sync = torch.cuda.synchronize
    created = datetime.now(timezone.utc).isoformat()
    meta = dict(schema_version=SCHEMA_VERSION, created_utc=created, device_name=torch.cuda.get_device_name(device),
                torch_version=torch.__version__, ferry_version=ferry.__version__)
    rows = []

    def record(experiment, total, n, method, samples, ratio_to=None, reference_ms=None, layout="", parts=""):
        median, p10, p90 = _percentiles(samples)
        row = dict(meta, experiment=experiment, total_bytes=total, num_tensors=n, method=method,
                   repeats=len(samples), median_ms=round(median, 5), p10_ms=round(p10, 5), p90_ms=round(p90, 5),
                   gb_per_s=round(total / (median * 1e6), 3) if median > 0 else 0.0,
                   ratio=round(median / reference_ms, 4) if reference_ms else "", ratio_to=ratio_to or "",
                   layout=layout, parts=parts)
        rows.append(row)
        print(f"  {experiment:<5} n={n:<5} {method:<15} median {median:8.3f} ms  p10 {p10:8.3f}  p90 {p90:8.3f}",
              file=sys.stderr)
        return median

    side = torch.cuda.Stream(device)

    def torch_to_cpu(tensors):
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            out = [t.to("cpu", non_blocking=True) for t in tensors]
        side.synchronize()
        return out

    # ---- 1. end to end ----
    total = args.total_mib << 20
    whole = torch.randint(0, 256, (total,), dtype=torch.uint8, device=device)
    pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)

    def raw_copy():
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            pinned.copy_(whole, non_blocking=True)
        side.synchronize()

    gc_medians, fault_medians = {}, {}
    if args.evict_mib < 0:
        raise SystemExit("call_overhead: --evict-mib must be 0 or more")
    evict = _CacheEvictor(args.evict_mib << 20) if args.evict_mib else None
    where = "a new thread" if args.in_thread else "the main thread"
    probe_before = _cpu_probe_ms()
    print(f"D2H {args.total_mib} MiB ({args.layout} layout) from Python on {meta['device_name']}, calls from {where}",
          file=sys.stderr)
    raw_ms = record("e2e", total, 1, "raw copy", _time(raw_copy, args.repeats, args.warmup, sync))
    for n in args.num_tensors:
        tensors = _split(total, n, device, torch, args.views, args.layout)
        sync()
        check = ferry.transfer_tensor_d2h(tensors)
        if len(check) != len(tensors) or not all(torch.equal(a, b.cpu()) for a, b in zip(check, tensors)):
            raise RuntimeError(f"ferry returned wrong bytes for {n} tensors")
        del check
        torch_faults = []

        def time_torch():
            record("e2e", total, n, "torch to(cpu)", _time(lambda: torch_to_cpu(tensors), args.repeats, args.warmup,
                                                           sync, torch_faults, evict), "raw copy", raw_ms,
                   layout=args.layout)

        if args.torch_first:
            time_torch()
        by_method, gc_ms, faults, parts = _ferry_e2e(ferry, tensors, args.repeats, args.warmup, sync,
                                                     {"device": device} if args.device_arg else None,
                                                     args.sleep_before_ms / 1e3, evict)
        for method, samples in by_method.items():
            record("e2e", total, n, method, samples, "raw copy", raw_ms, layout=args.layout,
                   parts=statistics.median(parts) if parts and method == "ferry" else "")
        gc_medians[n] = {form: statistics.median(v) for form, v in gc_ms.items()}
        if not args.torch_first:
            time_torch()
        faults["torch to(cpu)"] = torch_faults
        fault_medians[n] = {form: statistics.median(v) for form, v in faults.items()}
        del tensors
    del whole, pinned
    probes = (probe_before, _cpu_probe_ms())

    # ---- 2. one small tensor ----
    small = torch.randint(0, 256, (args.small_bytes,), dtype=torch.uint8, device=device)
    print(f"one {args.small_bytes}-byte tensor per call", file=sys.stderr)
    repeats = args.small_calls
    torch_ms = record("small", args.small_bytes, 1, "torch to(cpu)",
                      _time(lambda: torch_to_cpu([small]), repeats, 100, sync))
    record("small", args.small_bytes, 1, "ferry", _time(lambda: ferry.transfer_tensor_d2h([small]), repeats, 100,
                                                         sync), "torch to(cpu)", torch_ms)
    record("small", args.small_bytes, 1, "ferry bare", _time(lambda: ferry.transfer_tensor_d2h(small), repeats, 100,
                                                              sync), "torch to(cpu)", torch_ms)

    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)

    _print_table(rows, args, gc_medians, fault_medians)
    if evict is not None:
        print(f"each e2e call after writing {args.evict_mib} MiB of scratch memory (cold caches)")
    print(f"calls from {where}; CPU probe (a fixed Python loop on that thread, median ms; lower is faster): "
          f"{probes[0]:.2f} before the e2e experiment, {probes[1]:.2f} after")
    print(f"\nCSV: {args.output}")
    return 0


def _median_of(rows, experiment, n, method):
    """The median_ms of the row (experiment, num_tensors, method), NaN when there is none."""
    for r in rows:
        if r["experiment"] == experiment and r["num_tensors"] == n and r["method"] == method:
            return r["median_ms"]
    return float("nan")


def _verdict(ratio, target):
    if ratio != ratio:  # NaN: a row is missing
        return "n/a"
    return "ok" if ratio <= target else "MISS"


def _print_table(rows, args, gc_medians=None, fault_medians=None):
    def median(experiment, n, method):
        return _median_of(rows, experiment, n, method)

    raw = median("e2e", 1, "raw copy")
    print(f"\nD2H {args.total_mib} MiB from Python ({args.layout} layout), end to end, medians of "
          f"{args.repeats} (raw copy {raw:.3f} ms)")
    print(f"{'tensors':>7}  {'ferry':>9}  {'x raw':>6}  {'target':>10}  {'async':>9} = {'submit':>8} + {'wait':>8}  "
          f"{'torch':>9}  {'x raw':>6}  {'torch/ferry':>11}")
    for n in args.num_tensors:
        f, t = median("e2e", n, "ferry"), median("e2e", n, "torch to(cpu)")
        target = TARGETS.get(n)
        verdict = "" if target is None else f"<={target:.2f} {_verdict(f / raw, target)}"
        print(f"{n:>7}  {f:7.3f}ms  {f / raw:5.2f}x  {verdict:>10}  {median('e2e', n, 'ferry async'):7.3f}ms = "
              f"{median('e2e', n, 'ferry submit'):6.3f}ms + {median('e2e', n, 'ferry wait'):6.3f}ms  "
              f"{t:7.3f}ms  {t / raw:5.2f}x  {t / f:10.2f}x")
    print("(async = submit + wait per call, medians of each; sync and async calls interleaved)")
    print("ferry's synchronous calls by phase (medians, ms; first part and walk+submit both from the call's start), "
          "the parts each call was cut into (median), and gc = cyclic GC time inside the call:")
    for n in args.num_tensors:
        phases = "  ".join(f"{name} {median('e2e', n, f'ferry: {name}'):.3f}" for name, _, _ in PHASES)
        parts = next((r.get("parts") for r in rows if r["experiment"] == "e2e" and r["num_tensors"] == n
                      and r["method"] == "ferry"), "")
        parts_part = f"  parts {parts:g}" if parts not in ("", None) else ""
        gc_part = ""
        if gc_medians and n in gc_medians:
            gc_part = "  gc " + " / ".join(f"{form} {ms:.3f}" for form, ms in gc_medians[n].items())
        print(f"{n:>7}  {phases}{parts_part}{gc_part}")
    if fault_medians:
        print("minor page faults of the calling thread per call (medians):")
        for n in args.num_tensors:
            if n in fault_medians:
                print(f"{n:>7}  " + "  ".join(f"{form} {v:g}" for form, v in fault_medians[n].items()))
    # The small experiment's rows have num_tensors 1 (one tensor of small_bytes bytes).
    t, f, b = (median("small", 1, m) for m in ("torch to(cpu)", "ferry", "ferry bare"))
    print(f"\none {args.small_bytes}-byte tensor: torch to(cpu) {t * 1e3:.1f} us, ferry [t] {f * 1e3:.1f} us "
          f"({f / t:.2f}x, target <={SMALL_TARGET} {_verdict(f / t, SMALL_TARGET)}), ferry t {b * 1e3:.1f} us "
          f"({b / t:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
