"""Staging model state dicts to host memory: ferry against PyTorch's ways and torch DCP's stagers, x the PCIe limit.

The most common large D2H in training copies a model's state dict and optimizer state to host memory for an
asynchronous checkpoint or an offload. For synthetic state dicts shaped like real models (``--list``), each method
stages the whole state dict and is timed end to end on the host (the call, the copies finished):

  limit (1 raw copy)     one copy_ of the state dict's device bytes, from one device buffer into one pinned host
                         buffer of exactly that size: the link's limit in this run, the reference of every ratio;
  ferry                  ferry.transfer_tensor_d2h(state_dict);
  ferry.torch.Stager     what dcp.async_save(..., async_stager=ferry.torch.Stager()) does to stage;
  torch to(cpu) loop     every CUDA tensor .to("cpu", non_blocking=True) (pinned by torch's caching host
                         allocator), then synchronize;
  torch prealloc copy_   pinned buffers allocated on the first call (torch.empty_like(..., pin_memory=True)), then
                         copy_(non_blocking=True) into them and synchronize;
  DCP default stager     DefaultStager(StagingOptions(False, False, False, False)), the stager dcp.async_save
                         makes when none is given (pageable memory, blocking copies);
  DCP pinned stager      DefaultStager(StagingOptions(True, False, False, True)): pinned, non-blocking copies.

"first" is one call from a cold start: ferry's pool trimmed, torch's host cache emptied, a new stager (the cost a
job pays at its first checkpoint, and at every one for DCP's default stager inside async_save, which makes a new
one per call). "steady" is the median of --repeats further calls of the same method, each output dropped before
the next (a stager reuses its caches). "pinned held" is the pinned host memory the method holds while its last
output is alive: ferry's pool, torch's host allocator, or the pinned storages a DCP stager keeps.

Every method's first output is checked against the source on a few tensors (first, middle, last). The "targets"
lines at the end compare the rows with ferry's targets; they never change the exit status. A method that raises
(a torch version's bug, say) is reported and leaves no row; the others run on, and the exit status is 1.

Usage::

    python -m ferry.bench.checkpoint --output checkpoint.csv
    python -m ferry.bench.checkpoint --state-dicts llama-1b-adam --methods limit ferry "DCP default stager"
    python -m ferry.bench.plot checkpoint.csv --out-dir plots/

Without CUDA (or without torch) it says so and exits 0; --list works anywhere torch imports.
"""

import argparse
import gc
import os
import statistics
import sys
import time

from ferry.bench._cli import cuda_device, default_device, positive_int
from ferry.bench._gpu import torch_cuda_device
from ferry.bench.state_dicts import DEFAULT_STATE_DICTS, STATE_DICTS, footprint, tensors

FIELDS = ["state_dict", "num_tensors", "total_bytes", "method", "first_ms", "steady_ms", "limit_ms",
          "steady_to_limit", "first_to_limit", "pinned_bytes_held", "device_name"]
LIMIT, FERRY, STAGER = "limit (1 raw copy)", "ferry", "ferry.torch.Stager"
TORCH_LOOP, TORCH_PREALLOC = "torch to(cpu) loop", "torch prealloc copy_"
DCP_DEFAULT, DCP_PINNED = "DCP default stager", "DCP pinned stager"
METHODS = [LIMIT, FERRY, STAGER, TORCH_LOOP, TORCH_PREALLOC, DCP_DEFAULT, DCP_PINNED]


def _parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m ferry.bench.checkpoint",
                                description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="checkpoint.csv", help="CSV output path (default: %(default)s).")
    p.add_argument("--device", type=cuda_device, default=default_device(),
                   help="CUDA device (default: LOCAL_RANK, else cuda:0).")
    p.add_argument("--state-dicts", nargs="+", choices=list(STATE_DICTS), default=DEFAULT_STATE_DICTS,
                   metavar="NAME", help="State dicts to stage (default: " + " ".join(DEFAULT_STATE_DICTS) +
                   "; --list shows them all).")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=METHODS, metavar="METHOD",
                   help="Methods to run (default: all; the limit always runs): " + ", ".join(METHODS) + ".")
    p.add_argument("--repeats", type=positive_int, default=5, help="Steady calls per method (median reported).")
    p.add_argument("--list", action="store_true", help="List the state dicts (tensors, bytes) and exit.")
    return p.parse_args(argv)


def list_state_dicts():
    import torch

    print(f"{'name':<17} {'tensors':>8} {'device GB':>10}  description")
    for name, (description, build) in STATE_DICTS.items():
        count, device_bytes, _ = footprint(torch, build(torch, "meta"))
        print(f"{name:<17} {count:>8} {device_bytes / 1e9:>10.2f}  {description}")


_VMSTAT_KEYS = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall")


def _vmstat():
    """The kernel's counters of transparent-huge-page faults and direct compaction ({} where there are none): a
    first call that pins is as fast as the kernel hands out huge pages."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            pairs = (line.split() for line in f)
            return {k: int(v) for k, v in pairs if k in _VMSTAT_KEYS}
    except OSError:
        return {}


def _leaves(torch, obj):
    """Every tensor of obj in order, a tensor met twice listed twice."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return [t for v in values for t in _leaves(torch, v)]


def _map_tensors(torch, obj, fn):
    """obj with fn(t) for every tensor, containers rebuilt (dict, list, tuple); other objects kept."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return type(obj)((k, _map_tensors(torch, v, fn)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(torch, v, fn) for v in obj)
    return obj


class Runner:
    """The methods over one state dict on one device; each method is a (reset, call, pinned_held) triple."""

    def __init__(self, torch, device, state, repeats):
        import ferry
        import ferry.torch

        self.torch, self.device, self.state, self.ferry, self.repeats = torch, device, state, ferry, repeats
        self.sources = tensors(state)       # distinct tensors
        self.leaves = _leaves(torch, state)  # every tensor in order, a tensor named twice twice
        self.device_bytes = sum(t.nbytes for t in self.sources if t.device.type == "cuda")
        self.side = torch.cuda.Stream(device)
        self.stager = None
        self.buffers = None
        self.first_pins = (0, 0.0)  # ferry's pool during the last first call: (regions pinned, ms pinning)
        self.first_vm = {}          # the kernel's huge-page and compaction counters during it (/proc/vmstat)

    # ---- helpers ----------------------------------------------------------------------------------------------

    def host_cache_empty(self):
        empty = getattr(self.torch._C, "_host_emptyCache", None)
        if empty is not None:
            empty()

    def torch_host_pinned(self):
        stats = getattr(self.torch.cuda, "host_memory_stats", None)
        return int(stats().get("allocated_bytes.current", 0)) if stats else 0

    def pinned_storages(self, out):
        """Bytes of the distinct pinned storages among out's tensors."""
        seen = {}
        for t in tensors(out):
            if t.device.type == "cpu" and t.is_pinned():
                s = t.untyped_storage()
                seen[s.data_ptr()] = s.nbytes()
        return sum(seen.values())

    def on_side(self, work):
        """work() on a side stream that waits for the current one, then synchronize: how torch users copy."""
        self.side.wait_stream(self.torch.cuda.current_stream(self.device))
        with self.torch.cuda.stream(self.side):
            out = work()
        self.side.synchronize()
        return out

    # ---- the methods ------------------------------------------------------------------------------------------

    def limit(self):
        torch = self.torch
        flat = torch.empty(self.device_bytes, dtype=torch.uint8, device=self.device)
        host = torch.empty(self.device_bytes, dtype=torch.uint8)
        cudart = torch.cuda.cudart()
        # Registered, not taken from torch's host allocator, which would round the size up to a power of two.
        if int(cudart.cudaHostRegister(host.data_ptr(), self.device_bytes, 0)) != 0:
            raise RuntimeError(f"cudaHostRegister of {self.device_bytes} bytes failed")
        try:
            def call():
                return self.on_side(lambda: host.copy_(flat, non_blocking=True))

            return self.measure(lambda: None, call, lambda out: 0, check=False)
        finally:
            cudart.cudaHostUnregister(host.data_ptr())

    def method(self, name):
        torch, ferry = self.torch, self.ferry
        if name == FERRY:
            return self.measure(ferry.pool.trim, lambda: ferry.transfer_tensor_d2h(self.state),
                                lambda out: ferry.pool.stats()["bytes_pinned"])
        if name == STAGER:
            def reset():
                if self.stager is not None:
                    self.stager.close()
                ferry.pool.trim()
                self.stager = ferry.torch.Stager()
            return self.measure(reset, lambda: self.stager.stage(self.state),
                                lambda out: ferry.pool.stats()["bytes_pinned"])
        if name == TORCH_LOOP:
            return self.measure(self.host_cache_empty, lambda: self.on_side(lambda: _map_tensors(
                torch, self.state, lambda t: t.to("cpu", non_blocking=True) if t.is_cuda else t.clone())),
                lambda out: self.torch_host_pinned())
        if name == TORCH_PREALLOC:
            def reset():
                self.buffers = None
                self.host_cache_empty()

            def call():
                if self.buffers is None:   # one buffer per distinct tensor, placed as the state dict places it
                    buffers = {id(t): torch.empty_like(t, device="cpu", pin_memory=t.is_cuda) for t in self.sources}
                    self.buffers = (buffers, _map_tensors(torch, self.state, lambda t: buffers[id(t)]))
                buffers = self.buffers[0]
                self.on_side(lambda: [buffers[id(t)].copy_(t, non_blocking=True) for t in self.sources])
                return self.buffers[1]
            return self.measure(reset, call, lambda out: self.torch_host_pinned())
        if name in (DCP_DEFAULT, DCP_PINNED):
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            options = (StagingOptions(False, False, False, False) if name == DCP_DEFAULT
                       else StagingOptions(True, False, False, True))
            single_use = self.single_use(DefaultStager, options)
            used = [False]  # whether self.stager has staged already

            def reset():
                if self.stager is not None:
                    self.stager.close()
                self.host_cache_empty()
                self.stager = DefaultStager(options)
                used[0] = False

            def call():
                if single_use and used[0]:
                    self.stager = DefaultStager(options)
                used[0] = True
                return self.stager.stage(self.state)
            return self.measure(reset, call, self.pinned_storages)
        raise ValueError(f"unknown method {name!r}")

    def single_use(self, stager_class, options):
        """Whether this torch's DCP stager stages once only (torch 2.11's DefaultStager closes its StateDictStager
        after each stage and fails the next with KeyError): then each call makes a new one, as async_save does."""
        probe = stager_class(options)
        tiny = {"x": self.torch.zeros(1, device=self.device)}
        try:
            probe.stage(tiny)
            probe.stage(tiny)
        except KeyError:
            print("(this torch's DefaultStager stages once only: a new one per call) ...", end=" ", file=sys.stderr)
            return True
        finally:
            probe.close()
        return False

    def measure(self, reset, call, pinned_held, check=True):
        """(first_ms, steady_ms, pinned_bytes_held): one call after reset(), then the median of `repeats` calls."""
        torch = self.torch
        gc.collect()
        torch.cuda.synchronize(self.device)
        reset()
        pool_before, vm_before = self.ferry.pool.stats(), _vmstat()
        start = time.perf_counter()
        out = call()
        first_ms = (time.perf_counter() - start) * 1e3
        pool_after, vm_after = self.ferry.pool.stats(), _vmstat()
        self.first_pins = (pool_after["pin_calls"] - pool_before["pin_calls"],
                           (pool_after["pin_seconds"] - pool_before["pin_seconds"]) * 1e3)
        self.first_vm = {k: vm_after[k] - vm_before[k] for k in vm_after if k in vm_before}
        if check:
            self.check(out)
        samples = []
        for _ in range(self.repeats):
            del out
            gc.collect()
            torch.cuda.synchronize(self.device)
            start = time.perf_counter()
            out = call()
            samples.append((time.perf_counter() - start) * 1e3)
        held = pinned_held(out)
        del out
        return first_ms, statistics.median(samples), held

    def check(self, out):
        staged, sources = _leaves(self.torch, out), self.leaves
        if len(staged) != len(sources):
            raise RuntimeError(f"{len(staged)} tensors staged for {len(sources)}")
        for i in sorted({0, len(sources) // 2, len(sources) - 1}):
            if staged[i].device.type != "cpu" or not self.torch.equal(staged[i], sources[i].cpu()):
                raise RuntimeError(f"tensor {i} of the state dict was not staged exactly")

    def release(self):
        """Drops what the last method kept (a stager and its caches, preallocated buffers) and every pinned
        byte it left cached, so that the next method starts cold."""
        if self.stager is not None and hasattr(self.stager, "close"):
            self.stager.close()
        self.stager = self.buffers = None
        gc.collect()
        self.torch.cuda.synchronize(self.device)
        self.host_cache_empty()
        self.ferry.pool.trim()


def main(argv=None):
    args = _parse_args(argv)
    if args.list:
        try:
            list_state_dicts()
        except ImportError:
            print("checkpoint: torch is not installed; --list builds the state dicts on torch's meta device.")
        return 0
    found = torch_cuda_device("checkpoint", args.device, "the state dicts are torch tensors")
    if found is None:
        return 0
    torch, device = found
    torch.cuda.set_device(device)
    name = torch.cuda.get_device_name(device)
    methods = [m for m in METHODS if m in args.methods and m != LIMIT]
    rows, failures = [], []
    for sd_name in args.state_dicts:
        description, build = STATE_DICTS[sd_name]
        state = build(torch, device)
        torch.cuda.synchronize(device)
        count, device_bytes, _ = footprint(torch, state)
        print(f"{sd_name}: {description}; {count} tensors, {device_bytes / 1e9:.2f} GB on {name}", file=sys.stderr)
        runner = Runner(torch, device, state, args.repeats)
        first, steady, _ = runner.limit()
        limit_ms = steady
        results = [(LIMIT, first, steady, 0)]
        for method in methods:
            print(f"  {method} ...", end=" ", file=sys.stderr, flush=True)
            try:
                first_ms, steady_ms, held = runner.method(method)
            except Exception as error:  # one method's failure (a torch version's bug) leaves the others' rows
                failures.append(f"{sd_name}: {method}: {type(error).__name__}: {error}")
                print(f"failed: {failures[-1]}", file=sys.stderr, flush=True)
            else:
                results.append((method, first_ms, steady_ms, held))
                pins, pin_ms = runner.first_pins
                vm = runner.first_vm
                print(f"first {first_ms:.1f} ms, steady {steady_ms:.2f} ms ({steady_ms / limit_ms:.3f}x the limit)"
                      + (f"; ferry pinned {pins} region(s) in its first call ({pin_ms:.1f} ms of fault-in and "
                         f"registration)" if pins else "")
                      + (f"; first call: {vm['thp_fault_alloc']} huge-page faults, {vm['thp_fault_fallback']} "
                         f"fell back to small pages, {vm['compact_stall']} compaction stalls" if len(vm) == 3 else ""),
                      file=sys.stderr, flush=True)
            runner.release()
        for method, first_ms, steady_ms, held in results:
            rows.append(dict(state_dict=sd_name, num_tensors=count, total_bytes=device_bytes, method=method,
                             first_ms=f"{first_ms:.3f}", steady_ms=f"{steady_ms:.3f}", limit_ms=f"{limit_ms:.3f}",
                             steady_to_limit=f"{steady_ms / limit_ms:.4f}", first_to_limit=f"{first_ms / limit_ms:.4f}",
                             pinned_bytes_held=held, device_name=name))
        del runner, state
        gc.collect()
        torch.cuda.empty_cache()

    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8", newline="") as f:
        f.write(",".join(FIELDS) + "\n")
        for r in rows:
            f.write(",".join(str(r[k]).replace(",", ";") for k in FIELDS) + "\n")
    print_table(rows)
    print_targets(rows)
    print(f"\nCSV: {args.output}")
    if failures:
        print("\nfailed (no row):\n  " + "\n  ".join(failures))
    return 1 if failures else 0


def print_table(rows):
    print(f"\n{'state dict':<16} {'method':<22} {'first ms':>10} {'steady ms':>10} {'x limit':>8} {'first x':>8} "
          f"{'pinned GB':>10}")
    for r in rows:
        print(f"{r['state_dict']:<16} {r['method']:<22} {float(r['first_ms']):10.1f} {float(r['steady_ms']):10.2f} "
              f"{float(r['steady_to_limit']):8.3f} {float(r['first_to_limit']):8.2f} "
              f"{int(r['pinned_bytes_held']) / 1e9:10.2f}")


def target_lines(rows):
    """ferry's targets, checked against the rows: (text, met) per target that the rows can answer."""
    lines = []
    by = {(r["state_dict"], r["method"]): r for r in rows}
    for sd in dict.fromkeys(r["state_dict"] for r in rows):
        ferry_row = by.get((sd, FERRY))
        if ferry_row is None:
            continue
        total, count = int(ferry_row["total_bytes"]), int(ferry_row["num_tensors"])
        steady = float(ferry_row["steady_to_limit"])
        bound = 1.02 if total / count >= (8 << 20) else 1.05
        lines.append((f"{sd}: ferry steady {steady:.3f}x the limit <= {bound}", steady <= bound))
        first, steady_ms = float(ferry_row["first_ms"]), float(ferry_row["steady_ms"])
        lines.append((f"{sd}: ferry first call {first:.1f} ms <= 2.5x its steady {steady_ms:.1f} ms",
                      first <= 2.5 * steady_ms))
        prealloc = by.get((sd, TORCH_PREALLOC))
        if prealloc is not None:
            bound_ms = 0.66 * float(prealloc["first_ms"])
            lines.append((f"{sd}: ferry first call {first:.1f} ms <= 0.66x torch prealloc first ({bound_ms:.1f} ms)",
                          first <= bound_ms))
        held = int(ferry_row["pinned_bytes_held"])
        lines.append((f"{sd}: ferry pinned held {held / 1e9:.2f} GB <= 1.05x {total / 1e9:.2f} GB",
                      held <= 1.05 * total))
        stager, dcp = by.get((sd, STAGER)), by.get((sd, DCP_DEFAULT))
        if stager is not None and dcp is not None:
            for key in ("steady_ms", "first_ms"):
                s, d = float(stager[key]), float(dcp[key])
                lines.append((f"{sd}: Stager {key[:-3]} {s:.1f} ms <= DCP default's {d:.1f} ms / 2", s <= d / 2))
    return lines


def print_targets(rows):
    lines = target_lines(rows)
    if lines:
        print("\ntargets:")
        for text, met in lines:
            print(f"  {'ok ' if met else 'MISS'} {text}")


if __name__ == "__main__":
    sys.exit(main())
