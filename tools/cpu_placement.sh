#!/usr/bin/env bash
# cpu_placement.sh — where a benchmark's threads may run, and whether that moves its figures.
#
# usage: tools/cpu_placement.sh topology
#          the CPUs this process may use, the NUMA nodes and their CPUs, the GPU's PCI NUMA node, frequency
#          governors, and a per-CPU speed probe (the same CPU-bound Python loop pinned to each allowed CPU);
#        tools/cpu_placement.sh ab ROUNDS COMMAND...
#          runs COMMAND unpinned, pinned to each NUMA node's allowed CPUs where there are several nodes (taskset;
#          first-touch then puts its memory on that node too) and pinned to one CPU, ROUNDS times round-robin
#          so that drift over time hits every placement alike.
#          COMMAND sees $PLACEMENT (unpinned, node0, cpus0, ...) and $ROUND; each run's output goes to stdout,
#          prefixed. PLACEMENTS chooses the placements (default "unpinned nodes one"): unpinned, nodes (each NUMA
#          node, when there are several), nodeN, one (the first allowed CPU), pair (the first two), fast / slow
#          (the two CPUs the speed probe finds fastest / slowest), cpusLIST.
#        tools/cpu_placement.sh idleab ROUNDS COMMAND...
#          runs COMMAND pinned to the probe's CPUS fastest CPUs (default 3), ROUNDS times alternately alone ($SPIN=0)
#          and with one busy loop per pinned CPU at SCHED_IDLE priority ($SPIN=1; chrt -i 0): the loops take a CPU
#          only when nothing else wants it, so those vCPUs never halt between the command's bursts of work, and
#          yield to its threads at once. Whether that moves the figures says whether a vCPU going idle (and what
#          the host does with its core meanwhile) slows the work that follows. COMMAND also sees $ROUND.
# Why: ferry's many-tensor Python figures are CPU work, and they moved by 2x between runs on the lent H200.
set -u
if [ $# -eq 0 ] || [ "$1" = "--help" ]; then sed -n '2,20p' "$0"; exit 0; fi

allowed() { taskset -pc $$ | sed 's/.*: //'; }

# expand "0-3,8" into "0 1 2 3 8"
expand() { echo "$1" | tr ',' '\n' | while IFS=- read -r a b; do seq "$a" "${b:-$a}"; done | tr '\n' ' '; }

node_cpus() { # the allowed CPUs of node $1, comma separated
  local mine=" $(expand "$(allowed)") " out=()
  for c in $(expand "$(cat /sys/devices/system/node/node$1/cpulist)"); do
    [[ $mine == *" $c "* ]] && out+=("$c")
  done
  (IFS=,; echo "${out[*]}")
}

probe() { # "CPU ms" for each allowed CPU: the best of 5 runs of one dict-filling loop pinned there
  for c in $(expand "$(allowed)"); do
    echo "$c $(taskset -c "$c" python3 -c 'import time
best = 1e9
for _ in range(5):
    t = time.perf_counter(); d = {}
    for i in range(200000): d[i] = (i, str(i))
    best = min(best, time.perf_counter() - t)
print(f"{best * 1e3:.1f}")')"
  done
}

probe_sorted() { # sets $probed to the probe's "CPU ms" lines, fastest first, and prints them; probes only once
  [ -n "${probed:-}" ] && return
  probed=$(probe | sort -k2 -n)
  echo "speed probe (CPU ms): $(echo $probed)"
}

if [ "$1" = ab ] || [ "$1" = idleab ]; then # ROUNDS is evaluated arithmetically below: digits only
  case ${2:-} in
  '' | *[!0-9]*) echo "$1: ROUNDS must be a positive integer, got '${2:-}' (see --help)" >&2; exit 2 ;;
  esac
  [ "$2" -ge 1 ] && [ $# -ge 3 ] || { echo "$1: needs ROUNDS >= 1 and a COMMAND (see --help)" >&2; exit 2; }
fi
case $1 in
topology)
  echo "allowed CPUs: $(allowed) (nproc $(nproc))"
  grep -E 'Mems_allowed_list' /proc/self/status
  lscpu | grep -E 'Model name|Socket|Core|Thread|NUMA|MHz|L3' || true
  for n in /sys/devices/system/node/node*; do
    [ -d "$n" ] || continue
    id=${n##*node}
    echo "node $id: CPUs $(cat "$n/cpulist"), allowed here: $(node_cpus "$id"), $(grep MemTotal "$n/meminfo" | awk '{print $4/1048576 " GiB"}')"
  done
  if command -v nvidia-smi >/dev/null; then
    bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-F' 'a-f' | sed 's/^0000\(....:\)/\1/')
    echo "GPU $bus: NUMA node $(cat /sys/bus/pci/devices/$bus/numa_node 2>/dev/null || echo '?'), local CPUs $(cat /sys/bus/pci/devices/$bus/local_cpulist 2>/dev/null || echo '?')"
    nvidia-smi topo -m 2>/dev/null | head -4
  fi
  echo "governors: $(cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor 2>/dev/null | sort | uniq -c | tr '\n' ' ')"
  echo "per-CPU speed probe (ms for one CPU-bound Python loop, pinned; lower is faster):"
  probe | while read -r c ms; do printf '  cpu %3s: %s\n' "$c" "$ms"; done
  ;;
ab)
  rounds=$2; shift 2
  nodes=()
  for n in /sys/devices/system/node/node*; do
    [ -d "$n" ] && [ -n "$(node_cpus "${n##*node}")" ] && nodes+=("node${n##*node}")
  done
  [ ${#nodes[@]} -lt 2 ] && nodes=() # one node: pinning to it is the unpinned case
  cpus=($(expand "$(allowed)"))
  placements=()
  for token in ${PLACEMENTS:-unpinned nodes one}; do
    case $token in
    nodes) placements+=("${nodes[@]}") ;;
    one) placements+=("cpus${cpus[0]}") ;;                 # every thread on one CPU: no migrations
    pair) placements+=("cpus${cpus[0]},${cpus[1]:-${cpus[0]}}") ;; # two threads, two CPUs, no migrations between more
    fast | slow) # the two CPUs the speed probe finds fastest (slowest): on a VM whose vCPUs differ in speed
      probe_sorted
      if [ "$token" = fast ]; then two=$(echo "$probed" | head -2 | cut -d' ' -f1 | paste -sd,)
      else two=$(echo "$probed" | tail -2 | cut -d' ' -f1 | paste -sd,); fi
      placements+=("cpus$two") ;;
    *) placements+=("$token") ;;
    esac
  done
  for ((r = 1; r <= rounds; r++)); do
    for p in "${placements[@]}"; do
      echo "=== placement $p, round $r"
      if [ "$p" = unpinned ]; then
        PLACEMENT=$p ROUND=$r "$@" 2>&1 | sed "s/^/[$p r$r] /"
      elif [ "${p#cpus}" != "$p" ]; then
        PLACEMENT=$p ROUND=$r taskset -c "${p#cpus}" "$@" 2>&1 | sed "s/^/[$p r$r] /"
      else
        PLACEMENT=$p ROUND=$r taskset -c "$(node_cpus "${p#node}")" "$@" 2>&1 | sed "s/^/[$p r$r] /"
      fi
    done
  done
  ;;
idleab)
  rounds=$2; shift 2
  probe_sorted
  pinned=($(echo "$probed" | head -"${CPUS:-3}" | cut -d' ' -f1))
  list=$(IFS=,; echo "${pinned[*]}")
  for ((r = 1; r <= rounds; r++)); do
    for spin in 0 1; do
      loops=()
      if [ $spin = 1 ]; then
        for c in "${pinned[@]}"; do
          taskset -c "$c" chrt -i 0 sh -c 'while :; do :; done' &
          loops+=($!)
        done
      fi
      echo "=== pinned to CPUs $list, SCHED_IDLE busy loops: $spin, round $r"
      SPIN=$spin ROUND=$r taskset -c "$list" "$@" 2>&1 | sed "s/^/[spin$spin r$r] /"
      if [ ${#loops[@]} -gt 0 ]; then kill "${loops[@]}"; wait "${loops[@]}" 2>/dev/null || true; fi # they end by kill
    done
  done
  ;;
*) echo "unknown command '$1' (see --help)"; exit 2 ;;
esac
